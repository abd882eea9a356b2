//! Generic metadata access for any resource: client-go's `meta.Accessor`
//! pattern, as one function that serves Pods, Services, custom resources
//! and metadata-only objects alike.

use kube_client::Resource;
use tracing::info;

use crate::{ObjectKey, Store};

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
///
/// ```
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::Service;
/// use kube_informer::{ObjectKey, Store, meta::{LabelReport, log_labels}};
///
/// let store: Store<Service> = Store::new();
/// let mut svc = Service::default();
/// svc.metadata.name = Some("web".into());
/// svc.metadata.namespace = Some("shop".into());
/// store.insert(Arc::new(svc)).unwrap();
///
/// assert_eq!(log_labels(&store, &ObjectKey::new(Some("shop"), "web")), LabelReport::Empty);
/// assert_eq!(log_labels(&store, &ObjectKey::new(Some("shop"), "gone")), LabelReport::Missing);
/// ```
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
