//! Reading a store. Every read takes what it needs under the read lock and decodes after
//! releasing it, so a reader of a compact store never holds writers up while it decodes;
//! reads by key may add what they decode to the working set, lists and index reads only
//! consult it (see `Recent`).

use std::{fmt, sync::Arc};

use kube_core::Resource;

use super::{
    Recent, Store,
    index::{Index, NAMESPACE_INDEX},
    selector::Selector,
    slot::{Keeping, Slot, Taken},
    working_set::WorkingSetStats,
};
use crate::{error::Error, key::ObjectKey};

impl<K> Store<K> {
    /// The object under `key` (`namespace/name`, or `name` for cluster-scoped objects).
    ///
    /// In a compact store, the object comes from the working set when it is there (a
    /// pointer copy), else it is decoded and kept there (see
    /// [`WorkingSet`](super::working_set::WorkingSet)).
    pub fn get_by_key(&self, key: impl AsRef<str>) -> Option<Arc<K>> {
        let (key, taken) = {
            let st = self.read();
            let (key, slot) = st.objects.get_key_value(key.as_ref())?;
            (key.clone(), slot.take())
        };
        self.resolve(&key, taken, Recent::Keep)
    }

    /// Whether an object is stored under `key`.
    pub fn contains_key(&self, key: impl AsRef<str>) -> bool {
        self.read().objects.contains_key(key.as_ref())
    }

    /// All objects, in no particular order, decoded at once.
    ///
    /// A program that walks a large compact store one object at a time (to send each
    /// somewhere, or to count) reads it through [`iter`](Self::iter) instead, which decodes
    /// each object as it is reached and holds no more than one.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.resolve_all(self.snapshot())
    }

    /// Every object, in no particular order, each decoded when the iterator reaches it:
    /// the store as of this call, walked without holding it all decoded at once.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_informer::testing::{FakeListWatch, StoreWriter};
    ///
    /// let writer = StoreWriter::<ConfigMap>::compact();
    /// for name in ["a", "b", "c"] {
    ///     writer.insert(Arc::new(FakeListWatch::<ConfigMap>::object(Some("ns"), name))).unwrap();
    /// }
    /// let store = writer.store();
    /// let objects = store.iter();
    /// writer.remove("ns/c");
    /// assert_eq!(objects.count(), 3, "the store as of the call");
    /// ```
    pub fn iter(&self) -> StoreIter<K> {
        StoreIter {
            store: self.clone(),
            slots: self.snapshot().into_iter(),
        }
    }

    pub(super) fn snapshot(&self) -> Vec<(ObjectKey, Taken<K>)> {
        self.read()
            .objects
            .iter()
            .map(|(k, v)| (k.clone(), v.take()))
            .collect()
    }

    /// The objects for which `filter` is true. `filter` reads the decoded object, so a
    /// compact store decodes every object for it, after releasing its lock (a store of
    /// shared objects runs it under the read lock: keep it quick). To select by labels,
    /// [`list_selector`](Self::list_selector) decodes only the objects that match.
    pub fn list_filtered(&self, mut filter: impl FnMut(&K) -> bool) -> Vec<Arc<K>> {
        if !self.is_compact() {
            return self
                .read()
                .objects
                .values()
                .filter_map(|slot| match slot {
                    Slot::Decoded(o) if filter(o) => Some(o.clone()),
                    _ => None,
                })
                .collect();
        }
        self.iter().filter(|o| filter(o)).collect()
    }

    /// All keys, in no particular order.
    pub fn list_keys(&self) -> Vec<ObjectKey> {
        self.read().objects.keys().cloned().collect()
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    /// True when the store holds no object.
    pub fn is_empty(&self) -> bool {
        self.read().objects.is_empty()
    }

    /// True for a store that keeps objects encoded (an informer built with
    /// [`compact`](crate::informer::InformerBuilder::compact) or [`codec`](crate::informer::InformerBuilder::codec)).
    pub fn is_compact(&self) -> bool {
        matches!(self.shared.keeping, Keeping::Compact(_))
    }

    /// What the decoded working set of a compact store holds now and how well it served
    /// reads (all zero for a store of decoded objects, which needs none).
    pub fn working_set(&self) -> WorkingSetStats {
        self.shared.hot.lock().stats()
    }

    /// The objects whose index `index` contains `value`.
    ///
    /// # Errors
    ///
    /// [`Error::IndexNotFound`] when no index is named `index`.
    pub fn by_index(&self, index: &str, value: &str) -> Result<Vec<Arc<K>>, Error> {
        let slots = self.index_slots(index, value)?;
        Ok(self.resolve_all(slots))
    }

    /// The slots of the objects whose index `index` contains `value`, taken under the read
    /// lock so that they are decoded after it.
    pub(super) fn index_slots(
        &self,
        index: &str,
        value: &str,
    ) -> Result<Vec<(ObjectKey, Taken<K>)>, Error> {
        let st = self.read();
        let idx = find(&st.indexes, index)?;
        let Some(keys) = idx.get(value) else {
            return Ok(Vec::new());
        };
        let mut slots = Vec::with_capacity(keys.len());
        slots.extend(
            keys.iter()
                .filter_map(|k| Some((k.clone(), st.objects.get(k)?.take()))),
        );
        Ok(slots)
    }

    /// The keys of the objects whose index `index` contains `value`.
    ///
    /// # Errors
    ///
    /// [`Error::IndexNotFound`] when no index is named `index`.
    pub fn index_keys(&self, index: &str, value: &str) -> Result<Vec<ObjectKey>, Error> {
        let st = self.read();
        let idx = find(&st.indexes, index)?;
        Ok(idx
            .get(value)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default())
    }

    /// Every value present in index `index` (sorted).
    ///
    /// # Errors
    ///
    /// [`Error::IndexNotFound`] when no index is named `index`.
    pub fn list_index_values(&self, index: &str) -> Result<Vec<String>, Error> {
        let st = self.read();
        let idx = find(&st.indexes, index)?;
        let mut values: Vec<String> = idx.entries.keys().map(|v| v.to_string()).collect();
        values.sort_unstable();
        Ok(values)
    }

    /// Names of the registered indexes (always including [`NAMESPACE_INDEX`]).
    pub fn index_names(&self) -> Vec<String> {
        self.read()
            .indexes
            .iter()
            .map(|i| i.name.to_string())
            .collect()
    }
}

impl<K: Resource> Store<K> {
    /// The stored object with the key of `obj`.
    pub fn get(&self, obj: &K) -> Option<Arc<K>> {
        let key = ObjectKey::from_object(obj).ok()?;
        self.get_by_key(key)
    }

    /// The objects whose labels match `selector`, in all namespaces (all objects for the
    /// empty selector).
    ///
    /// A compact store matches the labels it keeps beside each object's bytes and decodes
    /// only the objects that match: 100 Pods selected among 10,000 cost 100 decodes, less
    /// those the working set holds.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_informer::{Selector, testing::{FakeListWatch, StoreWriter}};
    ///
    /// let writer = StoreWriter::<ConfigMap>::compact();
    /// for (name, app) in [("a", "web"), ("b", "db")] {
    ///     let mut cm = FakeListWatch::<ConfigMap>::object(Some("ns"), name);
    ///     cm.metadata.labels = Some([("app".to_owned(), app.to_owned())].into());
    ///     writer.insert(Arc::new(cm)).unwrap();
    /// }
    /// let web: Selector = "app=web".parse().unwrap();
    /// let found = writer.store().list_selector(&web);
    /// assert_eq!(found.len(), 1);
    /// assert_eq!(found[0].metadata.name.as_deref(), Some("a"));
    /// ```
    pub fn list_selector(&self, selector: &Selector) -> Vec<Arc<K>> {
        if selector.is_empty() {
            return self.list();
        }
        let slots = {
            let st = self.read();
            st.matching(st.objects.iter(), selector)
        };
        self.resolve_all(slots)
    }

    /// The objects in `namespace` whose labels match `selector`: the namespace's keys come
    /// from the built-in `namespace` index, and only the objects that match are decoded.
    pub fn list_namespace_selector(&self, namespace: &str, selector: &Selector) -> Vec<Arc<K>> {
        let slots = {
            let st = self.read();
            let keys = find(&st.indexes, NAMESPACE_INDEX)
                .ok()
                .and_then(|idx| idx.get(namespace));
            let slots = keys
                .into_iter()
                .flat_map(|keys| keys.iter())
                .filter_map(|key| st.objects.get_key_value(key));
            st.matching(slots, selector)
        };
        self.resolve_all(slots)
    }
}

fn find<'a>(indexes: &'a [Index], name: &str) -> Result<&'a Index, Error> {
    indexes
        .iter()
        .find(|i| &*i.name == name)
        .ok_or_else(|| Error::IndexNotFound(name.to_owned()))
}

/// The objects of a [`Store`] as of [`Store::iter`], each decoded when reached. Objects
/// whose bytes do not decode are left out (with an error log).
pub struct StoreIter<K> {
    store: Store<K>,
    slots: std::vec::IntoIter<(ObjectKey, Taken<K>)>,
}

impl<K> Iterator for StoreIter<K> {
    type Item = Arc<K>;

    fn next(&mut self) -> Option<Arc<K>> {
        for (key, taken) in self.slots.by_ref() {
            if let Some(obj) = self.store.resolve(&key, taken, Recent::Pass) {
                return Some(obj);
            }
        }
        None
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.slots.len()))
    }
}

impl<K> fmt::Debug for StoreIter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreIter")
            .field("remaining", &self.slots.len())
            .finish()
    }
}
