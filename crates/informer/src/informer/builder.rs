//! [`InformerBuilder`]: an informer's options, and the wiring of reflector, processor and
//! store that [`build`](InformerBuilder::build) does.

use std::{sync::Arc, time::Duration};

use futures::FutureExt;
use kube_core::Resource;
use serde::{Serialize, de::DeserializeOwned};
use tokio::sync::{Notify, watch};
use tracing::warn;

use super::{
    HandleParts, InformerHandle, Reshard, SharedInformer, SnapshotWriter,
    divergence::{Divergence, DivergenceCheck},
    processor::{Processor, Sink},
    staleness::Staleness,
};

/// The shortest resync period an informer accepts (client-go's `minimumResyncPeriod`).
pub const MIN_RESYNC_PERIOD: Duration = Duration::from_secs(1);
use crate::{
    codec::Codec,
    error::Error,
    list_watch::{ListWatch, Shard},
    reflector::{
        BackoffConfig, ErrorHook, ListMode, ReadSnapshot, Reflector, ReflectorConfig,
        ReflectorCounters, ShardCell, SyncedVersion, WarmRestart, WriteSnapshot, read_snapshot,
        snapshot_selection, write_snapshot,
    },
    store::{IndexFn, TransformFn, WorkingSet, Writer},
};

/// Options of a [`SharedInformer`]; from [`SharedInformer::builder`].
pub struct InformerBuilder<K, L> {
    list_watch: L,
    config: ReflectorConfig,
    resync: Option<Duration>,
    transform: Option<TransformFn<K>>,
    indexers: Vec<(String, IndexFn<K>)>,
    error_hook: Option<ErrorHook>,
    storage: Storage<K>,
    working_set: WorkingSet,
    divergence: Option<Divergence>,
    staleness: Option<Staleness>,
    warm_restart: Option<WarmRestartParts<K>>,
}

/// A warm restart, with the snapshot's reader and writer for `K` (taken where `K`'s serde
/// bounds are known).
struct WarmRestartParts<K> {
    warm: WarmRestart,
    read: ReadSnapshot<K>,
    write: WriteSnapshot<K>,
}

/// How the informer's store keeps objects.
enum Storage<K> {
    /// Compact, the default: as the bytes the server sent, else compact JSON
    /// (`Writer::compact_with`, taken where `K`'s serde bounds are known).
    Compact(fn(WorkingSet) -> Writer<K>),
    /// As the decoded, shared `Arc<K>`s.
    Decoded,
    /// Every object encoded by a codec of the user's.
    Codec(Arc<dyn Codec<K>>),
}

impl<K: Resource + Serialize + DeserializeOwned + 'static> Storage<K> {
    fn compact() -> Self {
        Storage::Compact(Writer::compact_with)
    }
}

impl<K: Resource> Storage<K> {
    fn writer(self, working_set: WorkingSet) -> Writer<K> {
        match self {
            Storage::Compact(compact) => compact(working_set),
            Storage::Decoded => Writer::new(),
            Storage::Codec(codec) => Writer::with_codec(codec, working_set),
        }
    }
}

impl<K, L> InformerBuilder<K, L>
where
    K: Resource + Serialize + DeserializeOwned + Send + Sync + 'static,
    L: ListWatch<K>,
{
    /// Keeps a snapshot of the cache at `warm.path()`, written when the informer stops (and
    /// every [`WarmRestart::every`]), and starts from it: the watch resumes from the
    /// snapshot's resourceVersion instead of a full list, and the informer syncs once that
    /// watch has caught up with the server. A snapshot that is missing, corrupt, of another
    /// format or selection, or too old for the server's history, gives an ordinary full
    /// list. See [`WarmRestart`] for what is kept and how catching up is known.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use k8s_openapi::api::core::v1::Pod;
    /// use kube_informer::{SharedInformer, reflector::WarmRestart};
    ///
    /// # fn doc(client: kube_client::Client) {
    /// let pods: kube_client::Api<Pod> = kube_client::Api::all(client);
    /// let informer = SharedInformer::builder(pods)
    ///     .warm_restart(WarmRestart::at("/var/cache/my-controller/pods.snapshot").every(Duration::from_secs(300)))
    ///     .build();
    /// # }
    /// ```
    #[must_use]
    pub fn warm_restart(mut self, warm: WarmRestart) -> Self {
        self.warm_restart = Some(WarmRestartParts {
            warm,
            read: read_snapshot::<K>,
            write: write_snapshot::<K>,
        });
        self
    }

    /// Default options over `list_watch`.
    pub(super) fn new(list_watch: L) -> Self {
        Self {
            list_watch,
            config: ReflectorConfig::default(),
            resync: None,
            transform: None,
            indexers: Vec::new(),
            error_hook: None,
            storage: Storage::compact(),
            working_set: WorkingSet::default(),
            divergence: None,
            staleness: None,
            warm_restart: None,
        }
    }

    /// Keep the cache compact: the default. Each object is kept as the bytes the API
    /// server sent it in (protobuf for built-in kinds), or, when it came without them
    /// (a transformed object, a JSON watch event, a `ListWatch` of your own), as compact
    /// JSON ([`JsonCodec`](crate::codec::JsonCodec)).
    ///
    /// Objects take a fraction of the memory this way (see
    /// [BENCHMARKS.md](https://github.com/kube-informer/kube-informer/blob/main/BENCHMARKS.md)),
    /// and syncing costs nothing more: the bytes were read anyway. Event handlers get the
    /// objects as decoded from the watch, and those objects stay decoded in the store's
    /// [`working_set`](Self::working_set) for the reads that follow them. Other reads
    /// decode, some microseconds per Pod, and hand out a fresh `Arc`; selector and
    /// namespace lists decode only what they return. Programs that read the whole cache
    /// often and can spare the memory choose [`decoded`](Self::decoded).
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_informer::{SharedInformer, testing::FakeListWatch};
    ///
    /// let informer = SharedInformer::builder(FakeListWatch::<ConfigMap>::new("configmaps"))
    ///     .decoded()
    ///     .compact()
    ///     .build();
    /// assert!(informer.store().is_compact());
    /// ```
    #[must_use]
    pub fn compact(mut self) -> Self {
        self.storage = Storage::compact();
        self
    }
}

impl<K, L> InformerBuilder<K, L>
where
    K: Resource + Send + Sync + 'static,
    L: ListWatch<K>,
{
    /// Keep each object decoded, as the `Arc<K>` that readers and handlers share: reads
    /// cost nothing but the `Arc`'s count, and a `Pod` takes several times the memory of
    /// its bytes (`k8s-openapi` types inline every optional field, and `managedFields`
    /// decode into trees of maps).
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_informer::{SharedInformer, testing::FakeListWatch};
    ///
    /// let informer = SharedInformer::builder(FakeListWatch::<ConfigMap>::new("configmaps"))
    ///     .decoded()
    ///     .build();
    /// assert!(!informer.store().is_compact());
    /// ```
    #[must_use]
    pub fn decoded(mut self) -> Self {
        self.storage = Storage::Decoded;
        self
    }

    /// Re-deliver every cached object as `on_update(obj, obj, Delivery::Resync)` this often to each handler
    /// added without a period of its own (off by default; zero turns it off; see
    /// [`InformerHandle::add_handler_with_resync`](crate::InformerHandle::add_handler_with_resync)). Periods under [`MIN_RESYNC_PERIOD`](crate::informer::MIN_RESYNC_PERIOD) are
    /// raised to it, as client-go does, so a typo cannot turn the informer into a busy loop.
    #[must_use]
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync = Some(period).filter(|p| !p.is_zero()).map(|p| {
            if p < MIN_RESYNC_PERIOD {
                warn!(requested = ?p, minimum = ?MIN_RESYNC_PERIOD, "resync period raised to the minimum");
            }
            p.max(MIN_RESYNC_PERIOD)
        });
        self
    }

    /// Transforms every object before it is stored, e.g. [`strip_managed_fields`](crate::store::strip_managed_fields).
    #[must_use]
    pub fn transform(mut self, f: impl Fn(K) -> K + Send + Sync + 'static) -> Self {
        self.transform = Some(Arc::new(f));
        self
    }

    /// Adds an index. A name already in use (including `namespace`) is ignored with a warning.
    #[must_use]
    pub fn indexer(
        mut self,
        name: &str,
        f: impl Fn(&K) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        self.indexers.push((name.to_owned(), Arc::new(f)));
        self
    }

    /// Adds an index from a ready [`IndexFn`] (e.g. [`label_index`](crate::store::label_index)).
    #[must_use]
    pub fn index_fn(mut self, name: &str, f: IndexFn<K>) -> Self {
        self.indexers.push((name.to_owned(), f));
        self
    }

    /// Objects per list page (500).
    #[must_use]
    pub fn page_size(mut self, size: u32) -> Self {
        self.config.page_size = size;
        self
    }

    /// Lower bound of the random server-side watch timeout (5 min; the upper bound is twice it).
    #[must_use]
    pub fn min_watch_timeout(mut self, timeout: Duration) -> Self {
        self.config.min_watch_timeout = timeout;
        self
    }

    /// Reconnect a watch silent for this long (2 min).
    #[must_use]
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.config.idle_timeout = timeout;
        self
    }

    /// Backoff between failed list/watch attempts.
    #[must_use]
    pub fn backoff(mut self, backoff: BackoffConfig) -> Self {
        self.config.backoff = backoff;
        self
    }

    /// Fetch the full state by streaming lists (`sendInitialEvents`), the default; see
    /// [`ListMode::Streaming`].
    #[must_use]
    pub fn streaming_list(mut self) -> Self {
        self.config.list_mode = ListMode::Streaming;
        self
    }

    /// Caches only `shard`'s objects (see [`ReflectorConfig::shard`]): selected by the
    /// server where it has the `ShardedListAndWatch` gate, else by the informer with the
    /// same hash; [`InformerHandle::reflector_stats`](crate::InformerHandle::reflector_stats)
    /// says which.
    #[must_use]
    pub fn shard(mut self, shard: Shard) -> Self {
        self.config = self.config.shard(shard);
        self
    }

    /// Fetch the full state by paged `LIST` calls instead of streaming lists; see
    /// [`ListMode::Paged`].
    #[must_use]
    pub fn paged_list(mut self) -> Self {
        self.config.list_mode = ListMode::Paged;
        self
    }

    /// Keep every object in `codec`'s encoding (a compact [`Store`](crate::Store)), for
    /// another format than the default [`compact`](Self::compact) one (compression, say):
    /// each object is encoded, and its encoding checked to decode, as it is stored; the
    /// bytes the server sent are not kept.
    #[must_use]
    pub fn codec(mut self, codec: Arc<dyn Codec<K>>) -> Self {
        self.storage = Storage::Codec(codec);
        self
    }

    /// The decoded working set of a compact store: how much of it stays decoded, for the
    /// reads a reconcile makes of the objects just delivered and those it reads again. The default is
    /// [`WorkingSet::default`] (1 MiB); [`WorkingSet::off`] makes every read decode. A store
    /// of [`decoded`](Self::decoded) objects has no working set.
    #[must_use]
    pub fn working_set(mut self, working_set: WorkingSet) -> Self {
        self.working_set = working_set;
        self
    }

    /// Checks the cache against the server as `check` says: a list of keys and
    /// resourceVersions (metadata only, paged) at exactly the version the cache holds, so
    /// that events in flight never look like drift. A drift is logged naming the objects,
    /// counted ([`InformerHandle::divergence_stats`](crate::InformerHandle::divergence_stats)),
    /// and, with [`Repair::Relist`](crate::informer::Repair::Relist), repaired by a relist from a
    /// consistent read. [`InformerHandle::check_divergence`](crate::InformerHandle::check_divergence)
    /// runs one check on demand.
    ///
    /// The cache's version advances with every event and bookmark, so a lost change shows
    /// at the first check after the next event or bookmark (servers send one about once a
    /// minute). No informer of client-go, controller-runtime or kube-runtime has such a
    /// check: their caches can drift silently (a lost event on a proxy, a stale watch
    /// cache behind a load balancer) until the next relist, if one ever comes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_informer::{informer::DivergenceCheck, informer::Repair, SharedInformer, testing::FakeListWatch};
    ///
    /// let informer = SharedInformer::builder(FakeListWatch::<ConfigMap>::new("configmaps"))
    ///     .divergence_check(DivergenceCheck::every(Duration::from_secs(600)).repair(Repair::Relist))
    ///     .build();
    /// ```
    #[must_use]
    pub fn divergence_check(mut self, check: DivergenceCheck) -> Self
    where
        L: Clone,
    {
        let trigger = Arc::new(Notify::new());
        self.divergence = Some(Divergence::new(check, self.list_watch.clone(), trigger));
        self
    }

    /// Measures how far the cache is behind the server, every `period`: a consistent read of
    /// the server's current resourceVersion (a metadata list of at most one object), then
    /// the time until the cache has passed it.
    /// [`InformerHandle::staleness`](crate::InformerHandle::staleness) reads it, and a
    /// [`Manager`](crate::Manager) serves it (`informer_staleness_seconds`, the histogram
    /// `informer_staleness_measured_seconds`). While the watch is stalled or the server
    /// cannot be read, the oldest unpassed probe's age grows; once the cache catches up it
    /// drops to zero.
    ///
    /// The cache's version moves with the resource's changes and with bookmarks, which
    /// servers send about once a minute: a resource that rarely changes reads as behind for
    /// up to that long after each probe, though nothing was missed. Off by default: each
    /// informer's probe is one request per period.
    ///
    /// ```
    /// use std::time::Duration;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_informer::{SharedInformer, testing::FakeListWatch};
    ///
    /// let informer = SharedInformer::builder(FakeListWatch::<ConfigMap>::new("configmaps"))
    ///     .staleness_probe(Duration::from_secs(10))
    ///     .build();
    /// assert!(informer.handle().staleness().is_some());
    /// ```
    #[must_use]
    pub fn staleness_probe(mut self, period: Duration) -> Self
    where
        L: Clone,
    {
        self.staleness = Some(Staleness::new(period, self.list_watch.clone()));
        self
    }

    /// Calls `hook` with every list/watch error (client-go's `SetWatchErrorHandler`).
    #[must_use]
    pub fn on_watch_error(mut self, hook: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        self.error_hook = Some(Arc::new(hook));
        self
    }

    /// Builds the informer; it does nothing until [`spawn`](SharedInformer::spawn) or
    /// [`run`](SharedInformer::run).
    pub fn build(mut self) -> SharedInformer<K> {
        if let Some(divergence) = &mut self.divergence {
            divergence.set_shard(self.config.shard.clone());
        }
        let store = self.storage.writer(self.working_set);
        for (name, f) in self.indexers {
            if let Err(e) = store.add_indexer(&name, f) {
                warn!(error = %e, "indexer ignored");
            }
        }
        let (synced_tx, synced_rx) = watch::channel(false);
        let (permanent_tx, permanent_rx) = watch::channel(None);
        let permanent_tx = Arc::new(permanent_tx);
        let processor = Arc::new(Processor::new(store, synced_tx, permanent_tx.clone()));
        let version = SyncedVersion::default();
        let stats = ReflectorCounters::default();
        let sharded = self.config.shard.is_some();
        let snapshot = self.warm_restart.map(|parts| {
            let selection = snapshot_selection::<K>(
                &self.list_watch.resource(),
                self.list_watch.namespace().as_deref(),
                &self.list_watch.selectors(),
                &format!("{:?}", self.config.shard),
            );
            (parts, selection)
        });
        let mut reflector = Reflector::new(self.list_watch, Sink(processor.clone()), self.config)
            .with_synced_version(version.clone())
            .with_stats(stats.clone());
        if let Some(t) = self.transform {
            reflector = reflector.transform(move |object| t(object));
        }
        let relist = match &self.divergence {
            Some(divergence) => divergence.relist.clone(),
            None => Arc::new(Notify::new()),
        };
        reflector = reflector.relist_on(relist.clone());
        // Only an informer built with a shard lists the way a shard needs.
        let reshard = match sharded {
            true => {
                let cell = ShardCell::default();
                reflector = reflector.with_shard_cell(cell.clone());
                Some(Reshard { cell, relist })
            }
            false => None,
        };
        if let Some((parts, selection)) = &snapshot {
            let (path, selection, read) =
                (parts.warm.path().to_owned(), selection.clone(), parts.read);
            reflector = reflector.with_restore(Box::new(move |decode, deliver| {
                read(&path, &selection, decode, deliver)
            }));
        }
        let snapshot = snapshot.map(|(parts, selection)| {
            SnapshotWriter::new(parts.warm, selection, parts.write, processor.clone())
        });
        let user_hook = self.error_hook;
        reflector = reflector.on_watch_error(move |error: &Error| {
            if let Some(permanent) = error.permanent_copy() {
                permanent_tx.send_replace(Some(Arc::new(permanent)));
            }
            if let Some(hook) = &user_hook {
                hook(error);
            }
        });
        let handle = InformerHandle::new(HandleParts {
            processor,
            synced: synced_rx,
            permanent_error: permanent_rx,
            version,
            stats,
            resync: self.resync,
            divergence: self.divergence.map(Arc::new),
            staleness: self.staleness.map(Arc::new),
            reshard,
            snapshot,
        });
        SharedInformer::new_unstarted(handle, Box::new(move |token| reflector.run(token).boxed()))
    }
}
