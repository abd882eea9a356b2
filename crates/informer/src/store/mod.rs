//! The thread-safe, indexed object cache (client-go's `Indexer` / `threadSafeMap`).
//! The full documentation is on [`Store`].

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard},
};

use kube_core::Resource;

mod index;
mod kept;
mod labels;
mod lister;
mod projection;
#[cfg(test)]
mod property_tests;
mod read;
mod relist;
mod selector;
mod slot;
mod usage;
mod working_set;
pub(crate) mod writer;

use crate::{key::ObjectKey, list_watch::FieldSetMemo};

use index::Index;
pub use index::{IndexFn, NAMESPACE_INDEX, label_index, namespace_index, owner_uid_index};
pub(crate) use kept::{EncodedObject, Kept, KeptObjects, LabelRun, LabelText};
use labels::LabelInterner;
pub use lister::Lister;
pub use read::StoreIter;
pub(crate) use relist::StoreChange;
pub use selector::{Operator, Requirement, Selector, SelectorError};
use slot::{Keeping, Slot, Taken};
pub(crate) use slot::{WireDecoder, decode_wire};
pub(crate) use usage::{Usage, WeakUsage};
use working_set::Hot;
pub use working_set::{SharedBudget, WorkingSet, WorkingSetStats};
pub(crate) use writer::Writer;

/// The hasher of the store's maps and sets of keys: foldhash, seeded per map, as the
/// workqueue's. Keys are the `namespace/name`s of the server's objects, and SipHash was
/// about 2% of a 10,000-Pod sync's CPU.
pub(crate) type KeyHasher = foldhash::fast::RandomState;

/// A set of object keys, hashed as the store's maps are.
pub(crate) type ObjectKeySet = HashSet<ObjectKey, KeyHasher>;

/// A transform applied to every object before it is stored (and before handlers see it).
///
/// Typical use: drop fields the program never reads to save memory, as
/// [`strip_managed_fields`] does.
pub type TransformFn<K> = Arc<dyn Fn(K) -> K + Send + Sync>;

/// Transform that drops `metadata.managedFields`, usually the largest part of an object that
/// a controller never reads.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{SharedInformer, store::strip_managed_fields, testing::FakeListWatch};
///
/// let informer = SharedInformer::builder(FakeListWatch::<ConfigMap>::new("configmaps"))
///     .transform(strip_managed_fields)
///     .build();
/// ```
pub fn strip_managed_fields<K: Resource>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

/// Thread-safe indexed cache of `K` by [`ObjectKey`], read-only. Cheap to clone (shared).
///
/// Read it from an informer ([`InformerHandle::store`](crate::InformerHandle::store)); the
/// consistency guarantee is below.
///
/// ```
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{store::label_index, testing::{FakeListWatch, StoreWriter}};
///
/// let writer = StoreWriter::<ConfigMap>::new();
/// writer.add_indexer("app", label_index("app")).unwrap();
/// let mut cm = FakeListWatch::<ConfigMap>::object(Some("ns"), "a");
/// cm.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
/// writer.insert(Arc::new(cm)).unwrap();
///
/// let store = writer.store();
/// assert!(store.get_by_key("ns/a").is_some());
/// assert_eq!(store.by_index("app", "web").unwrap().len(), 1);
/// assert_eq!(store.by_index("namespace", "ns").unwrap().len(), 1);
/// assert_eq!(store.list_index_values("app").unwrap(), vec!["web".to_owned()]);
/// ```
///
/// The thread-safe, indexed object cache (client-go's `Indexer` / `threadSafeMap`).
///
/// [`Store<K>`] maps [`ObjectKey`]s to objects. A *compact* store (an informer's default)
/// holds each object as bytes, the ones the server sent or an encoding by a [`Codec`]:
/// much less memory than decoded objects. Beside the bytes it keeps what reads select by
/// (the labels, shared between the objects that carry the same ones), so a selector or
/// namespace list decodes only what it returns, and a [`WorkingSet`] of the objects just
/// delivered and those read again by key, decoded, so that the reads a reconcile makes of them are
/// pointer copies. Other reads decode, some microseconds per object. A store of decoded
/// objects holds each as the `Arc<K>` it was decoded into: every reader, index and event
/// handler shares it, and nothing is deep-copied after decoding.
///
/// How a store keeps objects is fixed when it is built, and each kept object carries
/// what decodes it: no store holds bytes it cannot read.
///
/// A [`Store`] is a read-only handle. Its one `Writer` belongs to whoever fills the cache
/// (a [`SharedInformer`](crate::SharedInformer)'s processor), so a program can read an
/// informer's cache but has no way to write to it behind the informer's back. Tests build a
/// writer of their own through the `testing` feature (`testing::StoreWriter`).
///
/// # Consistency guarantee
///
/// Objects and all index entries live behind **one** `RwLock`, and every write (insert,
/// remove, replace, add an index) becomes visible to readers in a single step. Hence:
///
/// * a reader never sees an index entry whose key is missing from the objects, nor an object
///   missing from an index it belongs to;
/// * an object and all its index entries change together: `by_index(i, v)` returns objects
///   whose *current* index values include `v`;
/// * `list()` and friends are snapshots of one instant.
///
/// Writers are serialized by a separate mutex, and the (user-supplied) index functions and
/// the codec run under that mutex only, *before* the `RwLock` is taken for writing: readers
/// are locked out just for the hash-map updates, and a panicking index function leaves the
/// store unchanged. Readers of a compact store decode after releasing the lock.
///
/// A `RwLock` (and not a sharded map such as `dashmap`) is a deliberate choice: the
/// guarantee above needs objects and indexes to change atomically together, which per-shard
/// locks cannot give without a second lock on top. An informer's store has one writer (its
/// reflector), and read critical sections are short, so one lock does not limit throughput.
///
/// [`Codec`]: crate::codec::Codec
pub struct Store<K> {
    shared: Arc<Shared<K>>,
    /// Keeps the informer feeding this cache running, for a store a factory handed out.
    usage: Option<Usage>,
}

struct Shared<K> {
    state: RwLock<State<K>>,
    /// Serializes writers, and holds what only writers use.
    writer: Mutex<WriterState<K>>,
    keeping: Keeping<K>,
    /// The decoded working set of a compact store (see [`WorkingSet`]).
    hot: parking_lot::Mutex<Hot<K>>,
    /// The field sets of `managedFields` its decodes met more than once, parsed.
    field_sets: FieldSetMemo,
}

/// What only writers use, under the writers' mutex.
struct WriterState<K> {
    /// The index functions, in the order of the store's indexes (changed only by
    /// `add_indexer`).
    index_fns: Vec<IndexFn<K>>,
    /// How many encoded slots were written: each slot's `generation`.
    generation: u64,
}

struct State<K> {
    objects: HashMap<ObjectKey, Slot<K>, KeyHasher>,
    indexes: Vec<Index>,
    /// The distinct labels of the encoded objects, changed with them: a reader resolves a
    /// selector against the pairs the objects it reads point to.
    labels: LabelInterner,
}

impl<K: Resource> State<K> {
    /// The slots among `slots` whose labels match `selector`, taken under the read lock
    /// (which `self` is read under) so that they are decoded after it.
    fn matching<'a>(
        &'a self,
        slots: impl Iterator<Item = (&'a ObjectKey, &'a Slot<K>)>,
        selector: &Selector,
    ) -> Vec<(ObjectKey, Taken<K>)> {
        let matcher = self.labels.matcher(selector);
        slots
            .filter(|(_, slot)| slot.matches(selector, &matcher))
            .map(|(key, slot)| (key.clone(), slot.take()))
            .collect()
    }

    /// Stores `slot`, which holds `obj`, under `key`.
    fn put(&mut self, key: ObjectKey, mut slot: Slot<K>, obj: &K) {
        slot.intern_labels(&mut self.labels, obj);
        self.objects.insert(key, slot);
    }
}

/// Whether a write came from a watch event, whose object is about to reach handlers and,
/// through them, a reconcile that reads it back: a compact store keeps that object in its
/// working set. A list's objects do not go there: a list writes every object at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    Listed,
    Watched,
}

/// Whether a read may add what it decodes to the working set. Only reads of one key do,
/// and only an object read twice (see `Hot::admit_read`): a reconcile reads back the
/// object it was handed, and again when it is requeued, while lists and index reads
/// decode many objects that are seldom read again soon, and kept they would push out the
/// rest and grow the heap (measured: in the reconcile-shaped benchmark, keeping the
/// selector lists' objects cost a quarter of the throughput and doubled the RSS, for a 7%
/// hit rate).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Recent {
    Keep,
    Pass,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            usage: self.usage.clone(),
        }
    }
}

impl<K> Store<K> {
    /// This store, counted as a use of the informer that feeds it.
    pub(crate) fn in_use(mut self, usage: Option<Usage>) -> Self {
        self.usage = usage;
        self
    }
}

impl<K> fmt::Debug for Store<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.read();
        f.debug_struct("Store")
            .field("objects", &st.objects.len())
            .field(
                "indexes",
                &st.indexes.iter().map(|i| &*i.name).collect::<Vec<_>>(),
            )
            .field("compact", &self.is_compact())
            .finish()
    }
}

impl<K> Store<K> {
    fn read(&self) -> RwLockReadGuard<'_, State<K>> {
        self.shared
            .state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, State<K>> {
        self.shared
            .state
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn writer(&self) -> MutexGuard<'_, WriterState<K>> {
        self.shared
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The object of a slot taken out of the lock: shared, from the working set, or decoded
    /// (and then kept in the working set when `recent` says so). `None`, with an error log,
    /// when its bytes do not decode.
    fn resolve(&self, key: &ObjectKey, taken: Taken<K>, recent: Recent) -> Option<Arc<K>> {
        let (body, generation) = match taken {
            Taken::Decoded(obj) => return Some(obj),
            Taken::Encoded { body, generation } => (body, generation),
        };
        if let Some(obj) = self.shared.hot.lock().get(key, generation) {
            return Some(obj);
        }
        let obj = body.unpack(key, &self.shared.field_sets)?;
        if recent == Recent::Keep {
            let mut hot = self.shared.hot.lock();
            if hot.admit_read(key, generation) {
                hot.put(key, generation, obj.clone(), body.decoded_size());
            } else {
                hot.hold(key, generation, &obj);
            }
        }
        Some(obj)
    }

    /// The objects of several taken slots, in their order, leaving out those that do not
    /// decode; the working set is consulted once for all, and not added to (see
    /// [`Recent`]).
    fn resolve_all(&self, taken: Vec<(ObjectKey, Taken<K>)>) -> Vec<Arc<K>> {
        let mut found: Vec<Option<Arc<K>>> = Vec::with_capacity(taken.len());
        {
            let mut hot = self.shared.hot.lock();
            for (key, slot) in &taken {
                found.push(match slot {
                    Taken::Decoded(obj) => Some(obj.clone()),
                    Taken::Encoded { generation, .. } => hot.get(key, *generation),
                });
            }
        }
        for ((key, slot), found) in taken.iter().zip(&mut found) {
            if let (None, Taken::Encoded { body, .. }) = (&found, slot) {
                *found = body.unpack(key, &self.shared.field_sets);
            }
        }
        found.into_iter().flatten().collect()
    }
}

#[cfg(test)]
impl<K: Resource> Store<K> {
    /// Checks that objects and indexes agree, and that every encoded slot's labels are its
    /// object's; used by tests.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        type Entries = Vec<(String, Vec<ObjectKey>)>;
        type Snapshot<K> = (
            Vec<(
                ObjectKey,
                Taken<K>,
                Option<std::collections::BTreeMap<String, String>>,
            )>,
            Vec<(String, IndexFn<K>, Entries)>,
        );
        // The index functions, in the order of the indexes.
        let fns: Vec<IndexFn<K>> = self.writer().index_fns.clone();
        // One snapshot of objects and indexes, taken under one read lock.
        let (slots, indexes): Snapshot<K> = {
            let st = self.read();
            let slots = st
                .objects
                .iter()
                .map(|(k, v)| {
                    let labels = match v {
                        Slot::Encoded(e) => Some(e.labels.to_map()),
                        Slot::Decoded(_) => None,
                    };
                    (k.clone(), v.take(), labels)
                })
                .collect();
            let indexes = st
                .indexes
                .iter()
                .zip(fns)
                .map(|(i, func)| {
                    let entries = i
                        .entries
                        .iter()
                        .map(|(v, keys)| (v.to_string(), keys.iter().cloned().collect()))
                        .collect();
                    (i.name.to_string(), func, entries)
                })
                .collect();
            (slots, indexes)
        };
        let mut objects: HashMap<ObjectKey, Arc<K>> = HashMap::new();
        for (k, taken, labels) in slots {
            let obj = self
                .resolve(&k, taken, Recent::Pass)
                .ok_or(format!("{k} does not decode"))?;
            if let Some(labels) = labels
                && labels != obj.meta().labels.clone().unwrap_or_default()
            {
                return Err(format!("{k} keeps labels {labels:?} that are not its own"));
            }
            objects.insert(k, obj);
        }
        for (name, func, entries) in &indexes {
            for (value, keys) in entries {
                for key in keys {
                    let obj = objects
                        .get(key)
                        .ok_or_else(|| format!("{name}[{value}] -> missing {key}"))?;
                    if !func(obj).iter().any(|v| v == value) {
                        return Err(format!("{name}[{value}] -> {key} with other values"));
                    }
                }
            }
        }
        for (key, obj) in &objects {
            for (name, func, entries) in &indexes {
                for value in func(obj) {
                    let ok = entries
                        .iter()
                        .any(|(v, keys)| *v == value && keys.contains(key));
                    if !ok {
                        return Err(format!("{key} not in {name}[{value}]"));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        codec::Codec,
        error::Error,
        list_watch::{RawFormat, RawObject},
    };
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_core::ObjectMeta;
    use slot::{Compact, decode_wire};
    use std::{
        collections::BTreeMap,
        sync::atomic::{AtomicBool, Ordering},
        thread,
    };

    fn cm(ns: &str, name: &str, app: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some([("app".to_owned(), app.to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn app(o: &ConfigMap) -> &str {
        o.metadata.labels.as_ref().unwrap()["app"].as_str()
    }

    /// Both kinds of store: shared objects and compact.
    fn stores() -> [Writer<ConfigMap>; 2] {
        [Writer::new(), Writer::compact()]
    }

    #[test]
    fn crud_and_indexes() {
        for store in stores() {
            crud_and_indexes_on(store);
        }
    }

    fn crud_and_indexes_on(store: Writer<ConfigMap>) {
        store.add_indexer("app", label_index("app")).unwrap();
        assert!(matches!(
            store.add_indexer("app", label_index("app")),
            Err(Error::IndexExists(_))
        ));
        assert!(store.insert(cm("a", "x", "web")).unwrap().is_none());
        store.insert(cm("b", "y", "web")).unwrap();
        store.insert(cm("b", "z", "db")).unwrap();
        assert_eq!(store.len(), 3);
        assert_eq!(store.by_index("app", "web").unwrap().len(), 2);
        assert_eq!(store.by_index("namespace", "b").unwrap().len(), 2);
        assert_eq!(store.list_index_values("app").unwrap(), ["db", "web"]);
        assert!(matches!(
            store.by_index("nope", "x"),
            Err(Error::IndexNotFound(_))
        ));

        let old = store.insert(cm("b", "y", "db")).unwrap().unwrap();
        assert_eq!(app(&old), "web");
        assert_eq!(
            store.index_keys("app", "web").unwrap(),
            [ObjectKey::from("a/x")]
        );
        assert_eq!(store.by_index("app", "db").unwrap().len(), 2);

        assert!(store.remove("a/x").is_some());
        assert!(store.remove("a/x").is_none());
        assert_eq!(store.list_index_values("app").unwrap(), ["db"]);
        assert_eq!(store.list_index_values("namespace").unwrap(), ["b"]);

        let old = store.replace(vec![cm("c", "q", "web")]);
        assert_eq!(old.len(), 2);
        assert_eq!(store.list_keys(), [ObjectKey::from("c/q")]);
        assert_eq!(store.by_index("app", "web").unwrap().len(), 1);
        store.check_invariants().unwrap();
    }

    #[test]
    fn late_indexer_indexes_existing_objects() {
        for store in stores() {
            store.insert(cm("a", "x", "web")).unwrap();
            store.add_indexer("app", label_index("app")).unwrap();
            assert_eq!(store.by_index("app", "web").unwrap().len(), 1);
        }
    }

    #[test]
    fn a_compact_store_returns_equal_objects_and_keeps_no_decoded_one() {
        let store = Writer::<ConfigMap>::compact();
        let obj = cm("a", "x", "web");
        store.insert(obj.clone()).unwrap();
        // Only the caller holds the inserted Arc: the store kept bytes.
        assert_eq!(Arc::strong_count(&obj), 1);
        let read = store.get_by_key("a/x").unwrap();
        assert_eq!(read, obj);
        assert!(!Arc::ptr_eq(&read, &obj));
        assert_eq!(
            store.list_filtered(|o| app(o) == "web"),
            std::slice::from_ref(&obj)
        );
        assert_eq!(store.remove("a/x").unwrap(), obj);
        assert!(store.is_empty());
    }

    /// A codec whose bytes never decode, standing in for a type that does not round-trip.
    struct Broken;

    impl Codec<ConfigMap> for Broken {
        fn encode(&self, _: &ConfigMap) -> Result<Vec<u8>, crate::error::BoxError> {
            Ok(b"not json".to_vec())
        }
        fn decode(&self, bytes: &[u8]) -> Result<ConfigMap, crate::error::BoxError> {
            Ok(serde_json::from_slice(bytes)?)
        }
    }

    /// A codec that cannot encode: a store that kept the wire's bytes never asked it to.
    struct NoEncoding;

    impl Codec<ConfigMap> for NoEncoding {
        fn encode(&self, _: &ConfigMap) -> Result<Vec<u8>, crate::error::BoxError> {
            Err("asked to encode".into())
        }
        fn decode(&self, bytes: &[u8]) -> Result<ConfigMap, crate::error::BoxError> {
            Ok(serde_json::from_slice(bytes)?)
        }
    }

    #[test]
    fn a_compact_store_keeps_the_bytes_an_object_came_in_without_encoding_it() {
        let store = Writer::build(Keeping::Compact(Compact {
            codec: Arc::new(NoEncoding),
            wire: Some(decode_wire::<ConfigMap>),
            working_set: WorkingSet::off(),
        }));
        store.add_indexer("app", label_index("app")).unwrap();
        let web = cm("a", "x", "web");
        // Arrived in a buffer holding more than this object: the store copies its part.
        let buffer =
            bytes::Bytes::from([b"[".as_slice(), &serde_json::to_vec(&*web).unwrap()].concat());
        let raw = RawObject::new(buffer.slice(1..), RawFormat::Json);
        store.insert_keyed("a/x".into(), web.clone(), Some(raw), Arrival::Listed);
        assert!(
            matches!(store.read().objects.get("a/x"), Some(Slot::Encoded(e)) if e.body.wire().is_some()),
            "kept as the wire's bytes"
        );
        assert_eq!(Arc::strong_count(&web), 1, "and not as the decoded object");
        assert_eq!(store.get_by_key("a/x"), Some(web.clone()));
        assert_eq!(
            store.by_index("app", "web").unwrap(),
            std::slice::from_ref(&web)
        );

        // Without bytes, the store encodes; this codec cannot, so the object stays decoded.
        let db = cm("a", "x", "db");
        let old = store.insert_keyed("a/x".into(), db.clone(), None, Arrival::Listed);
        assert_eq!(
            old,
            Some(web),
            "the old object, decoded from the wire's bytes"
        );
        assert!(matches!(
            store.read().objects.get("a/x"),
            Some(Slot::Decoded(_))
        ));
        assert!(store.index_keys("app", "web").unwrap().is_empty());
        assert_eq!(store.get_by_key("a/x"), Some(db));
        store.check_invariants().unwrap();
    }

    #[test]
    fn the_working_set_serves_only_the_write_a_slot_is() {
        let store = Writer::<ConfigMap>::compact();
        let web = cm("a", "x", "web");
        store.insert_keyed("a/x".into(), web.clone(), None, Arrival::Watched);
        let hot = store.get_by_key("a/x").unwrap();
        assert!(Arc::ptr_eq(&hot, &web), "the delivered object, shared");
        assert_eq!(store.working_set().hits, 1);

        // Two readers take the slot, a write replaces it, then both decode what they took,
        // the second read of that write keeping it: a later read must still see the write.
        let take = || store.read().objects.get("a/x").map(Slot::take).unwrap();
        let (first, second) = (take(), take());
        let db = cm("a", "x", "db");
        store.insert_keyed("a/x".into(), db.clone(), None, Arrival::Listed);
        for taken in [first, second] {
            let late = store.resolve(&"a/x".into(), taken, Recent::Keep).unwrap();
            assert_eq!(late, web);
        }
        assert_eq!(
            store.working_set().objects,
            1,
            "the late readers kept their write"
        );
        assert_eq!(store.get_by_key("a/x"), Some(db.clone()));
        assert_eq!(store.get_by_key("a/x"), Some(db));
        store.remove("a/x");
        assert_eq!(store.working_set().objects, 0, "a delete lets go");
    }

    #[test]
    fn a_read_by_key_twice_is_kept_and_lists_keep_nothing() {
        let store = Writer::<ConfigMap>::compact();
        store.insert(cm("a", "x", "web")).unwrap();
        store.insert(cm("a", "y", "web")).unwrap();
        let web: Selector = "app=web".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(store.list_selector(&web).len(), 2);
            assert_eq!(store.by_index(NAMESPACE_INDEX, "a").unwrap().len(), 2);
        }
        assert_eq!(store.working_set().objects, 0, "lists keep nothing");
        let first = store.get_by_key("a/x").unwrap();
        assert_eq!(store.working_set().objects, 0, "nor does a first read");
        let again = store.get_by_key("a/x").unwrap();
        assert!(
            Arc::ptr_eq(&first, &again),
            "a read while the first reader holds the object shares it"
        );
        assert_eq!(store.working_set().objects, 0, "without keeping it");
        drop((first, again));
        let second = store.get_by_key("a/x").unwrap();
        assert_eq!(
            store.working_set().objects,
            1,
            "a second decode of the same write keeps it"
        );
        let third = store.get_by_key("a/x").unwrap();
        assert!(Arc::ptr_eq(&second, &third), "and later reads share it");
        let listed = store.list_selector(&web);
        assert!(
            listed.iter().any(|o| Arc::ptr_eq(o, &third)),
            "lists use what the working set holds"
        );
    }

    /// What a controller that logs labels reads of an object.
    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Labels {
        metadata: LabelsMeta,
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct LabelsMeta {
        name: String,
        #[serde(default)]
        labels: BTreeMap<String, String>,
    }

    fn labels(name: &str, app: &str) -> Labels {
        Labels {
            metadata: LabelsMeta {
                name: name.to_owned(),
                labels: [("app".to_owned(), app.to_owned())].into(),
            },
        }
    }

    #[test]
    fn get_as_reads_a_projection_from_every_kind_of_slot() {
        let wire = Writer::build(Keeping::Compact(Compact {
            codec: Arc::new(NoEncoding),
            // The projection reads the bytes itself and never decodes a whole object.
            wire: Some(|_, _, _| Err("a projection must not decode the whole object".into())),
            working_set: WorkingSet::off(),
        }));
        let packed = Writer::<ConfigMap>::compact();
        let decoded = Writer::<ConfigMap>::new();
        for store in [&wire, &packed, &decoded] {
            store.add_indexer("app", label_index("app")).unwrap();
        }
        let web = cm("a", "x", "web");
        let raw = RawObject::new(serde_json::to_vec(&*web).unwrap().into(), RawFormat::Json);
        wire.insert_keyed("a/x".into(), web.clone(), Some(raw), Arrival::Listed);
        assert!(matches!(
            wire.read().objects.get("a/x"),
            Some(Slot::Encoded(e)) if e.body.wire().is_some()
        ));
        packed.insert(web.clone()).unwrap();
        decoded.insert(web).unwrap();
        for store in [&wire, &packed, &decoded] {
            assert_eq!(
                store.get_as::<Labels>("a/x").unwrap(),
                Some(labels("x", "web"))
            );
            assert_eq!(store.get_as::<Labels>("a/y").unwrap(), None);
            assert_eq!(store.list_as::<Labels>().unwrap(), [labels("x", "web")]);
            assert_eq!(
                store.by_index_as::<Labels>("app", "web").unwrap(),
                [labels("x", "web")]
            );
            assert!(store.by_index_as::<Labels>("app", "db").unwrap().is_empty());
            assert!(matches!(
                store.by_index_as::<Labels>("tier", "web"),
                Err(Error::IndexNotFound(_))
            ));
        }
    }

    #[test]
    fn get_as_a_type_the_object_does_not_fit_is_an_error_naming_both() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct WantsAList {
            data: Vec<String>,
        }
        let store = Writer::<ConfigMap>::new();
        let mut obj = (*cm("a", "x", "web")).clone();
        obj.data = Some([("k".to_owned(), "v".to_owned())].into());
        store.insert(Arc::new(obj)).unwrap();
        let err = store.get_as::<WantsAList>("a/x").unwrap_err();
        assert!(
            matches!(&err, Error::Projection { key, target, .. } if key == "a/x" && target.ends_with("WantsAList")),
            "{err}"
        );
        assert!(matches!(
            store.list_as::<WantsAList>(),
            Err(Error::Projection { .. })
        ));
    }

    #[test]
    fn key_versions_read_the_slots_without_decoding() {
        let store = Writer::build(Keeping::Compact(Compact {
            codec: Arc::new(NoEncoding),
            wire: Some(|_, _, _| Err("decoding is what this must not do".into())),
            working_set: WorkingSet::off(),
        }));
        let mut obj = (*cm("a", "x", "web")).clone();
        obj.metadata.resource_version = Some("7".into());
        let raw = RawObject::new(serde_json::to_vec(&obj).unwrap().into(), RawFormat::Json);
        store.insert_keyed("a/x".into(), Arc::new(obj), Some(raw), Arrival::Listed);
        assert_eq!(store.key_versions(), [("a/x".into(), "7".to_owned())]);
        assert!(
            store.get_by_key("a/x").is_none(),
            "its bytes do not decode here"
        );
    }

    #[test]
    fn an_object_whose_encoding_does_not_decode_is_kept_decoded() {
        let store = Writer::<ConfigMap>::with_codec(Arc::new(Broken), WorkingSet::default());
        store.add_indexer("app", label_index("app")).unwrap();
        let web = cm("a", "x", "web");
        store.insert(web.clone()).unwrap();
        assert_eq!(store.len(), 1);
        assert_eq!(
            store.get_by_key("a/x"),
            Some(web),
            "what len counts, get returns"
        );
        assert_eq!(store.by_index("app", "web").unwrap().len(), 1);
        assert_eq!(store.list().len(), 1);
        store.check_invariants().unwrap();
        store.insert(cm("a", "x", "db")).unwrap();
        assert!(store.index_keys("app", "web").unwrap().is_empty());
        assert_eq!(store.by_index("app", "db").unwrap().len(), 1);
        store.remove("a/x");
        assert!(store.index_keys("app", "db").unwrap().is_empty());
        assert!(store.is_empty());
    }

    #[test]
    fn readers_see_objects_and_indexes_change_together() {
        for store in stores() {
            readers_see_objects_and_indexes_change_together_in(store);
        }
    }

    fn readers_see_objects_and_indexes_change_together_in(writer: Writer<ConfigMap>) {
        writer.add_indexer("app", label_index("app")).unwrap();
        let store = writer.store();
        let stop = Arc::new(AtomicBool::new(false));
        let apps = ["a", "b", "c"];

        let readers: Vec<_> = (0..2)
            .map(|_| {
                let store = store.clone();
                let stop = stop.clone();
                thread::spawn(move || {
                    let mut checks = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for value in apps {
                            for obj in store.by_index("app", value).unwrap() {
                                assert_eq!(
                                    app(&obj),
                                    value,
                                    "index entry points to a stale object"
                                );
                            }
                            let keys = store.index_keys("app", value).unwrap().len();
                            let _ = keys;
                        }
                        if checks.is_multiple_of(16) {
                            store.check_invariants().unwrap();
                        }
                        checks += 1;
                    }
                    checks
                })
            })
            .collect();

        let writer = {
            let store = writer;
            thread::spawn(move || {
                for round in 0..3000usize {
                    let name = format!("o{}", round % 50);
                    let value = apps[round % 3];
                    match round % 7 {
                        0 => {
                            store.remove(format!("ns/{name}"));
                        }
                        6 if round % 500 == 6 => {
                            let batch = (0..40)
                                .map(|i| cm("ns", &format!("o{i}"), apps[i % 3]))
                                .collect();
                            store.replace(batch);
                        }
                        _ => {
                            store.insert(cm("ns", &name, value)).unwrap();
                        }
                    }
                }
            })
        };
        writer.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
        store.check_invariants().unwrap();
        let total: usize = apps
            .iter()
            .map(|a| store.by_index("app", a).unwrap().len())
            .sum();
        assert_eq!(total, store.len());
    }
}
