//! Objects to create, and what the tests read back from them.

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{api::ObjectMeta, core::Resource};

/// A ConfigMap named `name` holding `data`.
pub fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..Default::default()
    }
}

/// An empty ConfigMap named `name` with `labels`, for selectors and label indexes.
pub fn labelled(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut cm = config_map(name, &[]);
    cm.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    cm
}

/// The object's name, or `""` if it has none.
pub fn name<K: Resource>(o: &K) -> String {
    o.meta().name.clone().unwrap_or_default()
}

/// The object's resourceVersion, or `""` if it has none.
pub fn rv<K: Resource>(o: &K) -> String {
    o.meta().resource_version.clone().unwrap_or_default()
}

/// The value of `key` in the ConfigMap's data.
pub fn data(cm: &ConfigMap, key: &str) -> Option<String> {
    cm.data.as_ref().and_then(|d| d.get(key).cloned())
}
