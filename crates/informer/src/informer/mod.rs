//! The shared informer: one reflector, one indexed store, many event handlers (client-go's
//! `SharedIndexInformer`).
//! The full documentation is on [`SharedInformer`].

mod builder;
mod divergence;
mod factory;
mod handler;
mod health;
mod latency;
mod listener;
#[cfg(feature = "manager")]
pub(crate) mod metrics;
mod processor;
mod registration;
mod staleness;
mod sync;

use std::{
    fmt,
    future::Future,
    ops::Deref,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::BoxFuture;
use kube_core::Resource;
use serde::{Serialize, de::DeserializeOwned};
use tokio::{
    runtime::Handle,
    sync::{Notify, watch},
    task::JoinHandle,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{debug, info, warn};

use crate::{
    error::Error,
    list_watch::{ListWatch, Shard},
    reflector::{
        ReflectorCounters, ReflectorStats, ShardCell, Synced, SyncedVersion, WarmRestart,
        WriteSnapshot,
    },
    store::{Lister, Store, Usage},
};
use processor::{Processor, lock};

pub use builder::{InformerBuilder, MIN_RESYNC_PERIOD};
use divergence::Divergence;
pub use divergence::{DivergenceCheck, DivergenceStats, Drift, OutdatedObject, Repair};
pub use factory::{
    FactoryDefaults, FactoryScope, InformerFactory, InformerStatus, Scope, TypedResource,
};
pub use handler::{
    DeletedFinalStateUnknown, DeletedObject, Delivery, EventHandler, HandlerFn, handler_fn,
};
pub use health::InformerHealth;
pub use latency::ProcessingStats;
pub use listener::{
    HANDLER_BACKLOG_WARNING, HANDLER_COALESCE_AFTER, HandlerRegistration, HandlerStats,
};
use staleness::Staleness;
pub use staleness::StalenessStats;
pub use sync::{HasSynced, wait_for_cache_sync};

/// An informer that has not run yet: a reflector, an indexed store and any number of event
/// handlers for one resource.
///
/// Start it with [`spawn`](Self::spawn) or [`run`](Self::run); share it before or after
/// with [`handle`](Self::handle). Dereferences to its [`InformerHandle`].
///
/// The shared informer: one reflector, one indexed store, many event handlers (client-go's
/// `SharedIndexInformer`).
///
/// The reflector writes through the informer's event processor, which, under one mutex,
/// updates the [`Store`] and appends notifications to every handler's buffer. So each
/// handler sees events in store order, and a handler reading the store from a callback sees
/// at least the state of the event it was given.
///
/// * The **first list** fills the store as it arrives, each object an add
///   delivered as [`Delivery::InitialList`]; once it is complete, the informer is synced.
/// * **Every later list** (after a 410 Gone, a failed watch, a repair) is applied
///   **atomically**, as client-go's is since 1.36: while it arrives the store keeps the
///   previous state (only the objects that changed are staged); at its end, one write
///   swaps it in, and only then are its events sent, in this order: first the deletes of
///   objects it no longer holds, each carrying a tombstone
///   ([`DeletedObject::FinalStateUnknown`](crate::DeletedObject)); then the adds (new
///   objects) and updates (a different resourceVersion), in the order the server listed
///   them. Unchanged objects (same resourceVersion) emit nothing. A reader never sees two
///   lists mixed, a handler called for any of these events reads the whole new list from
///   the store, and a relist that fails part-way changes nothing.
/// * Each handler has its own unbounded buffer and task (see [`EventHandler`]); a handler
///   added after the first list first receives the cached objects as initial adds.
/// * An optional resync period re-delivers every cached object as
///   `on_update(obj, obj, Delivery::Resync)`.
///
/// # Lifecycle, in types
///
/// [`SharedInformer`] is the informer before it runs: the one value that can start it, with
/// [`spawn`](SharedInformer::spawn) (which gives a [`RunningInformer`], stopped by
/// [`stop`](RunningInformer::stop)) or [`run`](SharedInformer::run). Both consume it, so an
/// informer runs once. Everything else goes through an [`InformerHandle`], a cheap clone
/// that any number of controllers share: the store, the sync state, adding handlers (an
/// error once the informer has stopped). Both `SharedInformer` and `RunningInformer`
/// dereference to their handle.
///
/// ```
/// use std::time::Duration;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{SharedInformer, handler_fn, testing::FakeListWatch, wait_for_cache_sync};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), kube_informer::Error> {
/// let fake = FakeListWatch::<ConfigMap>::new("configmaps");
/// fake.add(FakeListWatch::<ConfigMap>::object(Some("default"), "a"));
///
/// let informer = SharedInformer::builder(fake.clone())
///     .indexer("by-name", |cm: &ConfigMap| cm.metadata.name.iter().cloned().collect())
///     .build();
/// let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
/// let registration = informer.add_handler(handler_fn().on_add(move |cm: &std::sync::Arc<ConfigMap>, _| {
///     let _ = tx.send(cm.metadata.name.clone());
/// }))?;
///
/// let informer = informer.spawn(CancellationToken::new());
/// wait_for_cache_sync(&[&informer, &registration], Duration::from_secs(10)).await.unwrap();
/// assert_eq!(rx.recv().await.unwrap().as_deref(), Some("a"));
/// assert_eq!(informer.store().by_index("by-name", "a").unwrap().len(), 1);
/// informer.stop().await;
/// # Ok(()) }
/// ```
pub struct SharedInformer<K> {
    handle: InformerHandle<K>,
    starter: Starter,
}

/// A shared handle on an informer: its cache, its sync state, its handlers. Cheap to clone.
///
/// Valid in every state of the informer: before it runs (handlers wait for it), while it
/// runs, and after it stopped (its store keeps the last state; new handlers are refused).
pub struct InformerHandle<K> {
    inner: Arc<Inner<K>>,
    /// For a handle a factory handed out: its share in the informer's use, passed on to the
    /// stores and handlers it gives.
    usage: Option<Usage>,
}

/// A running informer, from [`SharedInformer::spawn`]. Dereferences to its
/// [`InformerHandle`].
///
/// [`stop`](Self::stop) stops it and waits for every task it started. Dropping it stops it
/// too, without waiting.
#[must_use = "dropping a RunningInformer stops the informer"]
pub struct RunningInformer<K> {
    handle: InformerHandle<K>,
    token: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl<K> Clone for InformerHandle<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            usage: self.usage.clone(),
        }
    }
}

impl<K> InformerHandle<K> {
    /// This handle, counted as a use of the informer (see [`InformerFactory`]).
    pub(crate) fn in_use(&self, usage: Usage) -> Self {
        Self {
            inner: self.inner.clone(),
            usage: Some(usage),
        }
    }
}

struct Inner<K> {
    processor: Arc<Processor<K>>,
    synced: watch::Receiver<bool>,
    /// The latest list/watch error that retrying cannot fix (see [`Error::permanent_copy`]).
    permanent_error: watch::Receiver<Option<Arc<Error>>>,
    version: SyncedVersion,
    stats: ReflectorCounters,
    lifecycle: Mutex<Lifecycle>,
    resync: Option<Duration>,
    divergence: Option<Arc<Divergence>>,
    staleness: Option<Arc<Staleness>>,
    reshard: Option<Reshard>,
    snapshot: Option<SnapshotWriter<K>>,
}

/// What the builder hands a new handle.
struct HandleParts<K> {
    processor: Arc<Processor<K>>,
    synced: watch::Receiver<bool>,
    permanent_error: watch::Receiver<Option<Arc<Error>>>,
    version: SyncedVersion,
    stats: ReflectorCounters,
    resync: Option<Duration>,
    divergence: Option<Arc<Divergence>>,
    staleness: Option<Arc<Staleness>>,
    reshard: Option<Reshard>,
    snapshot: Option<SnapshotWriter<K>>,
}

/// Writes a warm restart's snapshot of the cache.
struct SnapshotWriter<K> {
    warm: WarmRestart,
    selection: String,
    write: WriteSnapshot<K>,
    processor: Arc<Processor<K>>,
}

impl<K> Clone for SnapshotWriter<K> {
    fn clone(&self) -> Self {
        Self {
            warm: self.warm.clone(),
            selection: self.selection.clone(),
            write: self.write,
            processor: self.processor.clone(),
        }
    }
}

impl<K: Resource + Send + Sync + 'static> SnapshotWriter<K> {
    fn new(
        warm: WarmRestart,
        selection: String,
        write: WriteSnapshot<K>,
        processor: Arc<Processor<K>>,
    ) -> Self {
        Self {
            warm,
            selection,
            write,
            processor,
        }
    }

    /// Writes the snapshot now, on a blocking thread: its size, or `None` while a full list
    /// is being applied (the cache is then no state of the server's).
    async fn write(&self) -> Result<Option<usize>, Error> {
        let this = self.clone();
        let path = self.warm.path().to_owned();
        tokio::task::spawn_blocking(move || {
            let Some((version, objects)) = this.processor.kept() else {
                return Ok(None);
            };
            (this.write)(this.warm.path(), &this.selection, &version, &objects)
                .map(Some)
                .map_err(|source| Error::Snapshot {
                    path: this.warm.path().to_owned(),
                    source,
                })
        })
        .await
        .unwrap_or_else(|join| {
            Err(Error::Snapshot {
                path,
                source: std::io::Error::other(join.to_string()),
            })
        })
    }

    /// Writes it, and logs how that went.
    async fn write_logged(&self, when: &'static str) {
        let started = tokio::time::Instant::now();
        match self.write().await {
            Ok(Some(bytes)) => info!(
                path = %self.warm.path().display(),
                bytes,
                elapsed_ms = started.elapsed().as_millis() as u64,
                when,
                "wrote the cache's snapshot for a warm restart"
            ),
            Ok(None) => debug!(when, "no snapshot written: a full list was being applied"),
            Err(error) => warn!(%error, when, "the cache's snapshot was not written"),
        }
    }
}

/// What changes a sharded informer's shard: the reflector's cell, and the trigger that
/// makes it relist.
struct Reshard {
    cell: ShardCell,
    relist: Arc<Notify>,
}

type Starter = Box<dyn FnOnce(CancellationToken) -> BoxFuture<'static, ()> + Send + Sync>;

/// Where the informer's tasks run; what `add_handler` does with a new handler's task.
enum Lifecycle {
    /// Not started: handler tasks wait to be spawned by the run.
    NotStarted {
        pending: Vec<BoxFuture<'static, ()>>,
    },
    /// Running: handler tasks are spawned at once.
    Running {
        handle: Handle,
        tracker: TaskTracker,
        token: CancellationToken,
    },
    /// Stopped: no task runs any more.
    Stopped,
}

impl<K: Resource + Serialize + DeserializeOwned + Send + Sync + 'static> SharedInformer<K> {
    /// An informer with default options over `list_watch` (an `Api<K>`, an
    /// [`ApiListWatch`](crate::list_watch::ApiListWatch), a `testing::FakeListWatch`, ...).
    pub fn new<L: ListWatch<K>>(list_watch: L) -> Self {
        Self::builder(list_watch).build()
    }

    /// Starts configuring an informer over `list_watch`.
    pub fn builder<L: ListWatch<K>>(list_watch: L) -> InformerBuilder<K, L> {
        InformerBuilder::new(list_watch)
    }
}

impl<K: Resource + Send + Sync + 'static> SharedInformer<K> {
    fn new_unstarted(handle: InformerHandle<K>, starter: Starter) -> Self {
        Self { handle, starter }
    }

    /// A shared handle on this informer, valid after it starts and stops.
    pub fn handle(&self) -> InformerHandle<K> {
        self.handle.clone()
    }

    /// Starts the informer on the current tokio runtime; it runs until `cancel` fires or the
    /// returned [`RunningInformer`] is stopped or dropped.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn spawn(self, cancel: CancellationToken) -> RunningInformer<K> {
        let token = cancel.child_token();
        let handle = self.handle.clone();
        let task = tokio::spawn(self.run(token.clone()));
        RunningInformer {
            handle,
            token,
            task: Some(task),
        }
    }

    /// The informer's run future: lists, watches and dispatches until `cancel` fires, then
    /// stops every task it started (reflector, handler tasks, resync timer) and returns.
    /// The future is `'static`; dropping it also stops everything. Prefer
    /// [`spawn`](Self::spawn), which keeps a handle to stop and await it.
    pub fn run(self, cancel: CancellationToken) -> impl Future<Output = ()> + Send + 'static {
        let Self { handle, starter } = self;
        let inner = handle.inner;
        async move {
            let token = cancel.child_token();
            let _stop_on_drop = token.clone().drop_guard();
            // However the run ends (returned or dropped), waits on the version end with it.
            let _version_final = StopVersionOnDrop(inner.version.clone());
            let tracker = TaskTracker::new();
            {
                let mut lifecycle = lock(&inner.lifecycle);
                let previous = std::mem::replace(
                    &mut *lifecycle,
                    Lifecycle::Running {
                        handle: Handle::current(),
                        tracker: tracker.clone(),
                        token: token.clone(),
                    },
                );
                if let Lifecycle::NotStarted { pending } = previous {
                    for task in pending {
                        tracker.spawn(until_cancelled(task, token.clone()));
                    }
                }
            }
            {
                // Sleeps until the next handler's resync is due, or a handler with a
                // period is added; costs nothing while no handler has one.
                let processor = inner.processor.clone();
                let token = token.clone();
                tracker.spawn(async move {
                    loop {
                        let now = tokio::time::Instant::now();
                        let due = processor.resync_due(now);
                        let wake = due.unwrap_or(now + Duration::from_secs(3600));
                        tokio::select! {
                            biased;
                            () = token.cancelled() => break,
                            () = processor.resync_changed.notified() => {}
                            () = tokio::time::sleep_until(wake) => {}
                        }
                    }
                });
            }
            if let Some(divergence) = inner.divergence.clone()
                && let Some(period) = divergence.check.interval()
            {
                let processor = inner.processor.clone();
                tracker.spawn(every(period, token.clone(), move || {
                    let (divergence, processor) = (divergence.clone(), processor.clone());
                    async move {
                        if let Err(error) = divergence.run_once(&processor).await {
                            warn!(%error, "divergence check failed; next one at the next interval");
                        }
                    }
                }));
            }
            if let Some(staleness) = inner.staleness.clone() {
                let (version, token) = (inner.version.clone(), token.clone());
                tracker.spawn(async move { staleness.run(version, token).await });
            }
            if let Some(snapshot) = inner.snapshot.clone()
                && let Some(interval) = snapshot.warm.interval()
            {
                let synced = inner.synced.clone();
                tracker.spawn(every(interval, token.clone(), move || {
                    let (snapshot, synced) = (snapshot.clone(), *synced.borrow());
                    async move {
                        if synced {
                            snapshot.write_logged("periodic").await;
                        }
                    }
                }));
            }
            tracker.spawn(starter(token.clone()));
            token.cancelled().await;
            *lock(&inner.lifecycle) = Lifecycle::Stopped;
            tracker.close();
            tracker.wait().await;
            // Every task has stopped: the cache is the state at its version, and stays so.
            if let Some(snapshot) = &inner.snapshot {
                snapshot.write_logged("stop").await;
            }
            debug!("informer stopped");
        }
    }
}

/// Marks the synced version final when the run that moves it ends.
struct StopVersionOnDrop(SyncedVersion);

impl Drop for StopVersionOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

impl<K> Deref for SharedInformer<K> {
    type Target = InformerHandle<K>;

    fn deref(&self) -> &InformerHandle<K> {
        &self.handle
    }
}

impl<K> RunningInformer<K> {
    /// A shared handle on this informer.
    pub fn handle(&self) -> InformerHandle<K> {
        self.handle.clone()
    }

    /// Stops the informer and waits until every task it started has ended.
    ///
    /// # Panics
    ///
    /// Re-raises a panic of the informer's run task.
    pub async fn stop(mut self) {
        self.token.cancel();
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
            && error.is_panic()
        {
            std::panic::resume_unwind(error.into_panic());
        }
    }
}

impl<K> Drop for RunningInformer<K> {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

impl<K> Deref for RunningInformer<K> {
    type Target = InformerHandle<K>;

    fn deref(&self) -> &InformerHandle<K> {
        &self.handle
    }
}

impl<K: Resource + Send + Sync + 'static> InformerHandle<K> {
    fn new(parts: HandleParts<K>) -> Self {
        let HandleParts {
            processor,
            synced,
            permanent_error,
            version,
            stats,
            resync,
            divergence,
            staleness,
            reshard,
            snapshot,
        } = parts;
        Self {
            inner: Arc::new(Inner {
                processor,
                synced,
                permanent_error,
                version,
                stats,
                lifecycle: Mutex::new(Lifecycle::NotStarted {
                    pending: Vec::new(),
                }),
                resync,
                divergence,
                staleness,
                reshard,
                snapshot,
            }),
            usage: None,
        }
    }

    /// The informer's cache, read-only. From a factory's handle, the store counts as a use
    /// of the informer for as long as it or a clone of it is held (see
    /// [`InformerFactory`]).
    pub fn store(&self) -> Store<K> {
        self.inner
            .processor
            .store
            .store()
            .in_use(self.usage.clone())
    }

    /// A typed lister over the cache.
    pub fn lister(&self) -> Lister<K> {
        Lister::new(self.store())
    }

    /// Adds an index to the informer's store, indexing the cached objects; safe while it
    /// runs.
    ///
    /// # Errors
    ///
    /// [`Error::IndexExists`] when the name is taken.
    pub fn add_indexer(
        &self,
        name: &str,
        f: impl Fn(&K) -> Vec<String> + Send + Sync + 'static,
    ) -> Result<(), Error> {
        self.inner.processor.add_indexer(name, Arc::new(f))
    }

    /// Writes the [warm restart](crate::reflector::WarmRestart)'s snapshot of the cache now
    /// (it is also written when the informer stops). Returns its size in bytes, or `None`
    /// when the cache is no state of the server's (a full list is being applied).
    ///
    /// # Errors
    ///
    /// [`Error::NoWarmRestart`] for an informer built without one; [`Error::Snapshot`]
    /// when the file cannot be written.
    pub async fn write_snapshot(&self) -> Result<Option<usize>, Error> {
        match &self.inner.snapshot {
            Some(snapshot) => snapshot.write().await,
            None => Err(Error::NoWarmRestart),
        }
    }

    /// What the informer is doing: syncing, synced, or without its resource (see
    /// [`InformerHealth`]).
    pub fn health(&self) -> InformerHealth {
        InformerHealth::of(self.has_synced(), self.inner.stats.resource_missing_since())
    }

    /// True once the first full list is in the store.
    pub fn has_synced(&self) -> bool {
        *self.inner.synced.borrow()
    }

    /// Waits until [`has_synced`](Self::has_synced).
    pub async fn wait_synced(&self) {
        let mut rx = self.inner.synced.clone();
        // The sender lives in `self`, so this cannot fail.
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Waits until [`has_synced`](Self::has_synced), or fails as soon as a list or watch
    /// error arrives that retrying cannot fix (see [`Error::permanent_copy`]), whichever comes
    /// first. Meant for start-up, where waiting forever on missing RBAC permissions or a
    /// missing CRD would look like a hang.
    ///
    /// # Errors
    ///
    /// The permanent error, e.g. [`Error::Forbidden`] naming the resource, verb and namespace.
    pub async fn wait_synced_or_fatal(&self) -> Result<(), Error> {
        let mut errors = self.inner.permanent_error.clone();
        // An error from before this call counts too (a complete list clears it).
        errors.mark_changed();
        tokio::select! {
            biased;
            () = self.wait_synced() => Ok(()),
            Ok(error) = errors.wait_for(Option::is_some) => {
                let error = error.as_ref().and_then(|e| e.permanent_copy());
                Err(error.expect("wait_for returned a permanent error"))
            }
        }
    }

    /// Compares the cache with the server now (see
    /// [`InformerBuilder::divergence_check`]); `Ok(None)` when the check was skipped (a full
    /// list was being applied, or the version had been compacted away). A drift is also
    /// logged, counted and repaired as configured.
    ///
    /// # Errors
    ///
    /// [`Error::NoDivergenceCheck`] when the informer was built without one; the list's
    /// error when it fails.
    pub async fn check_divergence(&self) -> Result<Option<Drift>, Error> {
        let divergence = self
            .inner
            .divergence
            .as_ref()
            .ok_or(Error::NoDivergenceCheck)?;
        divergence.run_once(&self.inner.processor).await
    }

    /// How far the cache is behind the server, as its
    /// [staleness probe](crate::informer::InformerBuilder::staleness_probe) measures it;
    /// `None` for an informer built without one.
    pub fn staleness(&self) -> Option<StalenessStats> {
        Some(self.inner.staleness.as_ref()?.stats())
    }

    /// The counters of the divergence checks, if the informer has one.
    pub fn divergence_stats(&self) -> Option<DivergenceStats> {
        Some(self.inner.divergence.as_ref()?.stats.snapshot())
    }

    /// The resourceVersion the cache last synced to (list, event or bookmark).
    pub fn last_sync_resource_version(&self) -> Option<String> {
        self.inner.version.get()
    }

    /// The synced version's changes, for waits on it; it reads `stopped` once the informer
    /// has stopped.
    pub(crate) fn watch_synced_version(&self) -> tokio::sync::watch::Receiver<Synced> {
        self.inner.version.subscribe()
    }

    /// Follows `shard` from now on, in place of the shard it was built with: the informer
    /// relists from a consistent read with the new selector, and the relist's changes reach
    /// the handlers as any relist's do. Objects that left the shard are deleted (as
    /// tombstones, [`DeletedObject::FinalStateUnknown`](crate::DeletedObject)), objects that
    /// entered it are added, and those in both send nothing. Until the relist lands,
    /// watched objects are already kept or dropped by the new shard.
    ///
    /// # Errors
    ///
    /// [`Error::NotSharded`] for an informer built without a shard.
    pub fn reshard(&self, shard: Shard) -> Result<(), Error> {
        let reshard = self.inner.reshard.as_ref().ok_or(Error::NotSharded)?;
        if reshard.cell.get().as_ref() == Some(&shard) {
            return Ok(());
        }
        info!(selector = %shard, "shard changed; relisting");
        reshard.cell.set(shard);
        reshard.relist.notify_one();
        Ok(())
    }

    /// The shard the informer follows, if it was built with one.
    pub fn shard(&self) -> Option<Shard> {
        self.inner.reshard.as_ref()?.cell.get()
    }

    /// Relists a sharded informer from a consistent read, as a reshard does, so its
    /// cache passes the server's current version even where no event comes; `false` for
    /// an informer built without a shard.
    pub(crate) fn relist(&self) -> bool {
        match &self.inner.reshard {
            Some(reshard) => {
                reshard.relist.notify_one();
                true
            }
            None => false,
        }
    }

    /// The cell holding the shard the informer follows, for a reader that must not hold
    /// the informer in use (a handler on it).
    pub(crate) fn shard_cell(&self) -> Option<ShardCell> {
        Some(self.inner.reshard.as_ref()?.cell.clone())
    }

    /// The counters of the informer's reflector: lists, watches, restarts, errors.
    pub fn reflector_stats(&self) -> ReflectorStats {
        self.inner.stats.snapshot()
    }
}

/// Runs `tick` every `period`, the first time one period from now, until `token` fires.
/// A tick that overruns delays the next rather than bunching them.
async fn every<F, Fut>(period: Duration, token: CancellationToken, mut tick: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = token.cancelled() => break,
            _ = ticks.tick() => tick().await,
        }
    }
}

async fn until_cancelled(task: BoxFuture<'static, ()>, token: CancellationToken) {
    tokio::select! {
        biased;
        () = token.cancelled() => {}
        () = task => {}
    }
}

impl<K: Resource + Send + Sync + 'static> HasSynced for InformerHandle<K> {
    fn has_synced(&self) -> bool {
        InformerHandle::has_synced(self)
    }

    fn synced_receiver(&self) -> watch::Receiver<bool> {
        self.inner.synced.clone()
    }
}

impl<K: Resource + Send + Sync + 'static> HasSynced for SharedInformer<K> {
    fn has_synced(&self) -> bool {
        self.handle.has_synced()
    }

    fn synced_receiver(&self) -> watch::Receiver<bool> {
        self.handle.synced_receiver()
    }
}

impl<K: Resource + Send + Sync + 'static> HasSynced for RunningInformer<K> {
    fn has_synced(&self) -> bool {
        self.handle.has_synced()
    }

    fn synced_receiver(&self) -> watch::Receiver<bool> {
        self.handle.synced_receiver()
    }
}

impl<K> fmt::Debug for InformerHandle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InformerHandle")
            .field("store", &*self.inner.processor.store)
            .field("synced", &*self.inner.synced.borrow())
            .finish()
    }
}

impl<K> fmt::Debug for SharedInformer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedInformer").field(&self.handle).finish()
    }
}

impl<K> fmt::Debug for RunningInformer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RunningInformer")
            .field(&self.handle)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    use crate::{
        error::Verb,
        store::{label_index, strip_managed_fields},
        testing::{FakeListWatch, gone},
    };
    use k8s_openapi::api::core::v1::ConfigMap;
    use tokio::sync::mpsc::{self, UnboundedReceiver};

    type Fake = FakeListWatch<ConfigMap>;

    #[derive(Debug, PartialEq)]
    enum Ev {
        Add(String, bool),
        Update(String, String, String),
        Delete(String, bool),
    }

    fn cm(name: &str) -> ConfigMap {
        Fake::object(Some("ns"), name)
    }

    fn name(o: &ConfigMap) -> String {
        o.metadata.name.clone().unwrap_or_default()
    }

    fn rv(o: &ConfigMap) -> String {
        o.metadata.resource_version.clone().unwrap_or_default()
    }

    fn recorder(
        informer: &InformerHandle<ConfigMap>,
    ) -> (HandlerRegistration, UnboundedReceiver<Ev>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (t1, t2, t3) = (tx.clone(), tx.clone(), tx);
        let reg = informer.add_handler(
            handler_fn()
                .on_add(move |o, delivery| {
                    let _ = t1.send(Ev::Add(name(o), delivery == Delivery::InitialList));
                })
                .on_update(move |old, new, _| {
                    let _ = t2.send(Ev::Update(name(new), rv(old), rv(new)));
                })
                .on_delete(move |d| {
                    let _ = t3.send(Ev::Delete(name(d.object()), d.is_final_state_unknown()));
                }),
        );
        (reg.expect("the informer has not stopped"), rx)
    }

    async fn take(rx: &mut UnboundedReceiver<Ev>, n: usize) -> Vec<Ev> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(rx.recv().await.expect("handler channel open"));
        }
        out
    }

    fn sorted(mut v: Vec<Ev>) -> Vec<Ev> {
        v.sort_by_key(|e| format!("{e:?}"));
        v
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stuck_handler_s_lag_rises_and_falls_and_no_other_handler_waits() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        const EVENTS: usize = 2_000;
        let fake = Fake::new("configmaps");
        let informer = SharedInformer::builder(fake.clone()).build();
        let fast_seen = Arc::new(AtomicUsize::new(0));
        let seen = fast_seen.clone();
        let fast = informer
            .handle()
            .add_named_handler(
                "fast",
                handler_fn().on_add(move |_: &Arc<ConfigMap>, _| {
                    seen.fetch_add(1, Ordering::Relaxed);
                }),
            )
            .unwrap();
        // The slow handler blocks its task on its first event until released.
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = Mutex::new(Some(released));
        let slow = informer
            .handle()
            .add_named_handler(
                "slow",
                handler_fn().on_add(move |_: &Arc<ConfigMap>, _| {
                    if let Some(wait) = lock(&released).take() {
                        // Off the runtime's worker, as a handler that blocks must be: a
                        // worker blocked outright also holds the tasks queued behind it.
                        tokio::task::block_in_place(|| {
                            let _ = wait.recv();
                        });
                    }
                }),
            )
            .unwrap();
        let informer = informer.spawn(CancellationToken::new());
        informer.wait_synced().await;
        for i in 0..EVENTS {
            fake.add(cm(&format!("cm-{i}")));
        }
        // The fast handler gets every event while the slow one is stuck on its first.
        tokio::time::timeout(Duration::from_secs(30), async {
            while fast_seen.load(Ordering::Relaxed) < EVENTS {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the fast handler is not held back");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let stuck = slow.stats();
        assert_eq!(stuck.name, "slow");
        assert!(stuck.waiting >= EVENTS as u64, "{stuck:?}");
        assert!(
            stuck.oldest_waiting >= Duration::from_millis(20),
            "{stuck:?}"
        );
        assert_eq!(fast.stats().waiting, 0);
        let names: Vec<String> = informer
            .handler_stats()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["fast", "slow"]);

        release.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(30), async {
            while slow.stats().waiting > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the slow handler catches up");
        let caught_up = slow.stats();
        assert_eq!(caught_up.oldest_waiting, Duration::ZERO);
        assert!(caught_up.delivered >= EVENTS as u64);
        assert!(
            caught_up.processing_total >= Duration::from_millis(20),
            "{caught_up:?}"
        );
        let in_buckets = caught_up.processing_buckets.last().map_or(0, |b| b.1);
        assert_eq!(in_buckets, caught_up.delivered, "every event in a bucket");
        informer.stop().await;
    }

    /// The warnings logged on this thread, by message.
    #[derive(Clone, Default)]
    struct Warnings(Arc<Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if *event.metadata().level() == tracing::Level::WARN {
                let mut message = String::new();
                event.record(
                    &mut |field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
                        if field.name() == "message" {
                            message = format!("{value:?}");
                        }
                    },
                );
                lock(&self.0).push(message);
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_resource_gone_is_said_once_retried_at_the_backoff_s_pace_and_resumed() {
        use tracing_subscriber::layer::SubscriberExt;
        let warnings = Warnings::default();
        let _logs =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
        let fake = Fake::new("widgets.example.dev");
        fake.add(cm("a"));
        let informer = SharedInformer::builder(fake.clone()).build();
        let (_reg, mut rx) = recorder(&informer);
        let informer = informer.spawn(CancellationToken::new());
        informer.wait_synced().await;
        assert_eq!(rx.recv().await, Some(Ev::Add("a".into(), true)));
        assert_eq!(informer.health(), InformerHealth::Synced);

        // The CRD deleted: its objects first, then the resource.
        fake.delete(Some("ns"), "a");
        assert_eq!(rx.recv().await, Some(Ev::Delete("a".into(), false)));
        fake.set_resource_missing(true);
        let before = fake.calls();
        tokio::time::sleep(Duration::from_secs(600)).await;
        let since = match informer.health() {
            InformerHealth::ResourceMissing { since } => since,
            other => panic!("expected the resource missing, got {other:?}"),
        };
        let calls = fake.calls();
        let attempts = calls.lists + calls.watches - before.lists - before.watches;
        // The default backoff: from 0.8 s, doubling, to 30 s, each up to 25% shorter.
        assert!(
            (10..=45).contains(&attempts),
            "{attempts} lists and watches in 10 minutes"
        );
        let said: Vec<String> = lock(&warnings.0).clone();
        let missing = said.iter().filter(|m| m.contains("does not serve")).count();
        assert_eq!(missing, 1, "said once: {said:?}");
        assert_eq!(said.len(), 1, "and nothing else: {said:?}");
        assert!(informer.has_synced() && informer.store().is_empty());
        assert_eq!(informer.health(), InformerHealth::ResourceMissing { since });

        // The CRD back, with a new object: the informer resumes by itself.
        fake.set_resource_missing(false);
        fake.add(cm("b"));
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(informer.health(), InformerHealth::Synced);
        assert_eq!(rx.recv().await, Some(Ev::Add("b".into(), false)));
        assert_eq!(informer.store().len(), 1);
        informer.stop().await;
    }

    fn names(store: &Store<ConfigMap>) -> Vec<(String, String)> {
        let mut objects: Vec<(String, String)> = store.iter().map(|o| (name(&o), rv(&o))).collect();
        objects.sort();
        objects
    }

    fn fake_state(fake: &Fake, names: &[&str]) -> Vec<(String, String)> {
        let mut objects: Vec<(String, String)> = names
            .iter()
            .filter_map(|n| fake.get(&format!("ns/{n}")))
            .map(|o| (name(&o), rv(&o)))
            .collect();
        objects.sort();
        objects
    }

    /// Runs an informer over `fake` with a warm restart at `path` until synced, then stops
    /// it (which writes the snapshot).
    async fn run_and_stop(fake: &Fake, path: &std::path::Path) {
        let informer = SharedInformer::builder(fake.clone())
            .warm_restart(crate::reflector::WarmRestart::at(path))
            .build()
            .spawn(CancellationToken::new());
        informer.wait_synced().await;
        informer.stop().await;
        assert!(path.exists(), "the snapshot is written at stop");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "readable by its owner only");
        }
    }

    /// A fake server holding ConfigMaps `names`, and the snapshot of an informer run over it
    /// until synced, then stopped (in the directory returned with it).
    async fn snapshot_of(names: &[&str]) -> (tempfile::TempDir, std::path::PathBuf, Fake) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("configmaps.snapshot");
        let fake = Fake::new("configmaps");
        for n in names {
            fake.add(cm(n));
        }
        run_and_stop(&fake, &path).await;
        (dir, path, fake)
    }

    #[tokio::test(start_paused = true)]
    async fn a_warm_restart_resumes_the_watch_and_syncs_once_caught_up() {
        let (_dir, path, fake) = snapshot_of(&["a", "b", "c"]).await;
        let before = fake.calls();

        // Changes while it was down.
        let mut a = fake.get("ns/a").unwrap();
        a.data = Some([("k".to_owned(), "v".to_owned())].into());
        fake.update(a);
        fake.delete(Some("ns"), "b");
        fake.add(cm("d"));

        // The consistent read of the current version fails: only a bookmark can say the
        // watch has caught up.
        fake.fail_next_list(gone("configmaps", Verb::List));
        let informer = SharedInformer::builder(fake.clone())
            .warm_restart(crate::reflector::WarmRestart::at(&path))
            .build();
        let (_reg, mut rx) = recorder(&informer);
        let informer = informer.spawn(CancellationToken::new());
        // The snapshot's objects reach the handler once, as the initial list's, and the
        // changes it missed follow from the resumed watch.
        let mut seen = Vec::new();
        while seen.len() < 6 {
            seen.push(rx.recv().await.unwrap());
        }
        let mut restored: Vec<String> = seen[..3]
            .iter()
            .map(|ev| match ev {
                Ev::Add(n, true) => n.clone(),
                other => panic!("expected an initial add, got {other:?}"),
            })
            .collect();
        restored.sort();
        assert_eq!(restored, ["a", "b", "c"]);
        assert!(
            matches!(&seen[3], Ev::Update(n, _, _) if n == "a"),
            "{seen:?}"
        );
        assert_eq!(
            seen[4..],
            [Ev::Delete("b".into(), false), Ev::Add("d".into(), true)]
        );
        // Caught up only at a bookmark: until then the informer says it has not synced.
        assert!(!informer.has_synced());
        fake.bookmark();
        informer.wait_synced().await;
        assert_eq!(
            informer.reflector_stats().warm_restart_caught_up,
            Some(crate::reflector::CatchUp::Bookmark)
        );
        assert_eq!(
            names(&informer.store()),
            fake_state(&fake, &["a", "b", "c", "d"])
        );
        let calls = fake.calls();
        assert_eq!(calls.lists, before.lists + 1, "the consistent read only");
        assert_eq!(fake.list_requests().last().unwrap().limit, Some(1));
        let resumed = fake.watch_requests().last().cloned().unwrap();
        assert!(!resumed.send_initial_events, "no streaming list either");
        assert_eq!(resumed.timeout, Some(Duration::from_secs(3)));
        informer.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_warm_restart_has_caught_up_once_it_saw_the_consistent_read_s_version() {
        let (_dir, path, fake) = snapshot_of(&["a"]).await;
        fake.add(cm("b"));
        let informer = SharedInformer::builder(fake.clone())
            .warm_restart(crate::reflector::WarmRestart::at(&path))
            .build()
            .spawn(CancellationToken::new());
        // No bookmark: the replayed add of b is at the version the consistent read says is
        // the current one.
        informer.wait_synced().await;
        assert_eq!(
            informer.reflector_stats().warm_restart_caught_up,
            Some(crate::reflector::CatchUp::Version)
        );
        assert_eq!(names(&informer.store()), fake_state(&fake, &["a", "b"]));
        assert!(fake.list_requests().iter().all(|l| l.limit == Some(1)));
        informer.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_warm_restart_hands_handlers_that_take_keys_the_keys_and_decodes_nothing() {
        let (_dir, path, fake) = snapshot_of(&["a", "b", "c"]).await;
        fake.add(cm("d"));

        // A handler that takes keys (a controller's, or `add_key_handler`): the snapshot's
        // objects reach it as keys; the one the resumed watch brings, as an object.
        let restart = |fake: &Fake| {
            SharedInformer::builder(fake.clone())
                .warm_restart(crate::reflector::WarmRestart::at(&path))
                .build()
        };
        let informer = restart(&fake);
        let mut seen = keys_and_adds(&informer);
        let informer = informer.spawn(CancellationToken::new());
        informer.wait_synced().await;
        let got = sorted_strings(&mut seen, 4).await;
        assert_eq!(got, ["add d", "key ns/a", "key ns/b", "key ns/c"]);
        // The store reads them back: by key, and whole.
        assert_eq!(
            names(&informer.store()),
            fake_state(&fake, &["a", "b", "c", "d"])
        );
        informer.stop().await;

        // Beside a handler that needs objects, both get every object decoded.
        let informer = restart(&fake);
        let mut seen = keys_and_adds(&informer);
        let (_reg, mut objects) = recorder(&informer);
        let informer = informer.spawn(CancellationToken::new());
        informer.wait_synced().await;
        let got = sorted_strings(&mut seen, 4).await;
        assert_eq!(got, ["add a", "add b", "add c", "add d"]);
        let adds = take(&mut objects, 4).await;
        assert!(
            adds.iter().all(|ev| matches!(ev, Ev::Add(_, true))),
            "{adds:?}"
        );
        informer.stop().await;
    }

    /// A handler that takes the initial list's objects by key, as a controller's does: it
    /// says `key <key>` for those and `add <name>` for an object added.
    fn keys_and_adds(informer: &InformerHandle<ConfigMap>) -> UnboundedReceiver<String> {
        let (tx, rx) = mpsc::unbounded_channel();
        let added = tx.clone();
        informer
            .add_named_keyed_handler(
                "keys",
                handler_fn().on_add(move |o: &Arc<ConfigMap>, _| {
                    let _ = added.send(format!("add {}", name(o)));
                }),
                move |key| {
                    let _ = tx.send(format!("key {key}"));
                },
            )
            .unwrap();
        rx
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_hands_handlers_that_take_keys_its_objects_by_key() {
        let fake = Fake::new("configmaps");
        for n in ["a", "b", "c"] {
            fake.add(cm(n));
        }
        let informer = SharedInformer::builder(fake.clone()).build();
        let mut seen = keys_and_adds(&informer);
        let (_reg, mut objects) = recorder(&informer);
        let informer = informer.spawn(CancellationToken::new());
        informer.wait_synced().await;
        let got = sorted_strings(&mut seen, 3).await;
        assert_eq!(got, ["key ns/a", "key ns/b", "key ns/c"]);
        let adds = take(&mut objects, 3).await;
        assert!(
            adds.iter().all(|ev| matches!(ev, Ev::Add(_, true))),
            "a handler that needs objects beside it gets them: {adds:?}"
        );
        fake.add(cm("d"));
        assert_eq!(
            sorted_strings(&mut seen, 1).await,
            ["add d"],
            "live adds carry objects"
        );
        informer.stop().await;
    }

    /// The next `n` strings of `rx`, sorted.
    async fn sorted_strings(rx: &mut UnboundedReceiver<String>, n: usize) -> Vec<String> {
        let mut got = Vec::new();
        for _ in 0..n {
            got.push(rx.recv().await.expect("handler channel open"));
        }
        got.sort();
        got
    }

    #[tokio::test(start_paused = true)]
    async fn a_cache_kept_by_a_codec_restarts_warm_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("configmaps.snapshot");
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        let warm = || {
            SharedInformer::builder(fake.clone())
                .codec(Arc::new(crate::codec::JsonCodec))
                .warm_restart(crate::reflector::WarmRestart::at(&path))
                .build()
                .spawn(CancellationToken::new())
        };
        let informer = warm();
        informer.wait_synced().await;
        informer.stop().await;
        let informer = warm();
        informer.wait_synced().await;
        assert_eq!(names(&informer.store()), fake_state(&fake, &["a"]));
        let streamed = fake
            .watch_requests()
            .iter()
            .filter(|w| w.send_initial_events)
            .count();
        assert_eq!(streamed, 1, "the cold start's list only");
        assert!(
            fake.list_requests().iter().all(|l| l.limit == Some(1)),
            "no paged list either"
        );
        informer.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_snapshot_too_old_corrupt_or_of_another_selection_gives_a_full_list() {
        // The snapshot is of a and b.
        let (_dir, path, fake) = snapshot_of(&["a", "b"]).await;
        let restart = |fake: &Fake, path: &std::path::Path| {
            SharedInformer::builder(fake.clone())
                .warm_restart(crate::reflector::WarmRestart::at(path))
                .build()
                .spawn(CancellationToken::new())
        };
        // Full lists: streaming ones, and paged ones (not the consistent read of one object).
        let relists = |fake: &Fake| {
            fake.watch_requests()
                .iter()
                .filter(|w| w.send_initial_events)
                .count()
                + fake
                    .list_requests()
                    .iter()
                    .filter(|l| l.limit != Some(1))
                    .count()
        };

        let relists_to_the_server_s_state = async |fake: &Fake| {
            let full = relists(fake);
            let informer = restart(fake, &path);
            informer.wait_synced().await;
            assert_eq!(relists(fake), full + 1);
            assert_eq!(names(&informer.store()), fake_state(fake, &["a", "b", "c"]));
            informer.stop().await;
        };

        // Past the server's history (410): a full list replaces the snapshot.
        fake.delete(Some("ns"), "a");
        fake.add(cm("c"));
        fake.compact();
        relists_to_the_server_s_state(&fake).await;

        // Corrupt: one byte changed.
        let mut bytes = std::fs::read(&path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x55;
        std::fs::write(&path, &bytes).unwrap();
        relists_to_the_server_s_state(&fake).await;

        // Of another selection: another resource's informer at the same path.
        let other = Fake::new("otherconfigmaps");
        other.add(cm("x"));
        let informer = restart(&other, &path);
        informer.wait_synced().await;
        assert_eq!(names(&informer.store()), fake_state(&other, &["x"]));
        assert_eq!(relists(&other), 1);
        informer.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn initial_list_then_watch_events() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        fake.add(cm("b"));
        let informer = SharedInformer::builder(fake.clone()).paged_list().build();
        let (reg, mut rx) = recorder(&informer);
        assert!(!informer.has_synced() && !reg.has_synced());
        let informer = informer.spawn(CancellationToken::new());
        wait_for_cache_sync(&[&informer, &reg], Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(
            sorted(take(&mut rx, 2).await),
            [Ev::Add("a".into(), true), Ev::Add("b".into(), true)]
        );
        fake.wait_for_calls(|c| c.watches == 1).await;
        let old_rv = rv(&fake.get("ns/a").unwrap());
        let new_rv = fake.update(cm("a"));
        fake.delete(Some("ns"), "b");
        fake.add(cm("c"));
        assert_eq!(
            take(&mut rx, 3).await,
            [
                Ev::Update("a".into(), old_rv, new_rv.clone()),
                Ev::Delete("b".into(), false),
                Ev::Add("c".into(), false),
            ]
        );
        assert_eq!(informer.store().len(), 2);
        assert_eq!(
            informer.last_sync_resource_version(),
            Some(fake.resource_version())
        );
        informer.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_sharded_informer_keeps_its_shard_from_a_server_that_ignores_it() {
        use crate::list_watch::{HashRange, Shard, ShardField, ShardMode};
        // Spread like the server's random UIDs (FNV-1a's top bit barely moves when only
        // the last character of a short string does).
        let uid = |i: usize| format!("{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let with_uid = |i: usize| {
            let mut obj = cm(&format!("o{i}"));
            obj.metadata.uid = Some(uid(i));
            obj
        };
        let shard = Shard::new(ShardField::Uid, [HashRange::part(0, 2).unwrap()]).unwrap();
        let ours = |i: &usize| shard.contains_value(&uid(*i));
        let fake = Fake::new("configmaps");
        for i in 0..64 {
            fake.add(with_uid(i));
        }
        let informer = SharedInformer::builder(fake.clone())
            .shard(shard.clone())
            .build();
        let (_reg, mut rx) = recorder(&informer);
        let informer = informer.spawn(CancellationToken::new());
        let listed: Vec<usize> = (0..64).filter(ours).collect();
        assert!(
            (8..56).contains(&listed.len()),
            "about half: {}",
            listed.len()
        );
        let expected: Vec<_> = listed
            .iter()
            .map(|i| Ev::Add(format!("o{i}"), true))
            .collect();
        assert_eq!(sorted(take(&mut rx, listed.len()).await), sorted(expected));
        assert_eq!(informer.store().len(), listed.len());
        let stats = informer.reflector_stats();
        assert_eq!(stats.shard_mode, Some(ShardMode::Client));
        assert_eq!(stats.outside_shard, (64 - listed.len()) as u64);

        // Watched objects from outside the shard are dropped as well.
        fake.wait_for_calls(|c| c.watches == 1).await;
        for i in 64..96 {
            fake.add(with_uid(i));
        }
        let watched: Vec<usize> = (64..96).filter(ours).collect();
        let expected: Vec<_> = watched
            .iter()
            .map(|i| Ev::Add(format!("o{i}"), false))
            .collect();
        assert_eq!(take(&mut rx, watched.len()).await, expected);
        assert_eq!(informer.store().len(), listed.len() + watched.len());
        // Every request carried the shard's selector.
        assert!(
            fake.list_requests()
                .iter()
                .all(|o| o.shard.as_ref() == Some(&shard))
        );
        assert!(
            fake.watch_requests()
                .iter()
                .all(|o| o.shard.as_ref() == Some(&shard))
        );
        informer.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_shard_relists_and_sends_only_what_changed() {
        use crate::list_watch::{HashRange, Shard, ShardField};
        let uid = |i: usize| format!("{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let half = |part| Shard::new(ShardField::Uid, [HashRange::part(part, 2).unwrap()]).unwrap();
        let fake = Fake::new("configmaps");
        for i in 0..40 {
            let mut obj = cm(&format!("o{i}"));
            obj.metadata.uid = Some(uid(i));
            fake.add(obj);
        }
        let (low, high): (Vec<usize>, Vec<usize>) =
            (0..40).partition(|i| half(0).contains_value(&uid(*i)));
        let names = |ids: &[usize], ev: fn(String) -> Ev| {
            sorted(ids.iter().map(|i| ev(format!("o{i}"))).collect())
        };
        let informer = SharedInformer::builder(fake.clone()).shard(half(0)).build();
        let (_reg, mut rx) = recorder(&informer);
        let informer = informer.spawn(CancellationToken::new());
        assert_eq!(
            sorted(take(&mut rx, low.len()).await),
            names(&low, |n| Ev::Add(n, true))
        );
        fake.wait_for_calls(|c| c.watches == 1).await;

        // Widened to everything: the other half arrives, nothing for the half it had.
        let all = Shard::new(ShardField::Uid, [HashRange::all()]).unwrap();
        informer.reshard(all.clone()).unwrap();
        assert_eq!(informer.shard(), Some(all));
        assert_eq!(
            sorted(take(&mut rx, high.len()).await),
            names(&high, |n| Ev::Add(n, false))
        );
        assert_eq!(informer.store().len(), 40);

        // Narrowed to the other half: the first half leaves as tombstones.
        fake.wait_for_calls(|c| c.watches == 2).await;
        informer.reshard(half(1)).unwrap();
        assert_eq!(
            sorted(take(&mut rx, low.len()).await),
            names(&low, |n| Ev::Delete(n, true))
        );
        assert_eq!(informer.store().len(), high.len());
        fake.wait_for_calls(|c| c.watches == 3).await;
        // Nothing more was sent: the next event is a fresh object of the shard.
        let next = (40..).find(|i| half(1).contains_value(&uid(*i))).unwrap();
        let mut obj = cm(&format!("o{next}"));
        obj.metadata.uid = Some(uid(next));
        fake.add(obj);
        assert_eq!(take(&mut rx, 1).await, [Ev::Add(format!("o{next}"), false)]);
        let lists = fake.list_requests();
        assert_eq!(lists.last().unwrap().shard, Some(half(1)));

        let unsharded = SharedInformer::new(Fake::new("configmaps"));
        assert!(matches!(unsharded.reshard(half(0)), Err(Error::NotSharded)));
        informer.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn relist_emits_tombstones_and_nothing_for_unchanged() {
        let fake = Fake::new("configmaps");
        for n in ["keep", "change", "vanish"] {
            fake.add(cm(n));
        }
        let informer = SharedInformer::builder(fake.clone()).paged_list().build();
        let (_reg, mut rx) = recorder(&informer);
        let informer = informer.spawn(CancellationToken::new());
        assert_eq!(take(&mut rx, 3).await.len(), 3);
        fake.wait_for_calls(|c| c.watches == 1).await;

        // events lost, history compacted: the resumed watch gets 410 and the informer relists
        fake.set_broadcast(false);
        let old_rv = rv(&fake.get("ns/change").unwrap());
        let new_rv = fake.update(cm("change"));
        fake.delete(Some("ns"), "vanish");
        fake.add(cm("new"));
        fake.compact();
        fake.set_broadcast(true);
        fake.end_watches();
        fake.wait_for_calls(|c| c.lists == 2).await;
        let events = sorted(take(&mut rx, 3).await);
        assert_eq!(
            events,
            [
                Ev::Add("new".into(), false),
                Ev::Delete("vanish".into(), true),
                Ev::Update("change".into(), old_rv, new_rv),
            ]
        );
        // nothing for "keep": the next event is a fresh one
        fake.wait_for_calls(|c| c.watches == 3).await;
        fake.add(cm("later"));
        assert_eq!(take(&mut rx, 1).await, [Ev::Add("later".into(), false)]);
        informer.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn late_handler_gets_current_objects_and_own_sync() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        fake.add(cm("b"));
        let informer = SharedInformer::builder(fake.clone()).paged_list().build();
        let informer = informer.spawn(CancellationToken::new());
        informer.wait_synced().await;
        fake.wait_for_calls(|c| c.watches == 1).await;

        let (reg, mut rx) = recorder(&informer);
        reg.wait_synced().await;
        assert_eq!(
            sorted(take(&mut rx, 2).await),
            [Ev::Add("a".into(), true), Ev::Add("b".into(), true)]
        );
        fake.add(cm("c"));
        assert_eq!(take(&mut rx, 1).await, [Ev::Add("c".into(), false)]);

        reg.remove();
        fake.add(cm("d"));
        assert!(rx.recv().await.is_none(), "removed handler's task ended");
        informer.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_handler_does_not_delay_another() {
        let fake = Fake::new("configmaps");
        for i in 0..100 {
            fake.add(cm(&format!("o{i}")));
        }
        let informer = SharedInformer::builder(fake.clone()).paged_list().build();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let slow_seen = Arc::new(AtomicU64::new(0));
        let seen = slow_seen.clone();
        let slow = informer
            .add_handler(handler_fn().on_add(move |_, _| {
                if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                    // blocks until the fast handler has seen everything
                    let _ = release_rx
                        .lock()
                        .unwrap()
                        .recv_timeout(Duration::from_secs(30));
                }
            }))
            .expect("an informer that has not run has not stopped");
        let (fast, mut rx) = recorder(&informer);
        let informer = informer.spawn(CancellationToken::new());
        fast.wait_synced().await;
        assert_eq!(take(&mut rx, 100).await.len(), 100);
        fake.wait_for_calls(|c| c.watches == 1).await;
        fake.add(cm("live"));
        assert_eq!(take(&mut rx, 1).await, [Ev::Add("live".into(), false)]);
        assert!(!slow.has_synced());
        assert_eq!(slow_seen.load(Ordering::SeqCst), 1);
        release_tx.send(()).unwrap();
        slow.wait_synced().await;
        informer.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn resync_redelivers_updates() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        let informer = SharedInformer::builder(fake.clone())
            .paged_list()
            .resync_period(Duration::from_secs(30))
            .build();
        let (_reg, mut rx) = recorder(&informer);
        let informer = informer.spawn(CancellationToken::new());
        assert_eq!(take(&mut rx, 1).await, [Ev::Add("a".into(), true)]);
        let t0 = tokio::time::Instant::now();
        let rv = rv(&fake.get("ns/a").unwrap());
        assert_eq!(
            take(&mut rx, 1).await,
            [Ev::Update("a".into(), rv.clone(), rv)]
        );
        assert!(t0.elapsed() <= Duration::from_secs(30));
        informer.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn transform_indexers_and_error_hook() {
        let fake = Fake::new("configmaps");
        let mut a = cm("a");
        a.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
        a.metadata.managed_fields = Some(vec![Default::default()]);
        fake.add(a);
        fake.fail_next_list(gone("configmaps", Verb::List));
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let errs = errors.clone();
        let informer = SharedInformer::builder(fake.clone())
            .paged_list()
            .transform(strip_managed_fields)
            .index_fn("app", label_index("app"))
            .indexer("namespace", |_: &ConfigMap| vec![])
            .on_watch_error(move |e| errs.lock().unwrap().push(e.to_string()))
            .build();
        let informer = informer.spawn(CancellationToken::new());
        informer.wait_synced().await;
        let stored = informer.store().by_index("app", "web").unwrap();
        assert_eq!(stored.len(), 1);
        assert!(stored[0].metadata.managed_fields.is_none());
        assert_eq!(
            informer.store().by_index("namespace", "ns").unwrap().len(),
            1
        );
        assert_eq!(errors.lock().unwrap().len(), 1);
        informer
            .add_indexer("name", |o: &ConfigMap| {
                o.metadata.name.iter().cloned().collect()
            })
            .unwrap();
        assert_eq!(informer.store().index_keys("name", "a").unwrap().len(), 1);
        informer.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn wait_for_cache_sync_times_out_and_run_stops_cleanly() {
        let fake = Fake::new("configmaps");
        for _ in 0..5 {
            fake.fail_next_list(gone("configmaps", Verb::List));
        }
        let informer = SharedInformer::builder(fake.clone()).paged_list().build();
        let (reg, _rx) = recorder(&informer);
        let informer = informer.spawn(CancellationToken::new());
        let err = wait_for_cache_sync(&[&informer, &reg], Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::SyncTimeout(_)));
        let handle = informer.handle();
        informer.stop().await;
        assert!(!handle.has_synced());
        // A stopped informer refuses handlers that would never run.
        let late = handle.add_handler(handler_fn::<ConfigMap>());
        assert!(matches!(late, Err(Error::InformerStopped)), "{late:?}");
    }

    /// A source whose streaming list is all buffered already: its stream never waits.
    struct Buffered(usize);

    impl ListWatch<ConfigMap> for Buffered {
        fn resource(&self) -> String {
            "configmaps".into()
        }

        async fn list(
            &self,
            _: &crate::list_watch::ListOptions,
        ) -> Result<crate::list_watch::ListPage<ConfigMap>, Error> {
            Err(Error::MalformedEvent {
                resource: self.resource(),
                detail: "lists by stream only".into(),
            })
        }

        async fn watch(
            &self,
            options: &crate::list_watch::WatchOptions,
        ) -> Result<crate::list_watch::WatchStream<ConfigMap>, Error> {
            use crate::list_watch::WatchEvent;
            use futures::StreamExt;
            if !options.send_initial_events {
                return Ok(futures::stream::pending().boxed());
            }
            let mut events: Vec<_> = (0..self.0)
                .map(|i| {
                    let mut cm = cm(&format!("c{i}"));
                    cm.metadata.resource_version = Some(format!("{}", i + 1));
                    Ok(WatchEvent::Added(cm))
                })
                .collect();
            events.push(Ok(WatchEvent::Bookmark {
                resource_version: format!("{}", self.0 + 1),
                initial_events_end: true,
            }));
            Ok(futures::stream::iter(events)
                .chain(futures::stream::pending())
                .boxed())
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn handlers_run_while_a_buffered_streaming_list_is_applied() {
        const OBJECTS: usize = 2000;
        let informer = SharedInformer::new(Buffered(OBJECTS));
        let store = informer.handle().store();
        let cached_at_adds = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = cached_at_adds.clone();
        informer
            .add_handler(
                handler_fn()
                    .on_add(move |_: &Arc<ConfigMap>, _| seen.lock().unwrap().push(store.len())),
            )
            .expect("an informer that has not run has not stopped");
        let running = informer.spawn(CancellationToken::new());
        running.wait_synced().await;
        while cached_at_adds.lock().unwrap().len() < OBJECTS {
            tokio::task::yield_now().await;
        }
        let first = cached_at_adds.lock().unwrap()[0];
        // Otherwise each object of a compact cache waits decoded in the handler's buffer
        // until the whole list is in.
        assert!(
            first < OBJECTS / 4,
            "the handler first ran with {first} of {OBJECTS} objects cached"
        );
        running.stop().await;
    }
}
