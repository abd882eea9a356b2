//! The shared informer: one reflector, one indexed store, many event handlers (client-go's
//! `SharedIndexInformer`).
//!
//! The reflector writes through the informer's event processor, which, under one mutex,
//! updates the [`Store`] and appends notifications to every handler's buffer. So each
//! handler sees events in store order, and a handler reading the store from a callback sees
//! at least the state of the event it was given.
//!
//! * A full list is compared with the cache object by object as it arrives: new objects are
//!   adds (`is_initial_list` on the first list), objects with a different resourceVersion
//!   are updates, unchanged ones (same resourceVersion) emit nothing; once the list is
//!   complete ([`finish_list`](crate::ReflectorStore::finish_list)), vanished objects are
//!   deletes carrying a tombstone ([`DeletedObject::FinalStateUnknown`](crate::DeletedObject)).
//! * Each handler has its own unbounded buffer and task ([`handler`](crate::handler)); a
//!   handler added after the first list first receives the cached objects as initial adds.
//! * An optional resync period re-delivers every cached object as `on_update(obj, obj)`.
//!
//! ```
//! use std::time::Duration;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_informer::{SharedInformer, handler_fn, testing::FakeListWatch, wait_for_cache_sync};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let fake = FakeListWatch::<ConfigMap>::new("configmaps");
//! fake.add(FakeListWatch::<ConfigMap>::object(Some("default"), "a"));
//!
//! let informer = SharedInformer::builder(fake.clone())
//!     .indexer("by-name", |cm: &ConfigMap| cm.metadata.name.iter().cloned().collect())
//!     .build();
//! let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
//! let registration = informer.add_handler(handler_fn().on_add(move |cm: &std::sync::Arc<ConfigMap>, _| {
//!     let _ = tx.send(cm.metadata.name.clone());
//! }));
//!
//! let stop = CancellationToken::new();
//! let run = tokio::spawn(informer.run(stop.clone()));
//! wait_for_cache_sync(&[&informer, &registration], Duration::from_secs(10)).await.unwrap();
//! assert_eq!(rx.recv().await.unwrap().as_deref(), Some("a"));
//! assert_eq!(informer.store().by_index("by-name", "a").unwrap().len(), 1);
//! stop.cancel();
//! run.await.unwrap();
//! # }
//! ```

use std::{
    collections::HashSet,
    fmt,
    future::Future,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError, Weak,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt, future::BoxFuture};
use kube_core::Resource;
use serde::{Serialize, de::DeserializeOwned};
use tokio::{
    runtime::Handle,
    sync::{mpsc, watch},
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{debug, warn};

use crate::{
    BackoffConfig, Codec, DeletedFinalStateUnknown, DeletedObject, Error, EventHandler,
    HandlerRegistration, HasSynced, JsonCodec, ListMode, ListWatch, Lister, ObjectKey, Reflector,
    ReflectorConfig, ReflectorStore, Store,
    handler::{Notification, run_listener},
    index::IndexFn,
    reflector::{ErrorHook, SyncedVersion},
    store::TransformFn,
};

/// A reflector, an indexed store and any number of event handlers for one resource.
///
/// Cheap to clone (shared). See the [module docs](self) for an example and the event
/// semantics.
pub struct SharedInformer<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for SharedInformer<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<K> {
    processor: Arc<Processor<K>>,
    synced: watch::Receiver<bool>,
    /// The latest list/watch error that retrying cannot fix (see [`Error::permanent_copy`]).
    permanent_error: watch::Receiver<Option<Arc<Error>>>,
    version: SyncedVersion,
    lifecycle: Mutex<Lifecycle>,
    resync: Option<Duration>,
}

type Starter = Box<dyn FnOnce(CancellationToken) -> BoxFuture<'static, ()> + Send>;

enum Lifecycle {
    NotStarted {
        starter: Starter,
        pending: Vec<BoxFuture<'static, ()>>,
    },
    Running {
        handle: Handle,
        tracker: TaskTracker,
        token: CancellationToken,
    },
    Stopped,
}

/// Applies the reflector's writes to the store and fans notifications out to handlers.
struct Processor<K> {
    store: Store<K>,
    dist: Mutex<Distributor<K>>,
    synced: watch::Sender<bool>,
    next_id: AtomicU64,
}

struct Distributor<K> {
    listeners: Vec<Listener<K>>,
    synced: bool,
}

struct Listener<K> {
    id: u64,
    tx: mpsc::UnboundedSender<Notification<K>>,
    initial_done: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K> Processor<K> {
    fn broadcast(dist: &mut Distributor<K>, notes: &[Notification<K>]) {
        if notes.is_empty() {
            return;
        }
        for listener in &dist.listeners {
            for note in notes {
                // A closed channel means the handler task ended (stopped or removed).
                let _ = listener.tx.send(note.clone());
            }
        }
    }

    fn remove_listener(&self, id: u64) {
        lock(&self.dist).listeners.retain(|l| l.id != id);
    }
}

fn same_version<K: Resource>(a: &K, b: &K) -> bool {
    match (&a.meta().resource_version, &b.meta().resource_version) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

impl<K: Resource + Send + Sync + 'static> Processor<K> {
    fn resync(&self) {
        let mut dist = lock(&self.dist);
        if !dist.synced {
            return;
        }
        let notes: Vec<_> = self
            .store
            .list()
            .into_iter()
            .map(|o| Notification::Update {
                old: o.clone(),
                new: o,
            })
            .collect();
        debug!(objects = notes.len(), "resync");
        Self::broadcast(&mut dist, &notes);
    }
}

/// The processor as the reflector's store.
struct Sink<K>(Arc<Processor<K>>);

impl<K: Resource + Send + Sync + 'static> Sink<K> {
    /// A full list is in: handlers that have had their initial objects are synced.
    fn mark_synced(p: &Processor<K>, dist: &mut Distributor<K>) {
        for listener in dist.listeners.iter_mut().filter(|l| !l.initial_done) {
            let _ = listener.tx.send(Notification::Synced);
            listener.initial_done = true;
        }
        dist.synced = true;
        p.synced.send_replace(true);
    }
}

impl<K: Resource + Send + Sync + 'static> ReflectorStore<K> for Sink<K> {
    fn upsert(&self, key: ObjectKey, object: Arc<K>) {
        let p = &*self.0;
        let mut dist = lock(&p.dist);
        let note = match p.store.insert_keyed(key, object.clone()) {
            None => Notification::Add {
                obj: object,
                // Objects of the first list arrive here before the first sync.
                initial: !dist.synced,
            },
            // A relisted object that did not change.
            Some(old) if same_version(&*old, &*object) => return,
            Some(old) => Notification::Update { old, new: object },
        };
        Processor::broadcast(&mut dist, &[note]);
    }

    fn finish_list(&self, listed: &HashSet<ObjectKey>, _resource_version: &str) {
        let p = &*self.0;
        let mut dist = lock(&p.dist);
        let notes: Vec<_> =
            p.store
                .retain_keys(listed)
                .into_iter()
                .map(|(key, last_known)| {
                    Notification::Delete(DeletedObject::FinalStateUnknown(
                        DeletedFinalStateUnknown { key, last_known },
                    ))
                })
                .collect();
        Processor::broadcast(&mut dist, &notes);
        Self::mark_synced(p, &mut dist);
    }

    fn delete(&self, key: ObjectKey, object: Arc<K>) {
        let p = &*self.0;
        let mut dist = lock(&p.dist);
        if p.store.remove(&key).is_some() {
            Processor::broadcast(
                &mut dist,
                &[Notification::Delete(DeletedObject::Final(object))],
            );
        } else {
            debug!(%key, "delete of an object not in the cache");
        }
    }
}

/// Options of a [`SharedInformer`]; from [`SharedInformer::builder`].
pub struct InformerBuilder<K, L> {
    list_watch: L,
    config: ReflectorConfig,
    resync: Option<Duration>,
    transform: Option<TransformFn<K>>,
    indexers: Vec<(String, IndexFn<K>)>,
    error_hook: Option<ErrorHook>,
    codec: Option<Arc<dyn Codec<K>>>,
}

impl<K, L> InformerBuilder<K, L>
where
    K: Resource + Send + Sync + 'static,
    L: ListWatch<K>,
{
    /// Re-deliver every cached object as `on_update(obj, obj)` this often (off by default).
    #[must_use]
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync = Some(period).filter(|p| !p.is_zero());
        self
    }

    /// Transforms every object before it is stored, e.g. [`strip_managed_fields`](crate::strip_managed_fields).
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

    /// Adds an index from a ready [`IndexFn`] (e.g. [`label_index`](crate::index::label_index)).
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

    /// Reconnect a watch silent for this long (5 min).
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

    /// Fetch the full state by streaming lists (`sendInitialEvents`) instead of paged lists;
    /// see [`ListMode::Streaming`].
    #[must_use]
    pub fn streaming_list(mut self) -> Self {
        self.config.list_mode = ListMode::Streaming;
        self
    }

    /// Keep the cache in `codec`'s encoding (a compact [`Store`]): objects are decoded on
    /// each read and to deliver update and delete events, in exchange for much less memory.
    #[must_use]
    pub fn codec(mut self, codec: Arc<dyn Codec<K>>) -> Self {
        self.codec = Some(codec);
        self
    }

    /// All reflector settings at once.
    #[must_use]
    pub fn reflector_config(mut self, config: ReflectorConfig) -> Self {
        self.config = config;
        self
    }

    /// Calls `hook` with every list/watch error (client-go's `SetWatchErrorHandler`).
    #[must_use]
    pub fn on_watch_error(mut self, hook: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        self.error_hook = Some(Arc::new(hook));
        self
    }

    /// Builds the informer; it does nothing until [`run`](SharedInformer::run).
    pub fn build(self) -> SharedInformer<K> {
        let store = match self.codec {
            Some(codec) => Store::with_codec(codec),
            None => Store::new(),
        };
        for (name, f) in self.indexers {
            if let Err(e) = store.add_indexer(&name, f) {
                warn!(error = %e, "indexer ignored");
            }
        }
        let (synced_tx, synced_rx) = watch::channel(false);
        let processor = Arc::new(Processor {
            store,
            dist: Mutex::new(Distributor {
                listeners: Vec::new(),
                synced: false,
            }),
            synced: synced_tx,
            next_id: AtomicU64::new(0),
        });
        let version = SyncedVersion::default();
        let mut reflector = Reflector::new(self.list_watch, Sink(processor.clone()), self.config)
            .with_synced_version(version.clone());
        if let Some(t) = self.transform {
            reflector = reflector.with_transform(t);
        }
        let (permanent_tx, permanent_rx) = watch::channel(None);
        let user_hook = self.error_hook;
        reflector = reflector.with_error_hook(Arc::new(move |error: &Error| {
            if let Some(permanent) = error.permanent_copy() {
                permanent_tx.send_replace(Some(Arc::new(permanent)));
            }
            if let Some(hook) = &user_hook {
                hook(error);
            }
        }));
        let starter: Starter = Box::new(move |token| reflector.run(token).boxed());
        SharedInformer {
            inner: Arc::new(Inner {
                processor,
                synced: synced_rx,
                permanent_error: permanent_rx,
                version,
                lifecycle: Mutex::new(Lifecycle::NotStarted {
                    starter,
                    pending: Vec::new(),
                }),
                resync: self.resync,
            }),
        }
    }
}

impl<K, L> InformerBuilder<K, L>
where
    K: Resource + Serialize + DeserializeOwned + Send + Sync + 'static,
    L: ListWatch<K>,
{
    /// Keep the cache as compact JSON ([`JsonCodec`]); see [`codec`](Self::codec).
    ///
    /// A Pod with `managedFields` takes about 1.5 KB this way instead of about 13.6 KB
    /// decoded. Each read (`get`, `list`, listers) decodes, a few microseconds per Pod, and
    /// hands out a fresh `Arc`; event handlers still get the objects as decoded from the
    /// watch, and the old object of an update is decoded once for all handlers.
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_informer::{SharedInformer, testing::FakeListWatch};
    ///
    /// let informer = SharedInformer::builder(FakeListWatch::<ConfigMap>::new("configmaps"))
    ///     .streaming_list()
    ///     .compact()
    ///     .build();
    /// assert!(informer.store().is_compact());
    /// ```
    #[must_use]
    pub fn compact(self) -> Self {
        self.codec(Arc::new(JsonCodec))
    }
}

impl<K: Resource + Send + Sync + 'static> SharedInformer<K> {
    /// An informer with default options over `list_watch` (an `Api<K>`, an
    /// [`ApiListWatch`](crate::ApiListWatch), a [`FakeListWatch`](crate::testing::FakeListWatch), ...).
    pub fn new<L: ListWatch<K>>(list_watch: L) -> Self {
        Self::builder(list_watch).build()
    }

    /// Starts configuring an informer over `list_watch`.
    pub fn builder<L: ListWatch<K>>(list_watch: L) -> InformerBuilder<K, L> {
        InformerBuilder {
            list_watch,
            config: ReflectorConfig::default(),
            resync: None,
            transform: None,
            indexers: Vec::new(),
            error_hook: None,
            codec: None,
        }
    }

    /// The informer's cache. Read it; never write to it.
    pub fn store(&self) -> Store<K> {
        self.inner.processor.store.clone()
    }

    /// A typed lister over the cache.
    pub fn lister(&self) -> Lister<K> {
        Lister::new(self.store())
    }

    /// Adds an index to the running informer's store (indexing the cached objects).
    ///
    /// # Errors
    ///
    /// [`Error::IndexExists`] when the name is taken.
    pub fn add_indexer(
        &self,
        name: &str,
        f: impl Fn(&K) -> Vec<String> + Send + Sync + 'static,
    ) -> Result<(), Error> {
        let _dist = lock(&self.inner.processor.dist);
        self.inner.processor.store.add_indexer(name, Arc::new(f))
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
        // An error from before this call counts too.
        errors.mark_changed();
        tokio::select! {
            () = self.wait_synced() => Ok(()),
            Ok(error) = errors.wait_for(Option::is_some) => {
                let error = error.as_ref().and_then(|e| e.permanent_copy());
                Err(error.expect("wait_for returned a permanent error"))
            }
        }
    }

    /// The resourceVersion the cache last synced to (list, event or bookmark).
    pub fn last_sync_resource_version(&self) -> Option<String> {
        self.inner.version.get()
    }

    /// Registers a handler. It gets its own buffer and task. If the informer has already
    /// synced, it first receives every cached object as an initial add; its registration's
    /// [`has_synced`](HandlerRegistration::has_synced) turns true once those are processed.
    ///
    /// A handler added after the informer stopped never runs.
    pub fn add_handler(&self, handler: impl EventHandler<K>) -> HandlerRegistration {
        let processor = &self.inner.processor;
        let id = processor.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let (synced_tx, synced_rx) = watch::channel(false);
        let own_token = CancellationToken::new();
        {
            let mut dist = lock(&processor.dist);
            let initial_done = dist.synced;
            if initial_done {
                for obj in processor.store.list() {
                    let _ = tx.send(Notification::Add { obj, initial: true });
                }
                let _ = tx.send(Notification::Synced);
            }
            dist.listeners.push(Listener {
                id,
                tx,
                initial_done,
            });
        }
        let task = run_listener(Box::new(handler), rx, synced_tx, own_token.clone()).boxed();
        {
            let mut lifecycle = lock(&self.inner.lifecycle);
            match &mut *lifecycle {
                Lifecycle::NotStarted { pending, .. } => pending.push(task),
                Lifecycle::Running {
                    handle,
                    tracker,
                    token,
                } => {
                    tracker.spawn_on(until_cancelled(task, token.clone()), handle);
                }
                Lifecycle::Stopped => warn!("handler added to a stopped informer; it will not run"),
            }
        }
        let weak: Weak<Processor<K>> = Arc::downgrade(processor);
        HandlerRegistration {
            synced: synced_rx,
            remover: Box::new(move || {
                own_token.cancel();
                if let Some(p) = weak.upgrade() {
                    p.remove_listener(id);
                }
            }),
        }
    }

    /// The informer's run future: lists, watches and dispatches until `cancel` fires, then
    /// stops every task it started (reflector, handler tasks, resync timer) and returns. The
    /// future is `'static`, so `tokio::spawn(informer.run(token))` works. Dropping it also
    /// stops everything. An informer runs once: a second call logs a warning and returns.
    pub fn run(&self, cancel: CancellationToken) -> impl Future<Output = ()> + Send + 'static {
        let inner = self.inner.clone();
        async move {
            let token = cancel.child_token();
            let _stop_on_drop = token.clone().drop_guard();
            let tracker = TaskTracker::new();
            let starter = {
                let mut lifecycle = lock(&inner.lifecycle);
                let (starter, pending) =
                    match std::mem::replace(&mut *lifecycle, Lifecycle::Stopped) {
                        Lifecycle::NotStarted { starter, pending } => (starter, pending),
                        other => {
                            *lifecycle = other;
                            warn!("SharedInformer::run called more than once; ignored");
                            return;
                        }
                    };
                for task in pending {
                    tracker.spawn(until_cancelled(task, token.clone()));
                }
                *lifecycle = Lifecycle::Running {
                    handle: Handle::current(),
                    tracker: tracker.clone(),
                    token: token.clone(),
                };
                starter
            };
            if let Some(period) = inner.resync {
                let processor = inner.processor.clone();
                let token = token.clone();
                tracker.spawn(async move {
                    let mut ticks =
                        tokio::time::interval_at(tokio::time::Instant::now() + period, period);
                    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tokio::select! {
                            biased;
                            () = token.cancelled() => break,
                            _ = ticks.tick() => processor.resync(),
                        }
                    }
                });
            }
            tracker.spawn(starter(token.clone()));
            token.cancelled().await;
            *lock(&inner.lifecycle) = Lifecycle::Stopped;
            tracker.close();
            tracker.wait().await;
            debug!("informer stopped");
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

impl<K: Resource + Send + Sync + 'static> HasSynced for SharedInformer<K> {
    fn has_synced(&self) -> bool {
        SharedInformer::has_synced(self)
    }

    fn synced_receiver(&self) -> watch::Receiver<bool> {
        self.inner.synced.clone()
    }
}

impl<K> fmt::Debug for SharedInformer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedInformer")
            .field("store", &self.inner.processor.store)
            .field("synced", &*self.inner.synced.borrow())
            .finish()
    }
}

/// Waits until every item has synced (client-go's `WaitForCacheSync`), awaiting their
/// sync signals (no polling).
///
/// # Errors
///
/// [`Error::SyncTimeout`] when `timeout` passes first.
pub async fn wait_for_cache_sync(items: &[&dyn HasSynced], timeout: Duration) -> Result<(), Error> {
    let receivers: Vec<_> = items.iter().map(|i| i.synced_receiver()).collect();
    let all = async move {
        for mut rx in receivers {
            if rx.wait_for(|s| *s).await.is_err() {
                // The sender is gone (handler removed before syncing): it will never sync.
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::time::timeout(timeout, all)
        .await
        .map_err(|_| Error::SyncTimeout(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{error::Verb, handler_fn, testing::FakeListWatch, testing::gone};
    use k8s_openapi::api::core::v1::ConfigMap;
    use tokio::sync::mpsc::UnboundedReceiver;

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
        informer: &SharedInformer<ConfigMap>,
    ) -> (HandlerRegistration, UnboundedReceiver<Ev>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (t1, t2, t3) = (tx.clone(), tx.clone(), tx);
        let reg = informer.add_handler(
            handler_fn()
                .on_add(move |o, initial| {
                    let _ = t1.send(Ev::Add(name(o), initial));
                })
                .on_update(move |old, new| {
                    let _ = t2.send(Ev::Update(name(new), rv(old), rv(new)));
                })
                .on_delete(move |d| {
                    let _ = t3.send(Ev::Delete(name(d.object()), d.is_final_state_unknown()));
                }),
        );
        (reg, rx)
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

    #[tokio::test(start_paused = true)]
    async fn initial_list_then_watch_events() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        fake.add(cm("b"));
        let informer = SharedInformer::new(fake.clone());
        let (reg, mut rx) = recorder(&informer);
        assert!(!informer.has_synced() && !reg.has_synced());
        let stop = CancellationToken::new();
        let run = tokio::spawn(informer.run(stop.clone()));
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
        stop.cancel();
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn relist_emits_tombstones_and_nothing_for_unchanged() {
        let fake = Fake::new("configmaps");
        for n in ["keep", "change", "vanish"] {
            fake.add(cm(n));
        }
        let informer = SharedInformer::new(fake.clone());
        let (_reg, mut rx) = recorder(&informer);
        let stop = CancellationToken::new();
        let run = tokio::spawn(informer.run(stop.clone()));
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
        stop.cancel();
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn late_handler_gets_current_objects_and_own_sync() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        fake.add(cm("b"));
        let informer = SharedInformer::new(fake.clone());
        let stop = CancellationToken::new();
        let run = tokio::spawn(informer.run(stop.clone()));
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
        stop.cancel();
        run.await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_handler_does_not_delay_another() {
        let fake = Fake::new("configmaps");
        for i in 0..100 {
            fake.add(cm(&format!("o{i}")));
        }
        let informer = SharedInformer::new(fake.clone());
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let slow_seen = Arc::new(AtomicU64::new(0));
        let seen = slow_seen.clone();
        let slow = informer.add_handler(handler_fn().on_add(move |_, _| {
            if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                // blocks until the fast handler has seen everything
                let _ = release_rx
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(30));
            }
        }));
        let (fast, mut rx) = recorder(&informer);
        let stop = CancellationToken::new();
        let run = tokio::spawn(informer.run(stop.clone()));
        fast.wait_synced().await;
        assert_eq!(take(&mut rx, 100).await.len(), 100);
        fake.wait_for_calls(|c| c.watches == 1).await;
        fake.add(cm("live"));
        assert_eq!(take(&mut rx, 1).await, [Ev::Add("live".into(), false)]);
        assert!(!slow.has_synced());
        assert_eq!(slow_seen.load(Ordering::SeqCst), 1);
        release_tx.send(()).unwrap();
        slow.wait_synced().await;
        stop.cancel();
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn resync_redelivers_updates() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        let informer = SharedInformer::builder(fake.clone())
            .resync_period(Duration::from_secs(30))
            .build();
        let (_reg, mut rx) = recorder(&informer);
        let stop = CancellationToken::new();
        let run = tokio::spawn(informer.run(stop.clone()));
        assert_eq!(take(&mut rx, 1).await, [Ev::Add("a".into(), true)]);
        let t0 = tokio::time::Instant::now();
        let rv = rv(&fake.get("ns/a").unwrap());
        assert_eq!(
            take(&mut rx, 1).await,
            [Ev::Update("a".into(), rv.clone(), rv)]
        );
        assert!(t0.elapsed() <= Duration::from_secs(30));
        stop.cancel();
        run.await.unwrap();
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
            .transform(crate::strip_managed_fields)
            .index_fn("app", crate::index::label_index("app"))
            .indexer("namespace", |_: &ConfigMap| vec![])
            .on_watch_error(move |e| errs.lock().unwrap().push(e.to_string()))
            .build();
        let stop = CancellationToken::new();
        let run = tokio::spawn(informer.run(stop.clone()));
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
        stop.cancel();
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn wait_for_cache_sync_times_out_and_run_stops_cleanly() {
        let fake = Fake::new("configmaps");
        for _ in 0..5 {
            fake.fail_next_list(gone("configmaps", Verb::List));
        }
        let informer = SharedInformer::new(fake.clone());
        let (reg, _rx) = recorder(&informer);
        let stop = CancellationToken::new();
        let run = tokio::spawn(informer.run(stop.clone()));
        let err = wait_for_cache_sync(&[&informer, &reg], Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::SyncTimeout(_)));
        // second run is ignored
        informer.run(stop.clone()).await;
        stop.cancel();
        run.await.unwrap();
        assert!(!informer.has_synced());
    }
}
