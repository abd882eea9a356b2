//! The thread-safe, indexed object cache (client-go's `Indexer` / `threadSafeMap`).
//! The full documentation is on [`Store`].

use std::{
    collections::{HashMap, HashSet},
    fmt,
    ops::Deref,
    sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard},
};

use kube_core::Resource;
use serde::{Serialize, de::DeserializeOwned};

mod index;
mod labels;
mod lister;
#[cfg(test)]
mod property_tests;
mod relist;
mod selector;
mod slot;
mod usage;
mod working_set;

use crate::{
    codec::Codec,
    error::{BoxError, Error},
    key::ObjectKey,
    list_watch::{FieldSetMemo, RawFormat, RawObject},
};

use index::{Index, IndexValues, apply_change, compute_values};
pub use index::{IndexFn, NAMESPACE_INDEX, label_index, namespace_index, owner_uid_index};
use labels::LabelInterner;
pub use lister::Lister;
pub(crate) use relist::StoreChange;
pub use selector::{Operator, Requirement, Selector, SelectorError};
use slot::{Compact, Decoder, Keeping, Packer, Slot, Taken};
pub(crate) use slot::{WireDecoder, decode_wire};
pub(crate) use usage::{Usage, WeakUsage};
use working_set::Hot;
pub use working_set::{WorkingSet, WorkingSetStats};

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
/// use kube_informer::{SharedInformer, strip_managed_fields, testing::FakeListWatch};
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
/// use kube_informer::{label_index, testing::{FakeListWatch, StoreWriter}};
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
/// A [`Store`] is a read-only handle. Its one [`Writer`] belongs to whoever fills the cache
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

    /// The object under `key` (`namespace/name`, or `name` for cluster-scoped objects).
    ///
    /// In a compact store, the object comes from the working set when it is there (a
    /// pointer copy), else it is decoded and kept there (see [`WorkingSet`]).
    pub fn get_by_key(&self, key: impl AsRef<str>) -> Option<Arc<K>> {
        let (key, taken) = {
            let st = self.read();
            let (key, slot) = st.objects.get_key_value(key.as_ref())?;
            (key.clone(), slot.take())
        };
        self.resolve(&key, taken, Recent::Keep)
    }

    /// The object under `key`, read as `T`: a projection that declares only the fields a
    /// caller needs, as serde reads JSON into a struct with fewer fields.
    ///
    /// In a compact store of the server's bytes (an informer's default) only those fields
    /// are decoded, and nothing is allocated for the rest: protobuf fields are skipped
    /// where they lie (their lengths are on the wire), JSON is scanned past.
    /// A controller that reads a Pod's labels pays for the labels, not for the whole Pod
    /// and its `managedFields`. In a store of decoded objects, or one encoded by a
    /// [`Codec`], the object is decoded as `K` and re-read as `T` through its JSON, which
    /// costs more than [`get_by_key`](Self::get_by_key): there, read the shared object.
    ///
    /// `T` sees the object as its JSON, with `apiVersion` and `kind` when the server sent
    /// them (watch events carry them, list items do not).
    ///
    /// ```
    /// use std::{collections::BTreeMap, sync::Arc};
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_informer::testing::{FakeListWatch, StoreWriter};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Labels {
    ///     metadata: Meta,
    /// }
    /// #[derive(serde::Deserialize)]
    /// struct Meta {
    ///     #[serde(default)]
    ///     labels: BTreeMap<String, String>,
    /// }
    ///
    /// let writer = StoreWriter::<ConfigMap>::compact();
    /// let mut cm = FakeListWatch::<ConfigMap>::object(Some("ns"), "a");
    /// cm.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
    /// writer.insert(Arc::new(cm)).unwrap();
    ///
    /// let labels = writer.store().get_as::<Labels>("ns/a").unwrap().unwrap();
    /// assert_eq!(labels.metadata.labels["app"], "web");
    /// assert!(writer.store().get_as::<Labels>("ns/b").unwrap().is_none());
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Projection`] when the object does not read as `T` (a field of `T` that the
    /// object holds in another shape, or a required one it lacks); `Ok(None)` when nothing
    /// is stored under `key`.
    pub fn get_as<T: DeserializeOwned>(&self, key: impl AsRef<str>) -> Result<Option<T>, Error>
    where
        K: Serialize,
    {
        let taken = {
            let st = self.read();
            let Some((key, slot)) = st.objects.get_key_value(key.as_ref()) else {
                return Ok(None);
            };
            (key.clone(), slot.take())
        };
        self.project(taken).map(Some)
    }

    /// Every object, read as `T` (see [`get_as`](Self::get_as)), in no particular order.
    ///
    /// # Errors
    ///
    /// [`Error::Projection`] for the first object that does not read as `T`.
    pub fn list_as<T: DeserializeOwned>(&self) -> Result<Vec<T>, Error>
    where
        K: Serialize,
    {
        self.snapshot()
            .into_iter()
            .map(|taken| self.project(taken))
            .collect()
    }

    /// The objects whose index `index` contains `value`, read as `T` (see
    /// [`get_as`](Self::get_as)).
    ///
    /// # Errors
    ///
    /// [`Error::IndexNotFound`] when no index is named `index`; [`Error::Projection`] for
    /// the first object that does not read as `T`.
    pub fn by_index_as<T: DeserializeOwned>(
        &self,
        index: &str,
        value: &str,
    ) -> Result<Vec<T>, Error>
    where
        K: Serialize,
    {
        self.index_slots(index, value)?
            .into_iter()
            .map(|taken| self.project(taken))
            .collect()
    }

    /// The object of a taken slot read as `T`: straight from the server's bytes when the
    /// slot holds them, else through the decoded object's JSON.
    fn project<T: DeserializeOwned>(&self, (key, taken): (ObjectKey, Taken<K>)) -> Result<T, Error>
    where
        K: Serialize,
    {
        let wire = match &taken {
            Taken::Encoded { body, .. } => body.wire(),
            Taken::Decoded(_) => None,
        };
        let read = match wire {
            Some((format, bytes)) => format.decode::<T>(bytes),
            None => match self.resolve(&key, taken, Recent::Pass) {
                Some(object) => serde_json::to_value(&*object)
                    .and_then(serde_json::from_value)
                    .map_err(BoxError::from),
                None => Err("the stored object does not decode".into()),
            },
        };
        read.map_err(|source| Error::Projection {
            key: key.to_string(),
            target: std::any::type_name::<T>(),
            source,
        })
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

    fn snapshot(&self) -> Vec<(ObjectKey, Taken<K>)> {
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
    /// [`compact`](crate::InformerBuilder::compact) or [`codec`](crate::InformerBuilder::codec)).
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
    fn index_slots(&self, index: &str, value: &str) -> Result<Vec<(ObjectKey, Taken<K>)>, Error> {
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

    /// Every object as the store keeps it, at one instant, for a snapshot, without
    /// decoding any: a caller holding a lock decodes nothing under it.
    pub(crate) fn kept(&self) -> KeptObjects<K> {
        self.read()
            .objects
            .iter()
            .map(|(key, slot)| {
                let kept = match slot {
                    Slot::Decoded(object) => Kept::Object(object.clone()),
                    Slot::Encoded(encoded) => match &encoded.body.decoder {
                        Decoder::Wire(format, _) => Kept::Wire {
                            format: *format,
                            bytes: encoded.body.bytes.clone(),
                            version: encoded.version.clone(),
                            labels: KeptLabels(encoded.labels.clone()),
                        },
                        Decoder::Codec(codec) => {
                            Kept::Encoded(codec.clone(), encoded.body.bytes.clone())
                        }
                    },
                };
                (key.clone(), kept)
            })
            .collect()
    }

    /// The key and resourceVersion of every object, at one instant, without decoding any.
    pub(crate) fn key_versions(&self) -> Vec<(ObjectKey, String)> {
        self.read()
            .objects
            .iter()
            .map(|(key, slot)| (key.clone(), slot.version().unwrap_or_default().to_owned()))
            .collect()
    }
}

fn find<'a>(indexes: &'a [Index], name: &str) -> Result<&'a Index, Error> {
    indexes
        .iter()
        .find(|i| &*i.name == name)
        .ok_or_else(|| Error::IndexNotFound(name.to_owned()))
}

/// Every object of a store as it keeps it, by key (see [`Store::kept`]).
pub(crate) type KeptObjects<K> = Vec<(ObjectKey, Kept<K>)>;

/// An object as its bytes, with what a compact store reads without decoding it: how a
/// warm restart's snapshot hands its objects over (see [`Writer::insert_encoded`]).
pub(crate) struct EncodedObject {
    pub(crate) key: ObjectKey,
    pub(crate) format: RawFormat,
    /// In an allocation of their own, as the store keeps them.
    pub(crate) bytes: Arc<[u8]>,
    pub(crate) version: Option<Arc<str>>,
    pub(crate) labels: LabelRun,
}

/// The labels of the objects of a part of a warm restart, every key and value in one text:
/// reading them back costs no allocation per object, and neither does dropping them
/// (which the store's thread does, not the reader's).
#[derive(Debug, Default)]
pub(crate) struct LabelText {
    text: String,
    /// Where each key ends in `text`, and its value.
    ends: Vec<(usize, usize)>,
}

impl LabelText {
    /// Adds label `key` with `value`.
    pub(crate) fn push(&mut self, key: &str, value: &str) {
        self.text.push_str(key);
        let key_end = self.text.len();
        self.text.push_str(value);
        self.ends.push((key_end, self.text.len()));
    }

    /// How many labels it holds.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }
}

/// One object's labels: a run of a [`LabelText`] shared by a part's objects.
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelRun {
    text: Arc<LabelText>,
    labels: std::ops::Range<usize>,
}

impl LabelRun {
    /// Labels `labels` of `text`.
    pub(crate) fn new(text: Arc<LabelText>, labels: std::ops::Range<usize>) -> Self {
        Self { text, labels }
    }

    /// The `key=value` pairs, in the order they were added.
    pub(crate) fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        let text = &*self.text;
        self.labels.clone().map(move |at| {
            let start = match at {
                0 => 0,
                _ => text.ends[at - 1].1,
            };
            let (key_end, value_end) = text.ends[at];
            (&text.text[start..key_end], &text.text[key_end..value_end])
        })
    }
}

impl<'a> FromIterator<(&'a str, &'a str)> for LabelRun {
    fn from_iter<I: IntoIterator<Item = (&'a str, &'a str)>>(pairs: I) -> Self {
        let mut text = LabelText::default();
        for (key, value) in pairs {
            text.push(key, value);
        }
        let labels = 0..text.len();
        Self::new(Arc::new(text), labels)
    }
}

/// One object as a store keeps it (see [`Store::kept`]).
pub(crate) enum Kept<K> {
    /// The bytes the server sent, in their format, with the object's resourceVersion and
    /// labels as the store read them.
    Wire {
        format: RawFormat,
        bytes: Arc<[u8]>,
        version: Option<Arc<str>>,
        labels: KeptLabels,
    },
    /// The bytes of the store's own codec.
    Encoded(Arc<dyn Codec<K>>, Arc<[u8]>),
    /// The object.
    Object(Arc<K>),
}

/// The labels of an object kept as bytes (see [`Kept::Wire`]).
pub(crate) struct KeptLabels(labels::Labels);

impl KeptLabels {
    /// The `key=value` pairs, sorted by key.
    pub(crate) fn pairs(&self) -> impl ExactSizeIterator<Item = (&str, &str)> {
        self.0.pairs()
    }
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

/// The one handle that writes a [`Store`] (see the consistency guarantee there).
///
/// It reads too (it dereferences to its [`Store`]). Not `Clone`: a store has one writer,
/// which keeps every write of an informer's cache in its event processor.
pub struct Writer<K> {
    store: Store<K>,
    /// The full list being written, if any (see [`Writer::start_list`]).
    list: Mutex<relist::ListProgress<K>>,
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

    fn build(keeping: Keeping<K>) -> Self {
        let working_set = match &keeping {
            Keeping::Decoded => WorkingSet::off(),
            Keeping::Compact(compact) => compact.working_set,
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
    fn packer<'a>(&'a self, writer: &'a mut WriterState<K>) -> Packer<'a, K> {
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

    /// Whether [`insert_encoded`](Self::insert_encoded) can store objects: this store keeps
    /// the server's bytes and has no index of its own.
    pub(crate) fn takes_encoded(&self) -> bool {
        self.encoded_decoder(&self.writer()).is_some()
    }

    /// The decoder of the server's bytes, if this store keeps them and has no index but the
    /// built-in namespace one (always the first), whose values the keys hold.
    fn encoded_decoder(&self, writer: &WriterState<K>) -> Option<WireDecoder<K>> {
        match &self.shared.keeping {
            Keeping::Compact(Compact {
                wire: Some(decode), ..
            }) if writer.index_fns.len() <= 1 => Some(*decode),
            _ => None,
        }
    }

    /// Stores `objects` as their bytes, without decoding them, when this store can: one
    /// that keeps the server's bytes and has no index but the built-in namespace one
    /// (whose values the keys hold). Returns those it did not store (all of them when it
    /// cannot; any whose key it holds already), to be decoded and stored as any other.
    pub(crate) fn insert_encoded(&self, objects: Vec<EncodedObject>) -> Vec<EncodedObject> {
        let mut writer = self.writer();
        let Some(decode) = self.encoded_decoder(&writer) else {
            return objects;
        };
        let mut st = self.write();
        let mut left = Vec::new();
        st.objects.reserve(objects.len());
        let State {
            objects: stored,
            indexes,
            labels: interner,
        } = &mut *st;
        for object in objects {
            if stored.contains_key(&object.key) {
                left.push(object);
                continue;
            }
            writer.generation += 1;
            let EncodedObject {
                key,
                format,
                bytes,
                version,
                labels,
            } = object;
            if let Some(namespace) = key.namespace() {
                indexes[0].add_one(&key, namespace);
            }
            let slot = Slot::Encoded(slot::Encoded {
                body: slot::Body {
                    bytes,
                    decoder: Decoder::Wire(format, decode),
                },
                version,
                labels: interner.intern_pairs(labels.pairs()),
                generation: writer.generation,
            });
            stored.insert(key, slot);
        }
        left
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
        let old: Vec<(ObjectKey, Taken<K>)> = old
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
    use crate::list_watch::RawFormat;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_core::ObjectMeta;
    use slot::decode_wire;
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
        let second = store.get_by_key("a/x").unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(store.working_set().objects, 1, "a second read does");
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
