//! Object keys: `namespace/name`, or `name` for cluster-scoped objects.
//! The full documentation is on [`ObjectKey`].

use std::{borrow::Borrow, fmt, str::FromStr, sync::Arc};

use kube_core::Resource;

use crate::error::Error;

/// The key of an object: `namespace/name`, or just `name` when it has no namespace.
///
/// Cheap to clone (one `Arc<str>`), hashable, ordered, and usable as a workqueue item.
///
/// ```
/// use kube_informer::ObjectKey;
///
/// let key = ObjectKey::new(Some("default"), "web");
/// assert_eq!(key.as_str(), "default/web");
/// assert_eq!(key.namespace(), Some("default"));
/// assert_eq!(key.name(), "web");
///
/// let node: ObjectKey = "node-1".parse().unwrap();
/// assert_eq!(node.namespace(), None);
/// ```
///
/// Object keys: `namespace/name`, or `name` for cluster-scoped objects.
///
/// [`ObjectKey`] is how the store, the indexes and a controller's workqueue name an object.
/// It is one reference-counted string, so cloning it (into an index, a workqueue, a
/// notification) copies a pointer, never the text.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey(Arc<str>);

impl ObjectKey {
    /// Builds the key of `name` in `namespace` (`None` or `""` for cluster-scoped objects).
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        match namespace {
            Some(ns) if !ns.is_empty() => {
                let mut s = String::with_capacity(ns.len() + 1 + name.len());
                s.push_str(ns);
                s.push('/');
                s.push_str(name);
                ObjectKey(s.into())
            }
            _ => ObjectKey(name.into()),
        }
    }

    /// The key of an object, from its `metadata.namespace` and `metadata.name`
    /// (client-go's `MetaNamespaceKeyFunc`).
    ///
    /// # Errors
    ///
    /// [`Error::MissingName`] when the object has no name.
    pub fn from_object<K: Resource>(obj: &K) -> Result<Self, Error> {
        let meta = obj.meta();
        let name = meta.name.as_deref().ok_or(Error::MissingName)?;
        Ok(Self::new(meta.namespace.as_deref(), name))
    }

    /// The whole key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The namespace part, `None` for a cluster-scoped key.
    pub fn namespace(&self) -> Option<&str> {
        split_key(&self.0).0
    }

    /// The name part.
    pub fn name(&self) -> &str {
        split_key(&self.0).1
    }
}

/// Splits a key into `(namespace, name)`; a key without `/` is cluster-scoped.
///
/// Names and namespaces never contain `/`, so the first `/` is the separator
/// (client-go's `SplitMetaNamespaceKey`, which rejects more than one; here any further `/`
/// stays in the name).
fn split_key(key: &str) -> (Option<&str>, &str) {
    match key.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, key),
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for ObjectKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ObjectKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for ObjectKey {
    fn from(key: &str) -> Self {
        ObjectKey(key.into())
    }
}

impl From<String> for ObjectKey {
    fn from(key: String) -> Self {
        ObjectKey(key.into())
    }
}

impl FromStr for ObjectKey {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(s.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Node};
    use kube_core::ObjectMeta;

    #[test]
    fn keys_of_objects() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("a".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let key = ObjectKey::from_object(&cm).unwrap();
        assert_eq!(key.as_str(), "ns/a");
        assert_eq!((key.namespace(), key.name()), (Some("ns"), "a"));
        let node = Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(ObjectKey::from_object(&node).unwrap().as_str(), "n1");
        assert!(matches!(
            ObjectKey::from_object(&ConfigMap::default()),
            Err(Error::MissingName)
        ));
        assert_eq!(ObjectKey::new(Some(""), "x").as_str(), "x");
    }
}
