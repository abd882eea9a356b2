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
use tracing::{error, warn};

mod codec;
mod index;
mod lister;
mod relist;
mod selector;

use crate::{
    error::{BoxError, Error},
    key::ObjectKey,
    list_watch::{RawFormat, RawObject},
};

pub use codec::{Codec, JsonCodec};
use index::{Index, IndexValues, apply_change, compute_values};
pub use index::{IndexFn, NAMESPACE_INDEX, label_index, namespace_index, owner_uid_index};
pub use lister::Lister;
pub(crate) use relist::StoreChange;
pub use selector::{Operator, Requirement, Selector, SelectorError};

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
/// holds each object as bytes, the ones the server sent or an encoding by a [`Codec`], and
/// decodes it on every read: much less memory for some microseconds per object read. A
/// store of decoded objects holds each as the `Arc<K>` it was decoded into: every reader,
/// index and event handler shares it, and nothing is deep-copied after decoding.
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
}

struct Shared<K> {
    state: RwLock<State<K>>,
    /// Serializes writers; holds the index functions (changed only by `add_indexer`).
    writer: Mutex<Vec<IndexFn<K>>>,
    keeping: Keeping<K>,
}

/// How a store keeps its objects.
enum Keeping<K> {
    /// As the shared `Arc<K>` each was decoded into.
    Decoded,
    /// Encoded by `codec`; with `wire`, objects that came with the bytes the server sent
    /// ([`RawObject`]) keep those instead, and `wire` decodes them.
    Encoded {
        codec: Arc<dyn Codec<K>>,
        wire: Option<WireDecoder<K>>,
    },
}

/// Decodes bytes kept as they came from the wire.
type WireDecoder<K> = fn(RawFormat, &[u8]) -> Result<K, BoxError>;

fn decode_wire<K: DeserializeOwned>(format: RawFormat, bytes: &[u8]) -> Result<K, BoxError> {
    format.decode(bytes)
}

struct State<K> {
    objects: HashMap<ObjectKey, Slot<K>, KeyHasher>,
    indexes: Vec<Index>,
}

/// One stored object: shared as decoded, encoded by the store's codec, or as the bytes
/// the server sent (with its resourceVersion beside the bytes, so a relist can tell an
/// unchanged object without decoding it).
enum Slot<K> {
    Object(Arc<K>),
    Packed {
        bytes: Arc<[u8]>,
        version: Option<Arc<str>>,
    },
    Wire {
        bytes: Arc<[u8]>,
        format: RawFormat,
        version: Option<Arc<str>>,
    },
}

impl<K> Clone for Slot<K> {
    fn clone(&self) -> Self {
        match self {
            Slot::Object(o) => Slot::Object(o.clone()),
            Slot::Packed { bytes, version } => Slot::Packed {
                bytes: bytes.clone(),
                version: version.clone(),
            },
            Slot::Wire {
                bytes,
                format,
                version,
            } => Slot::Wire {
                bytes: bytes.clone(),
                format: *format,
                version: version.clone(),
            },
        }
    }
}

impl<K: Resource> Slot<K> {
    /// The stored object's resourceVersion.
    fn version(&self) -> Option<&str> {
        match self {
            Slot::Object(o) => o.meta().resource_version.as_deref(),
            Slot::Packed { version, .. } | Slot::Wire { version, .. } => version.as_deref(),
        }
    }
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
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

    fn writer(&self) -> MutexGuard<'_, Vec<IndexFn<K>>> {
        self.shared
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The slot to keep for `obj`: in a compact store, the bytes it came in if it came
    /// with them (they just decoded), else its encoding, unless that does not decode back.
    /// Checking each encoding once here is what lets every read of a compact store return
    /// what `len` and the indexes count.
    fn pack(&self, key: &ObjectKey, obj: Arc<K>, raw: Option<RawObject>) -> Slot<K>
    where
        K: Resource,
    {
        let Keeping::Encoded { codec, wire } = &self.shared.keeping else {
            return Slot::Object(obj);
        };
        let version = || obj.meta().resource_version.as_deref().map(Arc::from);
        if let (Some(_), Some(raw)) = (wire, raw) {
            return Slot::Wire {
                // Copied out of the buffer it arrived in, which may hold other objects.
                bytes: Arc::from(raw.as_bytes()),
                format: raw.format(),
                version: version(),
            };
        }
        let bytes = match codec.encode(&obj) {
            Ok(bytes) => bytes,
            Err(err) => {
                warn!(%key, %err, "object does not encode; keeping it decoded");
                return Slot::Object(obj);
            }
        };
        if let Err(err) = codec.decode(&bytes) {
            warn!(%key, %err, "object's encoding does not decode; keeping it decoded");
            return Slot::Object(obj);
        }
        Slot::Packed {
            version: version(),
            bytes: bytes.into(),
        }
    }

    /// The object in `slot`; `None` (with an error log) when its bytes do not decode.
    fn unpack(&self, key: &(impl fmt::Display + ?Sized), slot: Slot<K>) -> Option<Arc<K>> {
        let decoded = match (slot, &self.shared.keeping) {
            (Slot::Object(obj), _) => return Some(obj),
            (Slot::Packed { bytes, .. }, Keeping::Encoded { codec, .. }) => codec.decode(&bytes),
            (
                Slot::Wire { bytes, format, .. },
                Keeping::Encoded {
                    wire: Some(wire), ..
                },
            ) => wire(format, &bytes),
            // A store keeps encoded slots only with the decoder for them.
            (Slot::Packed { .. } | Slot::Wire { .. }, _) => Err("no decoder for the slot".into()),
        };
        match decoded {
            Ok(obj) => Some(Arc::new(obj)),
            Err(err) => {
                error!(%key, %err, "stored object does not decode; the codec does not round-trip");
                None
            }
        }
    }

    fn unpack_all(&self, slots: Vec<(ObjectKey, Slot<K>)>) -> Vec<Arc<K>> {
        slots
            .into_iter()
            .filter_map(|(key, slot)| self.unpack(&key, slot))
            .collect()
    }

    /// The object under `key` (`namespace/name`, or `name` for cluster-scoped objects).
    pub fn get_by_key(&self, key: impl AsRef<str>) -> Option<Arc<K>> {
        let key = key.as_ref();
        let slot = self.read().objects.get(key)?.clone();
        self.unpack(key, slot)
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
        let key = key.as_ref();
        let Some(slot) = self.read().objects.get(key).cloned() else {
            return Ok(None);
        };
        self.project(key, slot).map(Some)
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
            .map(|(key, slot)| self.project(key.as_ref(), slot))
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
            .map(|(key, slot)| self.project(key.as_ref(), slot))
            .collect()
    }

    /// The object in `slot` read as `T`: straight from the server's bytes when the slot
    /// holds them, else through the decoded object's JSON.
    fn project<T: DeserializeOwned>(&self, key: &str, slot: Slot<K>) -> Result<T, Error>
    where
        K: Serialize,
    {
        let read = match slot {
            Slot::Wire { bytes, format, .. } => format.decode::<T>(&bytes),
            slot => match self.unpack(key, slot) {
                Some(object) => serde_json::to_value(&*object)
                    .and_then(serde_json::from_value)
                    .map_err(BoxError::from),
                None => Err("the stored object does not decode".into()),
            },
        };
        read.map_err(|source| Error::Projection {
            key: key.to_owned(),
            target: std::any::type_name::<T>(),
            source,
        })
    }

    /// Whether an object is stored under `key`.
    pub fn contains_key(&self, key: impl AsRef<str>) -> bool {
        self.read().objects.contains_key(key.as_ref())
    }

    /// All objects, in no particular order.
    pub fn list(&self) -> Vec<Arc<K>> {
        let slots = self.snapshot();
        self.unpack_all(slots)
    }

    fn snapshot(&self) -> Vec<(ObjectKey, Slot<K>)> {
        self.read()
            .objects
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The objects for which `filter` is true. In a store of shared objects `filter` runs
    /// under the read lock (keep it quick); a compact store decodes and filters after
    /// releasing it.
    pub fn list_filtered(&self, mut filter: impl FnMut(&K) -> bool) -> Vec<Arc<K>> {
        if !self.is_compact() {
            return self
                .read()
                .objects
                .values()
                .filter_map(|slot| match slot {
                    Slot::Object(o) if filter(o) => Some(o.clone()),
                    _ => None,
                })
                .collect();
        }
        let mut objects = self.list();
        objects.retain(|o| filter(o));
        objects
    }

    /// All keys, in no particular order.
    pub fn list_keys(&self) -> Vec<ObjectKey> {
        self.read().objects.keys().cloned().collect()
    }

    /// The key and resourceVersion of every object, at one instant, without decoding any.
    pub(crate) fn key_versions(&self) -> Vec<(ObjectKey, String)>
    where
        K: Resource,
    {
        self.read()
            .objects
            .iter()
            .map(|(key, slot)| (key.clone(), slot.version().unwrap_or_default().to_owned()))
            .collect()
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
        matches!(self.shared.keeping, Keeping::Encoded { .. })
    }

    /// The objects whose index `index` contains `value`.
    ///
    /// # Errors
    ///
    /// [`Error::IndexNotFound`] when no index is named `index`.
    pub fn by_index(&self, index: &str, value: &str) -> Result<Vec<Arc<K>>, Error> {
        let slots = self.index_slots(index, value)?;
        Ok(self.unpack_all(slots))
    }

    /// The slots of the objects whose index `index` contains `value`, taken under the read
    /// lock so that they are decoded after it.
    fn index_slots(&self, index: &str, value: &str) -> Result<Vec<(ObjectKey, Slot<K>)>, Error> {
        let st = self.read();
        let idx = find(&st.indexes, index)?;
        let Some(keys) = idx.get(value) else {
            return Ok(Vec::new());
        };
        let mut slots = Vec::with_capacity(keys.len());
        slots.extend(
            keys.iter()
                .filter_map(|k| Some((k.clone(), st.objects.get(k)?.clone()))),
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

fn find<'a>(indexes: &'a [Index], name: &str) -> Result<&'a Index, Error> {
    indexes
        .iter()
        .find(|i| &*i.name == name)
        .ok_or_else(|| Error::IndexNotFound(name.to_owned()))
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
    /// An empty compact store: objects that come with the bytes the server sent them in
    /// ([`RawObject`]) are kept as those bytes, others as compact JSON ([`JsonCodec`]).
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
    pub fn compact() -> Self {
        Self::build(Keeping::Encoded {
            codec: Arc::new(JsonCodec),
            wire: Some(decode_wire::<K>),
        })
    }
}

impl<K: Resource> Store<K> {
    /// The stored object with the key of `obj`.
    pub fn get(&self, obj: &K) -> Option<Arc<K>> {
        let key = ObjectKey::from_object(obj).ok()?;
        self.get_by_key(key)
    }
}

impl<K: Resource> Writer<K> {
    /// An empty store of shared objects with the built-in `namespace` index.
    pub fn new() -> Self {
        Self::build(Keeping::Decoded)
    }

    /// An empty compact store that keeps every object encoded by `codec` (the bytes the
    /// server sent are not kept).
    pub fn with_codec(codec: Arc<dyn Codec<K>>) -> Self {
        Self::build(Keeping::Encoded { codec, wire: None })
    }

    fn build(keeping: Keeping<K>) -> Self {
        let func = index::namespace_index::<K>();
        let store = Store {
            shared: Arc::new(Shared {
                state: RwLock::new(State {
                    objects: HashMap::default(),
                    indexes: vec![Index::new(NAMESPACE_INDEX)],
                }),
                writer: Mutex::new(vec![func]),
                keeping,
            }),
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
        let mut fns = self.writer();
        if self.read().indexes.iter().any(|i| &*i.name == name) {
            return Err(Error::IndexExists(name.to_owned()));
        }
        let objects = self.snapshot();
        let mut index = Index::new(name);
        for (key, slot) in objects {
            let Some(obj) = self.unpack(&key, slot) else {
                continue;
            };
            let mut values = func(&obj);
            values.sort_unstable();
            values.dedup();
            index.add(&key, &values);
        }
        self.write().indexes.push(index);
        fns.push(func);
        Ok(())
    }

    /// Inserts or replaces the object under its key; returns the previous one.
    ///
    /// # Errors
    ///
    /// [`Error::MissingName`] when the object has no name.
    #[cfg(any(test, feature = "testing"))]
    pub fn insert(&self, obj: Arc<K>) -> Result<Option<Arc<K>>, Error> {
        let key = ObjectKey::from_object(&*obj)?;
        Ok(self.insert_keyed(key, obj, None))
    }

    pub(crate) fn insert_keyed(
        &self,
        key: ObjectKey,
        obj: Arc<K>,
        raw: Option<RawObject>,
    ) -> Option<Arc<K>> {
        let fns = self.writer();
        let old_slot = self.read().objects.get(&key).cloned();
        let had_old = old_slot.is_some();
        let old = old_slot.and_then(|slot| self.unpack(&key, slot));
        let old_values = old.as_deref().map(|o| compute_values(&fns, o));
        let new_values = compute_values(&fns, &obj);
        let slot = self.pack(&key, obj, raw);
        {
            let mut st = self.write();
            if had_old && old.is_none() {
                // Its old index values are unknown: drop the key from every index entry.
                st.indexes.iter_mut().for_each(|i| i.remove_key(&key));
            }
            st.objects.insert(key.clone(), slot);
            apply_change(
                &mut st.indexes,
                &key,
                old_values.as_ref(),
                Some(&new_values),
            );
        }
        old
    }

    /// Removes the object under `key`; returns it.
    pub fn remove(&self, key: impl AsRef<str>) -> Option<Arc<K>> {
        let fns = self.writer();
        let (key, slot) = {
            let st = self.read();
            let (k, v) = st.objects.get_key_value(key.as_ref())?;
            (k.clone(), v.clone())
        };
        let old = self.unpack(&key, slot);
        let old_values: Option<IndexValues> = old.as_deref().map(|o| compute_values(&fns, o));
        let mut st = self.write();
        st.objects.remove(&key);
        match &old_values {
            Some(values) => apply_change(&mut st.indexes, &key, Some(values), None),
            // Its index values are unknown: drop the key from every index entry.
            None => st.indexes.iter_mut().for_each(|i| i.remove_key(&key)),
        }
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
        let fns = self.writer();
        let mut indexes: Vec<Index> = self.read().indexes.iter().map(Index::empty_like).collect();
        let mut map = HashMap::with_capacity_and_hasher(objects.len(), KeyHasher::default());
        for (key, obj) in &objects {
            let values = compute_values(&fns, obj);
            for (index, values) in indexes.iter_mut().zip(&values) {
                index.add(key, values);
            }
            map.insert(key.clone(), self.pack(key, obj.clone(), None));
        }
        let mut st = self.write();
        let old = std::mem::replace(&mut st.objects, map);
        st.indexes = indexes;
        drop(st);
        drop(fns);
        old.into_iter()
            .filter_map(|(key, slot)| {
                let obj = self.unpack(&key, slot)?;
                Some((key, obj))
            })
            .collect()
    }
}

#[cfg(test)]
impl<K: Resource> Store<K> {
    /// Checks that objects and indexes agree; used by tests.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        type Entries = Vec<(String, Vec<ObjectKey>)>;
        type Snapshot<K> = (
            Vec<(ObjectKey, Slot<K>)>,
            Vec<(String, IndexFn<K>, Entries)>,
        );
        // The index functions, in the order of the indexes.
        let fns: Vec<IndexFn<K>> = self.writer().clone();
        // One snapshot of objects and indexes, taken under one read lock.
        let (slots, indexes): Snapshot<K> = {
            let st = self.read();
            let slots = st
                .objects
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
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
        let objects: HashMap<ObjectKey, Arc<K>> = slots
            .into_iter()
            .map(|(k, slot)| {
                let obj = self
                    .unpack(&k, slot)
                    .ok_or(format!("{k} does not decode"))?;
                Ok((k, obj))
            })
            .collect::<Result<_, String>>()?;
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
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_core::ObjectMeta;
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
        let store = Writer::build(Keeping::Encoded {
            codec: Arc::new(NoEncoding),
            wire: Some(decode_wire::<ConfigMap>),
        });
        store.add_indexer("app", label_index("app")).unwrap();
        let web = cm("a", "x", "web");
        // Arrived in a buffer holding more than this object: the store copies its part.
        let buffer =
            bytes::Bytes::from([b"[".as_slice(), &serde_json::to_vec(&*web).unwrap()].concat());
        let raw = RawObject::new(buffer.slice(1..), RawFormat::Json);
        store.insert_keyed("a/x".into(), web.clone(), Some(raw));
        let slot = store.read().objects.get("a/x").cloned();
        assert!(
            matches!(slot, Some(Slot::Wire { .. })),
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
        let old = store.insert_keyed("a/x".into(), db.clone(), None);
        assert_eq!(
            old,
            Some(web),
            "the old object, decoded from the wire's bytes"
        );
        assert!(matches!(
            store.read().objects.get("a/x"),
            Some(Slot::Object(_))
        ));
        assert!(store.index_keys("app", "web").unwrap().is_empty());
        assert_eq!(store.get_by_key("a/x"), Some(db));
        store.check_invariants().unwrap();
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
        let wire = Writer::build(Keeping::Encoded {
            codec: Arc::new(NoEncoding),
            // The projection reads the bytes itself and never decodes a whole object.
            wire: Some(|_, _| Err("a projection must not decode the whole object".into())),
        });
        let packed = Writer::<ConfigMap>::compact();
        let decoded = Writer::<ConfigMap>::new();
        for store in [&wire, &packed, &decoded] {
            store.add_indexer("app", label_index("app")).unwrap();
        }
        let web = cm("a", "x", "web");
        let raw = RawObject::new(serde_json::to_vec(&*web).unwrap().into(), RawFormat::Json);
        wire.insert_keyed("a/x".into(), web.clone(), Some(raw));
        assert!(matches!(
            wire.read().objects.get("a/x"),
            Some(Slot::Wire { .. })
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
        let store = Writer::build(Keeping::Encoded {
            codec: Arc::new(NoEncoding),
            wire: Some(|_, _| Err("decoding is what this must not do".into())),
        });
        let mut obj = (*cm("a", "x", "web")).clone();
        obj.metadata.resource_version = Some("7".into());
        let raw = RawObject::new(serde_json::to_vec(&obj).unwrap().into(), RawFormat::Json);
        store.insert_keyed("a/x".into(), Arc::new(obj), Some(raw));
        assert_eq!(store.key_versions(), [("a/x".into(), "7".to_owned())]);
        assert!(
            store.get_by_key("a/x").is_none(),
            "its bytes do not decode here"
        );
    }

    #[test]
    fn an_object_whose_encoding_does_not_decode_is_kept_decoded() {
        let store = Writer::<ConfigMap>::with_codec(Arc::new(Broken));
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
