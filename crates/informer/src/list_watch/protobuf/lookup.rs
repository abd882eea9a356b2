//! Finding a built-in resource's schema in the generated table, by URL or by name.

use super::{schema::Resource, schema_table::RESOURCES};

impl Resource {
    /// The built-in resource a collection URL (`/api/v1/namespaces/x/pods`,
    /// `/apis/apps/v1/deployments`) lists, if the table has it.
    pub(crate) fn for_url(url: &str) -> Option<&'static Resource> {
        let path = url.split('?').next().unwrap_or(url);
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (group, version, rest) = match segments.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        let plural = match rest {
            [plural] | ["namespaces", _, plural] => *plural,
            _ => return None,
        };
        Self::find(group, version, plural)
    }

    /// The built-in resource `group`, `version`, `plural` names, if the table has it.
    pub(crate) fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
        let table = RESOURCES;
        table
            .binary_search_by(|r| (r.group, r.version, r.plural).cmp(&(group, version, plural)))
            .ok()
            .map(|i| &table[i])
    }
}
