//! The one handle that writes a store. A write computes its index values and packs its
//! object under the writers' mutex, before the write lock is taken: readers are locked out
//! only for the map updates, and a panicking index function or codec leaves the store
//! unchanged. Full lists, written as one step, are in `relist.rs`.

use std::{
    collections::HashMap,
    fmt,
    ops::Deref,
    sync::{Arc, Mutex, RwLock},
};

use kube_core::Resource;
use serde::{Serialize, de::DeserializeOwned};

use super::{
    Arrival, ObjectKeySet, Recent, Shared, State, Store, WriterState,
    index::{self, Index, IndexFn, IndexValues, NAMESPACE_INDEX, apply_change, compute_values},
    labels::LabelInterner,
    relist,
    slot::{Compact, Keeping, Packer, Slot},
    working_set::{Hot, WorkingSet},
};
use crate::{
    codec::Codec,
    error::Error,
    key::ObjectKey,
    list_watch::{FieldSetMemo, RawObject},
};

/// The one handle that writes a [`Store`] (see the consistency guarantee there).
///
/// It reads too (it dereferences to its [`Store`]). Not `Clone`: a store has one writer,
/// which keeps every write of an informer's cache in its event processor.
pub struct Writer<K> {
    store: Store<K>,
    /// The full list being written, if any (see [`Writer::start_list`]).
    pub(super) list: Mutex<relist::ListProgress<K>>,
}

impl<K> Deref for Writer<K> {
    type Target = Store<K>;

    fn deref(&self) -> &Store<K> {
        &self.store
    }
}

impl<K> fmt::Debug for Writer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Writer").field(&self.store).finish()
    }
}

impl<K: Resource> Default for Writer<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Serialize + DeserializeOwned + Resource + 'static> Writer<K> {
    /// An empty compact store with the default [`WorkingSet`]: objects that come with the
    /// bytes the server sent them in ([`RawObject`]) are kept as those bytes, others as
    /// compact JSON ([`JsonCodec`](crate::codec::JsonCodec)).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_informer::testing::{FakeListWatch, StoreWriter};
    ///
    /// let writer = StoreWriter::<ConfigMap>::compact();
    /// let cm = Arc::new(FakeListWatch::<ConfigMap>::object(Some("ns"), "a"));
    /// writer.insert(cm.clone()).unwrap();
    /// // A fresh object, equal to the one stored.
    /// assert_eq!(writer.store().get_by_key("ns/a").unwrap(), cm);
    /// ```
    #[cfg(any(test, feature = "testing"))]
    pub fn compact() -> Self {
        Self::compact_with(WorkingSet::default())
    }

    /// An empty compact store, as [`compact`](Self::compact), with `working_set`.
    pub fn compact_with(working_set: WorkingSet) -> Self {
        Self::build(Keeping::Compact(Compact::wire_or_json(working_set)))
    }
}

impl<K: Resource> Writer<K> {
    /// An empty store of shared objects with the built-in `namespace` index.
    pub fn new() -> Self {
        Self::build(Keeping::Decoded)
    }

    /// An empty compact store that keeps every object encoded by `codec` (the bytes the
    /// server sent are not kept), with `working_set`.
    pub fn with_codec(codec: Arc<dyn Codec<K>>, working_set: WorkingSet) -> Self {
        Self::build(Keeping::Compact(Compact {
            codec,
            wire: None,
            working_set,
        }))
    }

    pub(super) fn build(keeping: Keeping<K>) -> Self {
        let working_set = match &keeping {
            Keeping::Decoded => WorkingSet::off(),
            Keeping::Compact(compact) => compact.working_set.clone(),
        };
        let store = Store {
            shared: Arc::new(Shared {
                state: RwLock::new(State {
                    objects: HashMap::default(),
                    indexes: vec![Index::new(NAMESPACE_INDEX)],
                    labels: LabelInterner::default(),
                }),
                writer: Mutex::new(WriterState {
                    index_fns: vec![index::namespace_index::<K>()],
                    generation: 0,
                }),
                keeping,
                hot: parking_lot::Mutex::new(Hot::new(working_set)),
                field_sets: FieldSetMemo::default(),
            }),
            usage: None,
        };
        Self {
            store,
            list: Mutex::default(),
        }
    }

    /// A read-only handle on this store.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Registers an index and indexes the objects already stored.
    ///
    /// # Errors
    ///
    /// [`Error::IndexExists`] when an index with this name exists.
    pub fn add_indexer(&self, name: &str, func: IndexFn<K>) -> Result<(), Error> {
        let mut writer = self.writer();
        if self.read().indexes.iter().any(|i| &*i.name == name) {
            return Err(Error::IndexExists(name.to_owned()));
        }
        let mut index = Index::new(name);
        for (key, taken) in self.snapshot() {
            let Some(obj) = self.resolve(&key, taken, Recent::Pass) else {
                continue;
            };
            let mut values = func(&obj);
            values.sort_unstable();
            values.dedup();
            index.add(&key, &values);
        }
        self.write().indexes.push(index);
        writer.index_fns.push(func);
        Ok(())
    }

    /// Inserts or replaces the object under its key; returns the previous one. A compact
    /// store keeps it as bytes (as it keeps a list's objects).
    ///
    /// # Errors
    ///
    /// [`Error::MissingName`] when the object has no name.
    #[cfg(any(test, feature = "testing"))]
    pub fn insert(&self, obj: Arc<K>) -> Result<Option<Arc<K>>, Error> {
        let key = ObjectKey::from_object(&*obj)?;
        Ok(self.insert_keyed(key, obj, None, Arrival::Listed))
    }

    /// The packer of the writer that holds `writer`.
    pub(super) fn packer<'a>(&'a self, writer: &'a mut WriterState<K>) -> Packer<'a, K> {
        Packer {
            keeping: &self.shared.keeping,
            generation: &mut writer.generation,
        }
    }

    pub(crate) fn insert_keyed(
        &self,
        key: ObjectKey,
        obj: Arc<K>,
        raw: Option<RawObject>,
        arrival: Arrival,
    ) -> Option<Arc<K>> {
        let mut writer = self.writer();
        let old_slot = self.read().objects.get(&key).map(Slot::take);
        let had_old = old_slot.is_some();
        let old = old_slot.and_then(|slot| self.resolve(&key, slot, Recent::Pass));
        let old_values = old.as_deref().map(|o| compute_values(&writer.index_fns, o));
        let new_values = compute_values(&writer.index_fns, &obj);
        let slot = self.packer(&mut writer).pack(&key, obj.clone(), raw);
        let warm = match (&slot, arrival) {
            (Slot::Encoded(e), Arrival::Watched) => Some((e.generation, e.body.decoded_size())),
            _ => None,
        };
        {
            let mut st = self.write();
            if had_old && old.is_none() {
                // Its old index values are unknown: drop the key from every index entry.
                st.indexes.iter_mut().for_each(|i| i.remove_key(&key));
            }
            st.put(key.clone(), slot, &obj);
            apply_change(
                &mut st.indexes,
                &key,
                old_values.as_ref(),
                Some(&new_values),
            );
        }
        let mut hot = self.shared.hot.lock();
        match warm {
            Some((generation, size)) => hot.put(&key, generation, obj, size),
            None => hot.forget(&key),
        }
        old
    }

    /// Removes the object under `key`; returns it.
    pub fn remove(&self, key: impl AsRef<str>) -> Option<Arc<K>> {
        let writer = self.writer();
        let (key, taken) = {
            let st = self.read();
            let (k, v) = st.objects.get_key_value(key.as_ref())?;
            (k.clone(), v.take())
        };
        let old = self.resolve(&key, taken, Recent::Pass);
        let old_values: Option<IndexValues> =
            old.as_deref().map(|o| compute_values(&writer.index_fns, o));
        {
            let mut st = self.write();
            st.objects.remove(&key);
            match &old_values {
                Some(values) => apply_change(&mut st.indexes, &key, Some(values), None),
                // Its index values are unknown: drop the key from every index entry.
                None => st.indexes.iter_mut().for_each(|i| i.remove_key(&key)),
            }
        }
        self.shared.hot.lock().forget(&key);
        old
    }

    /// Removes every object whose key is not in `keep`; returns the removed objects.
    pub(crate) fn retain_keys(&self, keep: &ObjectKeySet) -> Vec<(ObjectKey, Arc<K>)> {
        let gone: Vec<ObjectKey> = self
            .read()
            .objects
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        gone.into_iter()
            .filter_map(|key| {
                let obj = self.remove(&key)?;
                Some((key, obj))
            })
            .collect()
    }

    /// Replaces the whole content in one step; returns the previous content.
    ///
    /// Objects without a name are skipped.
    #[cfg(any(test, feature = "testing"))]
    pub fn replace(&self, objects: Vec<Arc<K>>) -> HashMap<ObjectKey, Arc<K>> {
        let objects: Vec<(ObjectKey, Arc<K>)> = objects
            .into_iter()
            .filter_map(|o| Some((ObjectKey::from_object(&*o).ok()?, o)))
            .collect();
        let mut writer = self.writer();
        let mut indexes: Vec<Index> = self.read().indexes.iter().map(Index::empty_like).collect();
        let mut map = Vec::with_capacity(objects.len());
        for (key, obj) in objects {
            let values = compute_values(&writer.index_fns, &obj);
            for (index, values) in indexes.iter_mut().zip(&values) {
                index.add(&key, values);
            }
            let slot = self.packer(&mut writer).pack(&key, obj.clone(), None);
            map.push((key, slot, obj));
        }
        let old = {
            let mut st = self.write();
            st.indexes = indexes;
            let old = std::mem::take(&mut st.objects);
            for (key, slot, obj) in map {
                st.put(key, slot, &obj);
            }
            old
        };
        drop(writer);
        let old: Vec<_> = old
            .into_iter()
            .map(|(key, slot)| (key, slot.take()))
            .collect();
        let old = old
            .into_iter()
            .filter_map(|(key, taken)| {
                let obj = self.resolve(&key, taken, Recent::Pass)?;
                Some((key, obj))
            })
            .collect();
        self.shared.hot.lock().clear();
        old
    }
}
