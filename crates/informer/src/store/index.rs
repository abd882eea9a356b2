//! Secondary indexes of the [`Store`](crate::Store): index functions and their storage.
//! The full documentation is on [`IndexFn`].

use std::{collections::HashMap, sync::Arc};

use kube_core::Resource;

use super::{KeyHasher, ObjectKeySet};
use crate::key::ObjectKey;

/// Name of the built-in index of objects by namespace. Cluster-scoped objects are not in it.
pub const NAMESPACE_INDEX: &str = "namespace";

/// An index function: the index values of an object (client-go's `IndexFunc`).
///
/// It must be a pure function of the object, and quick: the store calls it on every write.
///
/// Secondary indexes of the [`Store`](crate::Store): index functions and their storage.
///
/// An index maps *index values* to the keys of the objects that produce them. An
/// [`IndexFn`] computes an object's values (none, one or several): its namespace, the value
/// of a label, the uid of its owner, ... The store keeps each index as
/// `value -> set of ObjectKey`, where a set of one key is stored inline (most owner and
/// label indexes are nearly unique) and keys are shared `Arc<str>`s, never copied text.
///
/// The `namespace` index ([`NAMESPACE_INDEX`]) is always present.
pub type IndexFn<K> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

/// Index function of the built-in [`NAMESPACE_INDEX`].
pub fn namespace_index<K: Resource>() -> IndexFn<K> {
    Arc::new(|obj: &K| obj.meta().namespace.iter().cloned().collect())
}

/// Index function: the value of label `label` (objects without it are not indexed).
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{SharedInformer, store::label_index, testing::FakeListWatch};
///
/// let informer = SharedInformer::builder(FakeListWatch::<ConfigMap>::new("configmaps"))
///     .index_fn("app", label_index("app"))
///     .build();
/// assert!(informer.store().index_names().contains(&"app".to_owned()));
/// ```
pub fn label_index<K: Resource>(label: &str) -> IndexFn<K> {
    let label = label.to_owned();
    Arc::new(move |obj: &K| {
        obj.meta()
            .labels
            .as_ref()
            .and_then(|l| l.get(&label))
            .cloned()
            .into_iter()
            .collect()
    })
}

/// Index function: the uids of the object's owners (all owner references), for finding the
/// children of an owner with `by_index("owner", uid)`.
pub fn owner_uid_index<K: Resource>() -> IndexFn<K> {
    Arc::new(|obj: &K| {
        obj.meta()
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.uid.clone())
            .collect()
    })
}

/// The set of keys under one index value; one key is stored without a `HashSet`.
#[derive(Debug)]
pub(crate) enum KeySet {
    One(ObjectKey),
    Many(ObjectKeySet),
}

impl KeySet {
    fn insert(&mut self, key: ObjectKey) {
        match self {
            KeySet::One(k) if *k == key => {}
            KeySet::One(k) => {
                let mut set = ObjectKeySet::with_capacity_and_hasher(2, KeyHasher::default());
                set.insert(k.clone());
                set.insert(key);
                *self = KeySet::Many(set);
            }
            KeySet::Many(set) => {
                set.insert(key);
            }
        }
    }

    /// Removes `key`; returns true when the set became empty.
    fn remove(&mut self, key: &ObjectKey) -> bool {
        match self {
            KeySet::One(k) => k == key,
            KeySet::Many(set) => {
                set.remove(key);
                if set.len() == 1 {
                    let only = set.iter().next().cloned();
                    if let Some(only) = only {
                        *self = KeySet::One(only);
                    }
                }
                set_is_empty(self)
            }
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &ObjectKey> {
        let (one, many) = match self {
            KeySet::One(k) => (Some(k), None),
            KeySet::Many(set) => (None, Some(set.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            KeySet::One(_) => 1,
            KeySet::Many(set) => set.len(),
        }
    }
}

fn set_is_empty(set: &KeySet) -> bool {
    matches!(set, KeySet::Many(s) if s.is_empty())
}

/// One named index: its `value -> keys` map. Its function lives with the store's writer,
/// in the same order as the store's indexes.
pub(crate) struct Index {
    pub(crate) name: Arc<str>,
    pub(crate) entries: HashMap<Box<str>, KeySet, KeyHasher>,
}

impl Index {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            entries: HashMap::default(),
        }
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn empty_like(&self) -> Self {
        Self::new(&self.name)
    }

    /// Adds `key` under one `value`.
    pub(crate) fn add_one(&mut self, key: &ObjectKey, value: &str) {
        match self.entries.get_mut(value) {
            Some(set) => set.insert(key.clone()),
            None => {
                self.entries.insert(value.into(), KeySet::One(key.clone()));
            }
        }
    }

    pub(crate) fn add(&mut self, key: &ObjectKey, values: &[String]) {
        for value in values {
            self.add_one(key, value);
        }
    }

    pub(crate) fn remove(&mut self, key: &ObjectKey, values: &[String]) {
        for value in values {
            if let Some(set) = self.entries.get_mut(value.as_str())
                && set.remove(key)
            {
                self.entries.remove(value.as_str());
            }
        }
    }

    /// Removes `key` under every value (when its values are unknown).
    pub(crate) fn remove_key(&mut self, key: &ObjectKey) {
        self.entries.retain(|_, set| !set.remove(key));
    }

    pub(crate) fn get(&self, value: &str) -> Option<&KeySet> {
        self.entries.get(value)
    }
}

/// The index values of one object for every index, computed outside the store's lock.
pub(crate) type IndexValues = Vec<Vec<String>>;

pub(crate) fn compute_values<K>(indexes: &[IndexFn<K>], obj: &K) -> IndexValues {
    indexes
        .iter()
        .map(|f| {
            let mut v = f(obj);
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect()
}

/// Applies a change of one object's index values to every index.
pub(crate) fn apply_change(
    indexes: &mut [Index],
    key: &ObjectKey,
    old: Option<&IndexValues>,
    new: Option<&IndexValues>,
) {
    for (i, index) in indexes.iter_mut().enumerate() {
        let old = old.map(|v| v[i].as_slice()).unwrap_or(&[]);
        let new = new.map(|v| v[i].as_slice()).unwrap_or(&[]);
        if old == new {
            continue;
        }
        let gone: Vec<String> = old.iter().filter(|v| !new.contains(v)).cloned().collect();
        let added: Vec<String> = new.iter().filter(|v| !old.contains(v)).cloned().collect();
        index.remove(key, &gone);
        index.add(key, &added);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_set_shrinks_back_to_one() {
        let a = ObjectKey::from("a");
        let b = ObjectKey::from("b");
        let mut set = KeySet::One(a.clone());
        set.insert(b.clone());
        assert_eq!(set.len(), 2);
        assert!(!set.remove(&a));
        assert!(matches!(set, KeySet::One(ref k) if *k == b));
        assert!(set.remove(&b));
    }

    #[test]
    fn index_add_remove() {
        let mut idx = Index::new("x");
        let k = ObjectKey::from("ns/a");
        idx.add(&k, &["v1".into(), "v2".into()]);
        assert_eq!(idx.get("v1").map(KeySet::len), Some(1));
        idx.remove(&k, &["v1".into()]);
        assert!(idx.get("v1").is_none());
        assert!(idx.get("v2").is_some());
    }
}
