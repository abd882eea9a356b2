//! Typed, read-only views of a [`Store`] (client-go's generated listers).
//! The full documentation is on [`Lister`].

use std::sync::Arc;

use kube_core::Resource;

use super::{Store, index::NAMESPACE_INDEX, selector::Selector};
use crate::key::ObjectKey;

/// Read-only typed queries over a [`Store`]. Cheap to clone.
///
/// ```
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{Lister, Selector, testing::{FakeListWatch, StoreWriter}};
///
/// let store = StoreWriter::<ConfigMap>::new();
/// let mut web = FakeListWatch::<ConfigMap>::object(Some("prod"), "web");
/// web.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
/// store.insert(Arc::new(web)).unwrap();
/// store.insert(Arc::new(FakeListWatch::<ConfigMap>::object(Some("dev"), "db"))).unwrap();
///
/// let lister = Lister::new(store.store());
/// assert_eq!(lister.list().len(), 2);
/// assert_eq!(lister.list_namespace("prod").len(), 1);
/// let selector: Selector = "app in (web, api)".parse().unwrap();
/// assert_eq!(lister.list_selector(&selector).len(), 1);
/// assert!(lister.get("dev", "db").is_some());
/// assert!(lister.get(None, "db").is_none());
/// ```
///
/// Typed, read-only views of a [`Store`] (client-go's generated listers).
///
/// A [`Lister`] answers the questions controllers ask of their cache: everything, one
/// namespace (through the built-in `namespace` index, not a scan), objects matching a label
/// [`Selector`], or one object by namespace and name.
#[derive(Clone, Debug)]
pub struct Lister<K> {
    store: Store<K>,
}

impl<K: Resource> Lister<K> {
    /// A lister over `store`.
    pub fn new(store: Store<K>) -> Self {
        Self { store }
    }

    /// The underlying store.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.store.list()
    }

    /// The objects in namespace `namespace` (from the `namespace` index).
    pub fn list_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        self.store
            .by_index(NAMESPACE_INDEX, namespace)
            .unwrap_or_default()
    }

    /// The objects whose labels match `selector`, in all namespaces
    /// ([`Store::list_selector`]: a compact store decodes only the objects that match).
    pub fn list_selector(&self, selector: &Selector) -> Vec<Arc<K>> {
        self.store.list_selector(selector)
    }

    /// The objects in `namespace` whose labels match `selector`
    /// ([`Store::list_namespace_selector`]).
    pub fn list_namespace_selector(&self, namespace: &str, selector: &Selector) -> Vec<Arc<K>> {
        self.store.list_namespace_selector(namespace, selector)
    }

    /// The object `name` in `namespace` (`None` or `""` for cluster-scoped objects).
    pub fn get<'a>(&self, namespace: impl Into<Option<&'a str>>, name: &str) -> Option<Arc<K>> {
        self.store
            .get_by_key(ObjectKey::new(namespace.into(), name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{store::Writer, testing::FakeListWatch};
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};

    fn cm(ns: &str, name: &str, labels: &[(&str, &str)]) -> Arc<ConfigMap> {
        let mut o = FakeListWatch::<ConfigMap>::object(Some(ns), name);
        o.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        );
        Arc::new(o)
    }

    #[test]
    fn lists_by_namespace_and_selector() {
        let store = Writer::new();
        store.insert(cm("a", "x", &[("app", "web")])).unwrap();
        store.insert(cm("a", "y", &[("app", "db")])).unwrap();
        store
            .insert(cm("b", "z", &[("app", "web"), ("canary", "")]))
            .unwrap();
        let lister = Lister::new(store.store());
        let names = |v: Vec<Arc<ConfigMap>>| {
            let mut n: Vec<_> = v.iter().map(|o| o.metadata.name.clone().unwrap()).collect();
            n.sort();
            n
        };
        assert_eq!(names(lister.list_namespace("a")), ["x", "y"]);
        assert!(lister.list_namespace("none").is_empty());
        let web: Selector = "app=web".parse().unwrap();
        assert_eq!(names(lister.list_selector(&web)), ["x", "z"]);
        let stable: Selector = "app=web,!canary".parse().unwrap();
        assert_eq!(names(lister.list_selector(&stable)), ["x"]);
        assert_eq!(names(lister.list_namespace_selector("b", &web)), ["z"]);
        assert_eq!(lister.list_selector(&Selector::everything()).len(), 3);
        assert!(lister.get("a", "y").is_some());
        assert!(lister.get("b", "y").is_none());
    }

    #[test]
    fn cluster_scoped_get() {
        let store = Writer::<Namespace>::new();
        store
            .insert(Arc::new(FakeListWatch::<Namespace>::object(
                None,
                "kube-system",
            )))
            .unwrap();
        let lister = Lister::new(store.store());
        assert!(lister.get(None, "kube-system").is_some());
        assert!(lister.list_namespace("kube-system").is_empty());
    }
}
