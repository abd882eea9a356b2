//! The tutorial's sync function: log every label of an object, whatever its
//! kind. client-go's tutorial reaches the labels through `meta.Accessor`;
//! here kube's `Resource::meta()` plays that part, so one function serves
//! Pods, Services, custom resources and metadata-only objects alike.

use kube_client::Resource;
use tracing::info;

use kube_informer::{ObjectKey, Store};

/// What [`log_labels`] found for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelReport {
    /// The object exists; its labels, sorted by key.
    Labels(Vec<(String, String)>),
    /// The object exists and has no labels.
    Empty,
    /// The cache has no such object: it was deleted.
    Missing,
}

/// Looks `key` up in `store` and logs what it finds: every label of an
/// existing object as `name [..], namespace [..], key [..], value [..]`,
/// that its label set is empty, or that it does not exist anymore.
///
/// The function knows nothing of the object's type beyond its metadata, so
/// one sync function written with it serves every kind.
pub fn log_labels<K>(store: &Store<K>, key: &ObjectKey) -> LabelReport
where
    K: Resource,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let Some(object) = store.get_by_key(key) else {
        info!(%kind, %key, "{kind} {key} does not exist anymore");
        return LabelReport::Missing;
    };
    let meta = object.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let mut labels: Vec<(String, String)> = meta
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if labels.is_empty() {
        info!(%kind, %key, "name [{name}], namespace [{namespace}], label is empty");
        return LabelReport::Empty;
    }
    labels.sort();
    for (label, value) in &labels {
        info!(%kind, %key, "name [{name}], namespace [{namespace}], key [{label}], value [{value}]");
    }
    LabelReport::Labels(labels)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Service;
    use kube_informer::testing::StoreWriter;

    use super::*;

    #[test]
    fn reports_labels_an_empty_label_set_and_a_deleted_object() {
        let writer = StoreWriter::<Service>::new();
        let mut svc = Service::default();
        svc.metadata.name = Some("web".into());
        svc.metadata.namespace = Some("shop".into());
        writer.insert(Arc::new(svc.clone())).unwrap();
        svc.metadata.name = Some("api".into());
        svc.metadata.labels = Some(
            [
                ("tier".to_owned(), "b".to_owned()),
                ("app".to_owned(), "a".to_owned()),
            ]
            .into(),
        );
        writer.insert(Arc::new(svc)).unwrap();
        let store = writer.store();

        let key = |name| ObjectKey::new(Some("shop"), name);
        assert_eq!(log_labels(&store, &key("web")), LabelReport::Empty);
        assert_eq!(log_labels(&store, &key("gone")), LabelReport::Missing);
        assert_eq!(
            log_labels(&store, &key("api")),
            LabelReport::Labels(vec![
                ("app".to_owned(), "a".to_owned()),
                ("tier".to_owned(), "b".to_owned()),
            ])
        );
    }
}
