//! Full lists written into a store. The first list fills the store as its objects arrive:
//! there is no earlier state for it to mix with, and its objects reach handlers while the
//! rest is still on the wire. Every later list (a relist) is staged and swapped in with one
//! write, so a reader sees the previous list's state, or the new one's, never a mix; a
//! relist that fails part-way leaves the previous state untouched.
//!
//! Staging holds little: the keys listed, and the objects that changed. An object listed at
//! the resourceVersion already stored is unchanged, and its stored slot (shared or encoded)
//! is kept as it is.

use std::sync::{Arc, MutexGuard, PoisonError};

use kube_core::Resource;

use super::{
    Arrival, KeyHasher, ObjectKeySet, Recent,
    index::{IndexValues, apply_change, compute_values},
    kept::EncodedObject,
    slot::{Slot, Taken},
    writer::Writer,
};
use crate::{key::ObjectKey, list_watch::RawObject};

/// What a write changed, for the informer's handlers.
#[derive(Debug)]
pub(crate) enum StoreChange<K> {
    /// A new object.
    Added(Arc<K>),
    /// An object at a new resourceVersion, and its previous state.
    Updated {
        /// The state it replaced.
        old: Arc<K>,
        /// The state stored now.
        new: Arc<K>,
    },
    /// An object missing from a full list: deleted while no watch told of it.
    Deleted {
        /// Its key.
        key: ObjectKey,
        /// The last state the store held.
        last_known: Arc<K>,
    },
}

/// Whether a full list is being written, and whether one ever was.
pub(super) struct ListProgress<K> {
    /// A full list was completed before: later ones are staged.
    completed_once: bool,
    current: Option<ListInProgress<K>>,
}

impl<K> Default for ListProgress<K> {
    fn default() -> Self {
        Self {
            completed_once: false,
            current: None,
        }
    }
}

enum ListInProgress<K> {
    /// The first list, applied as it arrives; `listed` are the keys it held so far.
    Filling { listed: ObjectKeySet },
    /// A relist, applied at its end; `changed` are the listed objects whose
    /// resourceVersion differs from the stored one, in the order they were listed.
    Staging {
        listed: ObjectKeySet,
        changed: Vec<Staged<K>>,
    },
}

/// A relist's changed object, with its wire bytes if it came with them.
type Staged<K> = (ObjectKey, Arc<K>, Option<RawObject>);

fn same_version<K: Resource>(a: &K, b: &K) -> bool {
    match (&a.meta().resource_version, &b.meta().resource_version) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

impl<K: Resource> Writer<K> {
    fn progress(&self) -> MutexGuard<'_, ListProgress<K>> {
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Inserts or replaces one object; returns what changed (`None` for an object stored
    /// at the same resourceVersion already).
    pub(crate) fn upsert(
        &self,
        key: ObjectKey,
        obj: Arc<K>,
        raw: Option<RawObject>,
        arrival: Arrival,
    ) -> Option<StoreChange<K>> {
        match self.insert_keyed(key, obj.clone(), raw, arrival) {
            None => Some(StoreChange::Added(obj)),
            Some(old) if same_version(&*old, &*obj) => None,
            Some(old) => Some(StoreChange::Updated { old, new: obj }),
        }
    }

    /// A full list begins; a list still in progress is abandoned (its staged objects are
    /// dropped, and the store keeps what it held).
    pub(crate) fn start_list(&self) {
        let mut progress = self.progress();
        progress.current = Some(if progress.completed_once {
            // A relist lists about what the store holds.
            ListInProgress::Staging {
                listed: ObjectKeySet::with_capacity_and_hasher(self.len(), KeyHasher::default()),
                changed: Vec::new(),
            }
        } else {
            ListInProgress::Filling {
                listed: ObjectKeySet::default(),
            }
        });
    }

    /// One object of the list in progress. Returns its change when applied at once (the
    /// first list); a relist's changes come from [`finish_list`](Self::finish_list).
    pub(crate) fn list_object(
        &self,
        key: ObjectKey,
        obj: Arc<K>,
        raw: Option<RawObject>,
    ) -> Option<StoreChange<K>> {
        let mut progress = self.progress();
        match &mut progress.current {
            None | Some(ListInProgress::Filling { .. }) => {
                if let Some(ListInProgress::Filling { listed }) = &mut progress.current {
                    listed.insert(key.clone());
                }
                self.upsert(key, obj, raw, Arrival::Listed)
            }
            Some(ListInProgress::Staging { listed, changed }) => {
                if !listed.insert(key.clone()) {
                    // Listed twice: the later state counts.
                    changed.retain(|(k, _, _)| *k != key);
                }
                let stored_version = self.read().objects.get(&key).and_then(|slot| {
                    let version = slot.version()?;
                    Some(version == obj.meta().resource_version.as_deref()?)
                });
                if stored_version != Some(true) {
                    changed.push((key, obj, raw));
                }
                None
            }
        }
    }

    /// Objects of the first list in progress, stored as their bytes without decoding them
    /// (a warm restart's snapshot). Returns those to be decoded and stored as any other:
    /// all of them when the store keeps objects decoded or in a codec's encoding, has
    /// indexes of its own, or this is a relist.
    pub(crate) fn list_encoded(&self, objects: Vec<EncodedObject>) -> Vec<EncodedObject> {
        let mut progress = self.progress();
        let Some(ListInProgress::Filling { listed }) = &mut progress.current else {
            return objects;
        };
        // Those returned are listed too, when they are stored (or found undecodable).
        listed.extend(objects.iter().map(|o| o.key.clone()));
        self.insert_encoded(objects)
    }

    /// An object of the list in progress that could not be decoded: it exists, so it keeps
    /// its last good state, if the store has one.
    pub(crate) fn list_undecodable(&self, key: ObjectKey) {
        match &mut self.progress().current {
            Some(ListInProgress::Filling { listed } | ListInProgress::Staging { listed, .. }) => {
                listed.insert(key);
            }
            None => {}
        }
    }

    /// The list in progress is complete: every stored object it did not list is removed
    /// and, for a relist, every listed change is applied, all in one write. Returns the
    /// changes not reported yet: deletions first, then the relist's additions and updates
    /// in the order they were listed.
    pub(crate) fn finish_list(&self) -> Vec<StoreChange<K>> {
        let mut progress = self.progress();
        let current = progress.current.take();
        match current {
            None => Vec::new(),
            Some(ListInProgress::Filling { listed }) => {
                progress.completed_once = true;
                self.retain_keys(&listed)
                    .into_iter()
                    .map(|(key, last_known)| StoreChange::Deleted { key, last_known })
                    .collect()
            }
            Some(ListInProgress::Staging { listed, changed }) => self.swap_in(&listed, changed),
        }
    }

    /// Applies a staged relist: the decoding, encoding and index functions run first; the
    /// readers' lock is taken once, for the map updates only.
    fn swap_in(&self, listed: &ObjectKeySet, changed: Vec<Staged<K>>) -> Vec<StoreChange<K>> {
        let mut writer = self.writer();
        // The slots a relist removes, and the one each changed object replaces (in the
        // order of `changed`), read at one instant.
        let (gone, replaced) = {
            let st = self.read();
            let gone: Vec<(ObjectKey, Taken<K>)> = st
                .objects
                .iter()
                .filter(|(key, _)| !listed.contains(*key))
                .map(|(key, slot)| (key.clone(), slot.take()))
                .collect();
            let replaced: Vec<Option<Taken<K>>> = changed
                .iter()
                .map(|(key, _, _)| st.objects.get(key).map(Slot::take))
                .collect();
            (gone, replaced)
        };

        struct Removal<K> {
            key: ObjectKey,
            last_known: Option<Arc<K>>,
            values: Option<IndexValues>,
        }
        struct Write<K> {
            key: ObjectKey,
            /// The previous state: `None` for a new object, `Some(None)` when its bytes did
            /// not decode.
            old: Option<Option<Arc<K>>>,
            old_values: Option<IndexValues>,
            new: Arc<K>,
            new_values: IndexValues,
            slot: Option<Slot<K>>,
        }
        let removals: Vec<Removal<K>> = gone
            .into_iter()
            .map(|(key, slot)| {
                let last_known = self.resolve(&key, slot, Recent::Pass);
                let values = last_known
                    .as_deref()
                    .map(|o| compute_values(&writer.index_fns, o));
                Removal {
                    key,
                    last_known,
                    values,
                }
            })
            .collect();
        let mut writes: Vec<Write<K>> = changed
            .into_iter()
            .zip(replaced)
            .map(|((key, new, raw), replaced)| {
                let old = replaced.map(|slot| self.resolve(&key, slot, Recent::Pass));
                let old_values = old
                    .as_ref()
                    .and_then(|o| o.as_deref())
                    .map(|o| compute_values(&writer.index_fns, o));
                let new_values = compute_values(&writer.index_fns, &new);
                let slot = Some(self.packer(&mut writer).pack(&key, new.clone(), raw));
                Write {
                    key,
                    old,
                    old_values,
                    new,
                    new_values,
                    slot,
                }
            })
            .collect();

        {
            let mut st = self.write();
            for removal in &removals {
                st.objects.remove(&removal.key);
                match &removal.values {
                    Some(values) => apply_change(&mut st.indexes, &removal.key, Some(values), None),
                    None => st
                        .indexes
                        .iter_mut()
                        .for_each(|i| i.remove_key(&removal.key)),
                }
            }
            for write in &mut writes {
                if let Some(None) = write.old {
                    // Its old index values are unknown: drop the key from every entry.
                    st.indexes.iter_mut().for_each(|i| i.remove_key(&write.key));
                }
                if let Some(slot) = write.slot.take() {
                    st.put(write.key.clone(), slot, &write.new);
                }
                apply_change(
                    &mut st.indexes,
                    &write.key,
                    write.old_values.as_ref(),
                    Some(&write.new_values),
                );
            }
        }
        drop(writer);
        {
            // Those objects' decoded forms stood for the slots just replaced or removed.
            let mut hot = self.shared.hot.lock();
            removals.iter().for_each(|r| hot.forget(&r.key));
            writes.iter().for_each(|w| hot.forget(&w.key));
        }

        let deletions = removals.into_iter().filter_map(|r| {
            Some(StoreChange::Deleted {
                key: r.key,
                last_known: r.last_known?,
            })
        });
        let updates = writes.into_iter().map(|w| match w.old.flatten() {
            Some(old) => StoreChange::Updated { old, new: w.new },
            None => StoreChange::Added(w.new),
        });
        deletions.chain(updates).collect()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_core::ObjectMeta;

    use super::*;
    use crate::store::{NAMESPACE_INDEX, Selector, label_index};

    fn cm(name: &str, version: &str, app: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                resource_version: Some(version.into()),
                labels: Some([("app".to_owned(), app.to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(Some("ns"), name)
    }

    fn list(writer: &Writer<ConfigMap>, objects: &[Arc<ConfigMap>]) -> Vec<StoreChange<ConfigMap>> {
        writer.start_list();
        let mut changes: Vec<_> = objects
            .iter()
            .filter_map(|o| {
                writer.list_object(ObjectKey::from_object(&**o).unwrap(), o.clone(), None)
            })
            .collect();
        changes.extend(writer.finish_list());
        changes
    }

    /// `(kind, name, resourceVersion)` of each change, in order.
    fn summary(changes: &[StoreChange<ConfigMap>]) -> Vec<(&'static str, String, String)> {
        let describe = |o: &ConfigMap| {
            (
                o.metadata.name.clone().unwrap(),
                o.metadata.resource_version.clone().unwrap(),
            )
        };
        changes
            .iter()
            .map(|c| {
                let (kind, (name, rv)) = match c {
                    StoreChange::Added(o) => ("add", describe(o)),
                    StoreChange::Updated { old, new } => {
                        assert_eq!(old.metadata.name, new.metadata.name);
                        ("update", describe(new))
                    }
                    StoreChange::Deleted { last_known, .. } => ("delete", describe(last_known)),
                };
                (kind, name, rv)
            })
            .collect()
    }

    fn versions(writer: &Writer<ConfigMap>) -> Vec<(String, String)> {
        let mut v: Vec<_> = writer
            .list()
            .iter()
            .map(|o| {
                (
                    o.metadata.name.clone().unwrap(),
                    o.metadata.resource_version.clone().unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    }

    fn pair(name: &str, rv: &str) -> (String, String) {
        (name.to_owned(), rv.to_owned())
    }

    /// `obj` as a warm restart hands it over: its JSON, its key, version and labels.
    fn encoded(obj: &ConfigMap) -> EncodedObject {
        EncodedObject {
            key: ObjectKey::from_object(obj).unwrap(),
            format: crate::list_watch::RawFormat::Json,
            bytes: serde_json::to_vec(obj).unwrap().into(),
            version: obj.metadata.resource_version.as_deref().map(Arc::from),
            labels: (obj.metadata.labels.iter().flatten())
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect(),
        }
    }

    #[test]
    fn a_compact_store_takes_a_snapshot_s_objects_as_they_are_kept() {
        let objects = [cm("a", "1", "web"), cm("b", "2", "db")];
        let writer = Writer::<ConfigMap>::compact();
        assert!(writer.takes_encoded());
        writer.start_list();
        assert!(
            writer
                .list_encoded(objects.iter().map(|o| encoded(o)).collect())
                .is_empty()
        );
        // Read without decoding: the selector through the labels kept beside the bytes,
        // the namespace index through the key, the version for a relist.
        let selector: Selector = "app=web".parse().unwrap();
        let matching = writer.list_selector(&selector);
        assert_eq!(matching, [objects[0].clone()]);
        assert_eq!(writer.index_keys(NAMESPACE_INDEX, "ns").unwrap().len(), 2);
        assert_eq!(versions(&writer), [pair("a", "1"), pair("b", "2")]);
        assert_eq!(writer.get_by_key("ns/b").unwrap(), objects[1]);
        // The list completes as any other: what it did not hold is gone.
        assert!(writer.finish_list().is_empty());
        assert_eq!(writer.len(), 2);

        // A relist compares versions and stages: it decodes.
        writer.start_list();
        assert_eq!(writer.list_encoded(vec![encoded(&objects[0])]).len(), 1);

        // Stores that need the object: one that keeps objects decoded, one with an index of
        // its own.
        let decoded = Writer::<ConfigMap>::new();
        decoded.start_list();
        assert!(!decoded.takes_encoded());
        assert_eq!(decoded.list_encoded(vec![encoded(&objects[0])]).len(), 1);
        let indexed = Writer::<ConfigMap>::compact();
        indexed.add_indexer("app", label_index("app")).unwrap();
        indexed.start_list();
        assert!(!indexed.takes_encoded());
        assert_eq!(indexed.list_encoded(vec![encoded(&objects[0])]).len(), 1);
    }

    #[test]
    fn a_relist_is_invisible_until_it_is_swapped_in_whole() {
        for writer in [Writer::new(), Writer::compact()] {
            writer.add_indexer("app", label_index("app")).unwrap();
            let first = list(
                &writer,
                &[cm("a", "1", "web"), cm("b", "1", "web"), cm("c", "1", "db")],
            );
            assert_eq!(first.len(), 3, "the first list's adds, as they arrive");

            writer.start_list();
            assert!(
                writer
                    .list_object(key("c"), cm("c", "5", "web"), None)
                    .is_none()
            );
            assert!(
                writer
                    .list_object(key("a"), cm("a", "1", "web"), None)
                    .is_none()
            );
            assert!(
                writer
                    .list_object(key("d"), cm("d", "6", "db"), None)
                    .is_none()
            );
            // Half a relist in: the store is still the first list, indexes too.
            assert_eq!(
                versions(&writer),
                [pair("a", "1"), pair("b", "1"), pair("c", "1")]
            );
            assert_eq!(writer.index_keys("app", "db").unwrap(), [key("c")]);

            let changes = writer.finish_list();
            assert_eq!(
                summary(&changes),
                [
                    ("delete", "b".to_owned(), "1".to_owned()),
                    ("update", "c".to_owned(), "5".to_owned()),
                    ("add", "d".to_owned(), "6".to_owned()),
                ],
                "deletes first, then changes in list order; nothing for unchanged a"
            );
            assert_eq!(
                versions(&writer),
                [pair("a", "1"), pair("c", "5"), pair("d", "6")]
            );
            let mut web = writer.index_keys("app", "web").unwrap();
            web.sort();
            assert_eq!(web, [key("a"), key("c")]);
            assert_eq!(writer.index_keys("app", "db").unwrap(), [key("d")]);
            writer.check_invariants().unwrap();
        }
    }

    #[test]
    fn an_abandoned_relist_changes_nothing() {
        let writer = Writer::new();
        list(&writer, &[cm("a", "1", "web"), cm("b", "1", "web")]);
        writer.start_list();
        writer.list_object(key("a"), cm("a", "2", "db"), None);
        // The list failed; the next one starts over and lists b alone.
        assert_eq!(versions(&writer), [pair("a", "1"), pair("b", "1")]);
        let changes = list(&writer, &[cm("b", "1", "web")]);
        assert_eq!(
            summary(&changes),
            [("delete", "a".to_owned(), "1".to_owned())]
        );
        assert_eq!(versions(&writer), [pair("b", "1")]);
        writer.check_invariants().unwrap();
    }

    #[test]
    fn an_undecodable_listed_object_keeps_its_last_state_through_a_relist() {
        let writer = Writer::new();
        list(&writer, &[cm("a", "1", "web"), cm("b", "1", "web")]);
        writer.start_list();
        writer.list_undecodable(key("a"));
        writer.list_object(key("b"), cm("b", "2", "web"), None);
        let changes = writer.finish_list();
        assert_eq!(
            summary(&changes),
            [("update", "b".to_owned(), "2".to_owned())]
        );
        assert_eq!(versions(&writer), [pair("a", "1"), pair("b", "2")]);
    }

    #[test]
    fn an_object_listed_twice_counts_once_at_its_later_state() {
        let writer = Writer::new();
        writer.add_indexer("app", label_index("app")).unwrap();
        list(&writer, &[cm("a", "1", "web")]);
        let changes = list(&writer, &[cm("a", "2", "web"), cm("a", "3", "db")]);
        assert_eq!(
            summary(&changes),
            [("update", "a".to_owned(), "3".to_owned())]
        );
        assert_eq!(writer.index_keys("app", "db").unwrap(), [key("a")]);
        writer.check_invariants().unwrap();
    }
}
