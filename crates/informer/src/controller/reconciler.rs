//! The reconciling controller: a primary resource, the sources that map changes onto it
//! (owned children, other watched objects), and workers that reconcile each primary.
//! The full documentation is on [`ControllerBuilder`].

use std::{
    collections::HashSet, error::Error as StdError, fmt, future::Future, panic::AssertUnwindSafe,
    sync::Arc, time::Duration,
};

use dashmap::DashMap;
use futures::{FutureExt, Stream, StreamExt, future::BoxFuture};
use kube_core::Resource;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

#[cfg(feature = "prometheus")]
use super::metrics::{ControllerMetrics, Outcome, Recorder};
use super::{
    predicate::Predicate,
    worker::{ControllerStats, join_within, next_key},
};
use crate::{
    error::{Error, panic_message},
    informer::{
        DeletedObject, FactoryScope, HandlerRegistration, HasSynced, InformerHandle, handler_fn,
    },
    key::ObjectKey,
    workqueue::{
        MetricsProvider, Priority, QueueConfig, RateLimiter, RateLimitingQueue,
        default_controller_rate_limiter,
    },
};

/// What a reconcile is about: the primary object as cached now, or the news that it is
/// gone.
#[derive(Debug)]
pub enum ReconcileRequest<K> {
    /// The object exists; this is its cached state.
    Present(Arc<K>),
    /// The object was deleted.
    Deleted {
        /// Its key.
        key: ObjectKey,
        /// Its last state, when the informer saw it (not after a restart of the controller,
        /// or for a key enqueued by hand for an object that never existed).
        last_known: Option<Arc<K>>,
    },
}

impl<K: Resource> ReconcileRequest<K> {
    /// The object's key.
    pub fn key(&self) -> ObjectKey {
        match self {
            ReconcileRequest::Present(obj) => {
                ObjectKey::from_object(&**obj).unwrap_or_else(|_| ObjectKey::new(None, ""))
            }
            ReconcileRequest::Deleted { key, .. } => key.clone(),
        }
    }
}

/// What to do with a primary after a successful reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Nothing more until the next change.
    pub fn done() -> Self {
        Self {
            requeue_after: None,
        }
    }

    /// Reconcile again after `delay` even if nothing changes (sooner if something does).
    pub fn requeue_after(delay: Duration) -> Self {
        Self {
            requeue_after: Some(delay),
        }
    }

    /// The requeue delay, if any.
    pub fn requeue_delay(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// Why a reconcile did not succeed, for the error policy.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError<E: StdError + 'static> {
    /// The reconcile function returned an error.
    #[error(transparent)]
    Failed(E),
    /// It ran longer than the [reconcile timeout](ControllerBuilder::reconcile_timeout);
    /// its cancellation token was cancelled and its future dropped.
    #[error("reconcile did not finish within {0:?}")]
    TimedOut(Duration),
    /// It panicked.
    #[error("reconcile panicked: {0}")]
    Panicked(String),
}

/// What the error policy decides for a failed reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorAction {
    /// Requeue after the rate limiter's per-key backoff (growing with each failure).
    Backoff,
    /// Requeue after this delay, and reset the key's backoff.
    RequeueAfter(Duration),
    /// Do not retry: the error is one retrying cannot fix. The key is forgotten until its
    /// next change.
    GiveUp,
}

/// A failed reconcile, as the error policy sees it.
#[derive(Debug)]
pub struct Failure<'a, E: StdError + 'static> {
    /// The primary's key.
    pub key: &'a ObjectKey,
    /// What went wrong.
    pub error: &'a ReconcileError<E>,
    /// How many times this key has been requeued for failures in a row before this one.
    pub retries: u32,
}

/// The client-go samples' rule: back off while the key has been retried fewer than `max`
/// times, then give up (the tutorials use 5).
///
/// ```
/// use kube_informer::{ErrorAction, Failure, ObjectKey, ReconcileError, retry_up_to};
///
/// let policy = retry_up_to::<std::io::Error, ()>(5);
/// let key = ObjectKey::new(Some("ns"), "a");
/// let error = ReconcileError::Failed(std::io::Error::other("down"));
/// let failure = |retries| Failure { key: &key, error: &error, retries };
/// assert_eq!(policy(&failure(4), &()), ErrorAction::Backoff);
/// assert_eq!(policy(&failure(5), &()), ErrorAction::GiveUp);
/// ```
pub fn retry_up_to<E: StdError + 'static, Ctx>(
    max: u32,
) -> impl Fn(&Failure<'_, E>, &Ctx) -> ErrorAction + Send + Sync + 'static {
    move |failure, _| {
        if failure.retries < max {
            ErrorAction::Backoff
        } else {
            ErrorAction::GiveUp
        }
    }
}

/// The production default: back off and retry for as long as the reconcile fails (5 ms
/// doubling to 1000 s per key with the default rate limiter), so an outage that ends is
/// always recovered from.
pub fn retry_with_backoff<E: StdError + 'static, Ctx>()
-> impl Fn(&Failure<'_, E>, &Ctx) -> ErrorAction + Send + Sync + 'static {
    |_, _| ErrorAction::Backoff
}

/// An error and every error it came from, `: `-separated, for logs.
pub(crate) fn error_chain(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Maps a watched object to the primaries to reconcile.
type Mapper<O> = Arc<dyn Fn(&O) -> Vec<ObjectKey> + Send + Sync>;

/// One source of keys: registers its handler on its informer when the controller runs.
type Source = Box<dyn FnOnce(Enqueue) -> Result<Registered, Error> + Send>;

/// A registered source: what to remove when the controller stops, and the wait for its
/// sync.
struct Registered {
    registration: Registration,
    synced: BoxFuture<'static, Result<(), Error>>,
}

/// What a source left running.
enum Registration {
    /// A handler on an informer.
    Handler(HandlerRegistration),
    /// A task forwarding a stream of keys.
    Forwarder(tokio::task::AbortHandle),
}

impl Registration {
    fn remove(self) {
        match self {
            Registration::Handler(registration) => registration.remove(),
            Registration::Forwarder(task) => task.abort(),
        }
    }
}

/// Where sources put keys.
#[derive(Clone)]
struct Enqueue {
    queue: RateLimitingQueue<ObjectKey>,
}

impl Enqueue {
    fn keys(&self, keys: impl IntoIterator<Item = ObjectKey>, priority: Priority) {
        for key in keys {
            self.queue.add_with_priority(key, priority);
        }
    }
}

/// Replays (the initial list, a handler's first objects, a resync) go behind live changes
/// (controller-runtime's priority queue).
fn add_priority(initial: bool) -> Priority {
    if initial {
        Priority::Low
    } else {
        Priority::Normal
    }
}

/// A resync's update carries the same object twice: a replay, not a change.
fn update_priority<K: Resource>(old: &K, new: &K) -> Priority {
    let (old, new) = (&old.meta().resource_version, &new.meta().resource_version);
    if old.is_some() && old == new {
        Priority::Low
    } else {
        Priority::Normal
    }
}

/// A reconciling controller for the primary resource `K` (kube-runtime's `Controller`,
/// controller-runtime's builder), on shared informers, usually from an
/// [`InformerFactory`](crate::InformerFactory).
///
/// Changes reach a queue of primary keys from four kinds of source:
///
/// - the primary itself: every add and delete, and updates that pass its
///   [`Predicate`] (default: every update);
/// - [`owns`](Self::owns): a child whose controller owner reference names a primary of
///   kind `K` enqueues that primary;
/// - [`watches`](Self::watches): any object, mapped to keys by a function, or
///   [`watches_by_index`](Self::watches_by_index): every primary whose index holds the
///   object's key (every Deployment that names this ConfigMap);
/// - [`reconcile_on`](Self::reconcile_on): keys from any stream, for changes outside the
///   cluster.
///
/// Keys from replays (the initial list, a resync) are queued at [`Priority::Low`], behind
/// live changes, so an edit is not stuck behind thousands of replayed objects (for at most
/// [`LOW_PRIORITY_MAX_WAIT`](crate::workqueue::LOW_PRIORITY_MAX_WAIT), so none starves).
///
/// Workers take each key once at a time (a key is never reconciled twice at once) and call
/// the reconcile function with the [`ReconcileRequest`], the shared context and a
/// cancellation token. A success returns an [`Action`]: done, or requeue after a delay; a
/// failure (an error, a panic, the [timeout](Self::reconcile_timeout)) goes to the error
/// policy, which returns an [`ErrorAction`]. The default rate limiter backs off per key
/// from 5 ms to 1000 s, so a key that keeps failing is retried, ever more rarely, until it
/// succeeds; [`retry_up_to`] gives the tutorials' rule instead.
///
/// On cancellation the workers take no new key, the running reconciles' tokens are
/// cancelled, and [`run`](Self::run) returns once they have finished or the
/// [shutdown timeout](Self::shutdown_timeout) has passed (then they are dropped).
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use k8s_openapi::api::{apps::v1::{Deployment, ReplicaSet}, core::v1::ConfigMap};
/// use kube_informer::{
///     Action, CancellationToken, ControllerBuilder, InformerFactory, ObjectKey, Predicate,
///     ReconcileRequest, Scope, retry_up_to,
/// };
///
/// # async fn doc(client: kube_client::Client) -> Result<(), kube_informer::Error> {
/// let factory = InformerFactory::new(client);
/// let deployments = factory.informer::<Deployment>(Scope::namespace("web"));
/// let cancel = CancellationToken::new();
/// let controller = ControllerBuilder::new("deployments", deployments)
///     .predicate(Predicate::generation_changed())
///     .owns(factory.informer::<ReplicaSet>(Scope::namespace("web")))
///     .watches(factory.informer::<ConfigMap>(Scope::namespace("web")), |cm: &ConfigMap| {
///         // The Deployment named like the ConfigMap.
///         vec![ObjectKey::new(cm.metadata.namespace.as_deref(), cm.metadata.name.as_deref().unwrap_or_default())]
///     });
/// factory.start(&cancel);
/// controller
///     .run(
///         |request: ReconcileRequest<Deployment>, _ctx: Arc<()>, _cancel| async move {
///             tracing::info!(key = %request.key(), "reconciled");
///             Ok::<_, std::io::Error>(Action::requeue_after(Duration::from_secs(300)))
///         },
///         retry_up_to(5),
///         Arc::new(()),
///         cancel,
///     )
///     .await
/// # }
/// ```
pub struct ControllerBuilder<K> {
    name: String,
    primary: InformerHandle<K>,
    predicate: Predicate<K>,
    sources: Vec<Source>,
    workers: usize,
    reconcile_timeout: Option<Duration>,
    shutdown_timeout: Duration,
    rate_limiter: Option<Arc<dyn RateLimiter<ObjectKey>>>,
    metrics: Option<Arc<dyn MetricsProvider>>,
    #[cfg(feature = "prometheus")]
    reconcile_metrics: Option<ControllerMetrics>,
    stats: Arc<ControllerStats>,
}

impl<K> fmt::Debug for ControllerBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerBuilder")
            .field("name", &self.name)
            .field("sources", &(self.sources.len() + 1))
            .field("workers", &self.workers)
            .field("reconcile_timeout", &self.reconcile_timeout)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .finish_non_exhaustive()
    }
}

/// A key for `obj`, or a log line saying why there is none.
fn key_of<K: Resource>(obj: &K) -> Option<ObjectKey> {
    match ObjectKey::from_object(obj) {
        Ok(key) => Some(key),
        Err(error) => {
            warn!(%error, "object without a key; ignored");
            None
        }
    }
}

impl<K> ControllerBuilder<K>
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
    K::Scope: FactoryScope,
{
    /// A controller named `name` (logs, metrics, the queue) reconciling the objects of
    /// `primary`.
    pub fn new(name: impl Into<String>, primary: InformerHandle<K>) -> Self {
        Self {
            name: name.into(),
            primary,
            predicate: Predicate::any(),
            sources: Vec::new(),
            workers: 1,
            reconcile_timeout: None,
            shutdown_timeout: Duration::from_secs(30),
            rate_limiter: None,
            metrics: None,
            #[cfg(feature = "prometheus")]
            reconcile_metrics: None,
            stats: Arc::default(),
        }
    }

    /// Which updates of a primary enqueue it (default: every update).
    #[must_use]
    pub fn predicate(mut self, predicate: Predicate<K>) -> Self {
        self.predicate = predicate;
        self
    }

    /// Reconciles the primary that controls each object of `children` (its owner reference
    /// with `controller: true`, of kind `K`), on every change.
    #[must_use]
    pub fn owns<C>(self, children: InformerHandle<C>) -> Self
    where
        C: Resource + Send + Sync + 'static,
    {
        self.owns_with(children, Predicate::any())
    }

    /// [`owns`](Self::owns), for the updates of a child that pass `predicate`.
    #[must_use]
    pub fn owns_with<C>(self, children: InformerHandle<C>, predicate: Predicate<C>) -> Self
    where
        C: Resource + Send + Sync + 'static,
    {
        let kind = K::kind(&()).into_owned();
        let api_version = K::api_version(&()).into_owned();
        let owner = move |child: &C| -> Vec<ObjectKey> {
            let meta = child.meta();
            meta.owner_references
                .iter()
                .flatten()
                .filter(|r| {
                    r.controller == Some(true) && r.kind == kind && r.api_version == api_version
                })
                .map(|r| {
                    let namespace = meta.namespace.as_deref().filter(|_| K::Scope::NAMESPACED);
                    ObjectKey::new(namespace, &r.name)
                })
                .collect()
        };
        self.source(children, Arc::new(owner), predicate)
    }

    /// Reconciles the primaries `map` names for each changed object of `others` (for an
    /// update, those of the old state and of the new).
    #[must_use]
    pub fn watches<O>(
        self,
        others: InformerHandle<O>,
        map: impl Fn(&O) -> Vec<ObjectKey> + Send + Sync + 'static,
    ) -> Self
    where
        O: Resource + Send + Sync + 'static,
    {
        self.watches_with(others, map, Predicate::any())
    }

    /// [`watches`](Self::watches), for the updates that pass `predicate`.
    #[must_use]
    pub fn watches_with<O>(
        self,
        others: InformerHandle<O>,
        map: impl Fn(&O) -> Vec<ObjectKey> + Send + Sync + 'static,
        predicate: Predicate<O>,
    ) -> Self
    where
        O: Resource + Send + Sync + 'static,
    {
        self.source(others, Arc::new(map), predicate)
    }

    /// Reconciles every primary whose index `index` (on the primary's informer; see
    /// [`InformerHandle::add_indexer`]) holds the key of a changed object of `others`: with
    /// an index of the ConfigMaps each Deployment names, a ConfigMap change reconciles every
    /// Deployment that names it.
    #[must_use]
    pub fn watches_by_index<O>(self, others: InformerHandle<O>, index: &str) -> Self
    where
        O: Resource + Send + Sync + 'static,
    {
        let store = self.primary.store();
        let index = index.to_owned();
        let map = move |obj: &O| -> Vec<ObjectKey> {
            let Some(key) = key_of(obj) else {
                return Vec::new();
            };
            match store.index_keys(&index, key.as_str()) {
                Ok(keys) => keys,
                Err(error) => {
                    error!(%error, %index, "watches_by_index: the primary informer has no such index");
                    Vec::new()
                }
            }
        };
        self.source(others, Arc::new(map), Predicate::any())
    }

    fn source<O>(
        mut self,
        informer: InformerHandle<O>,
        map: Mapper<O>,
        predicate: Predicate<O>,
    ) -> Self
    where
        O: Resource + Send + Sync + 'static,
    {
        self.sources.push(Box::new(move |enqueue: Enqueue| {
            let (on_add, on_update, on_delete) = (enqueue.clone(), enqueue.clone(), enqueue);
            let (map_add, map_update, map_delete) = (map.clone(), map.clone(), map);
            let handler = handler_fn::<O>()
                .on_add(move |obj, initial| on_add.keys(map_add(obj), add_priority(initial)))
                .on_update(move |old, new| {
                    if predicate.accepts(old, new) {
                        let keys: HashSet<ObjectKey> =
                            map_update(old).into_iter().chain(map_update(new)).collect();
                        on_update.keys(keys, update_priority(&**old, &**new));
                    }
                })
                .on_delete(move |deleted| {
                    on_delete.keys(map_delete(deleted.object()), Priority::Normal)
                });
            let registration = informer.add_handler(handler)?;
            let synced = registration_synced(informer, &registration);
            Ok(Registered {
                registration: Registration::Handler(registration),
                synced,
            })
        }));
        self
    }

    /// Reconciles every key `keys` yields, as it yields it (kube-runtime's
    /// `reconcile_on`): for changes the informers cannot see, such as a periodic scan of an
    /// external system for what it still holds. A key whose object is not cached is
    /// reconciled as [`ReconcileRequest::Deleted`] (with no last state unless the informer
    /// saw it go), so the reconcile can clean up after an object deleted while no
    /// controller ran. The stream is polled from the start of [`run`](Self::run) until it
    /// ends or the controller stops; keys it yields before the caches have synced are
    /// reconciled once they have.
    #[must_use]
    pub fn reconcile_on(mut self, keys: impl Stream<Item = ObjectKey> + Send + 'static) -> Self {
        self.sources.push(Box::new(move |enqueue: Enqueue| {
            let forwarder = tokio::spawn(async move {
                let mut keys = std::pin::pin!(keys);
                while let Some(key) = keys.next().await {
                    enqueue.keys([key], Priority::Normal);
                }
            });
            Ok(Registered {
                registration: Registration::Forwarder(forwarder.abort_handle()),
                synced: Box::pin(async { Ok(()) }),
            })
        }));
        self
    }

    /// Reconciles this many keys at once (at least one; default one).
    #[must_use]
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// Cancels a reconcile that runs longer than `timeout` and hands the error policy a
    /// [`ReconcileError::TimedOut`] (default: no limit).
    #[must_use]
    pub fn reconcile_timeout(mut self, timeout: Duration) -> Self {
        self.reconcile_timeout = Some(timeout);
        self
    }

    /// How long [`run`](Self::run) waits, once cancelled, for the running reconciles to
    /// finish before dropping them (default 30 s).
    #[must_use]
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// The limiter that spaces retries (default:
    /// [`default_controller_rate_limiter`](crate::workqueue::default_controller_rate_limiter)).
    #[must_use]
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<ObjectKey> + 'static) -> Self {
        self.rate_limiter = Some(Arc::new(limiter));
        self
    }

    /// Reports the queue's metrics to `provider`.
    #[must_use]
    pub fn metrics(mut self, provider: impl MetricsProvider + 'static) -> Self {
        self.metrics = Some(Arc::new(provider));
        self
    }

    /// Records controller-runtime's reconcile metrics (`controller_runtime_*`) in
    /// `metrics`.
    #[cfg(feature = "prometheus")]
    #[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
    #[must_use]
    pub fn reconcile_metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.reconcile_metrics = Some(metrics);
        self
    }

    /// What the workers have done so far (readable while the controller runs).
    pub fn stats(&self) -> Arc<ControllerStats> {
        self.stats.clone()
    }

    /// Runs the controller until `cancel` fires: registers the sources' handlers, waits for
    /// their informers to sync (the informers must be started, e.g. by
    /// [`InformerFactory::start`](crate::InformerFactory::start)), then reconciles.
    ///
    /// # Errors
    ///
    /// [`Error::InformerStopped`] when a source's informer has stopped; an error that
    /// retrying cannot fix (missing RBAC, an unknown resource) from a source's first sync.
    pub async fn run<Ctx, E, R, Fut, P>(
        self,
        reconcile: R,
        error_policy: P,
        context: Arc<Ctx>,
        cancel: CancellationToken,
    ) -> Result<(), Error>
    where
        Ctx: Send + Sync + 'static,
        E: StdError + Send + Sync + 'static,
        R: Fn(ReconcileRequest<K>, Arc<Ctx>, CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        P: Fn(&Failure<'_, E>, &Ctx) -> ErrorAction + Send + Sync + 'static,
    {
        let Self {
            name,
            primary,
            predicate,
            mut sources,
            workers,
            reconcile_timeout,
            shutdown_timeout,
            rate_limiter,
            metrics,
            #[cfg(feature = "prometheus")]
            reconcile_metrics,
            stats,
        } = self;
        let queue_config = QueueConfig {
            name: name.clone(),
            metrics,
        };
        let limiter = rate_limiter.unwrap_or_else(|| Arc::new(default_controller_rate_limiter()));
        let queue = RateLimitingQueue::with_config(limiter, queue_config);
        let deleted: Arc<DashMap<ObjectKey, Arc<K>>> = Arc::default();

        sources.insert(
            0,
            primary_source(primary.clone(), predicate, deleted.clone()),
        );
        let enqueue = Enqueue {
            queue: queue.clone(),
        };
        let mut registered = Vec::new();
        let mut syncs = Vec::new();
        for source in sources {
            match source(enqueue.clone()) {
                Ok(source) => {
                    registered.push(source.registration);
                    syncs.push(source.synced);
                }
                Err(error) => {
                    remove_all(registered);
                    return Err(error);
                }
            }
        }

        let all_synced = async {
            for synced in syncs {
                synced.await?;
            }
            Ok::<(), Error>(())
        };
        let synced = tokio::select! {
            biased;
            () = cancel.cancelled() => None,
            result = all_synced => Some(result),
        };
        match synced {
            None => {
                info!(controller = %name, "cancelled before the caches synced");
                queue.shutdown();
                remove_all(registered);
                return Ok(());
            }
            Some(Err(error)) => {
                error!(controller = %name, error = %error_chain(&error), "a source cannot sync; stopping");
                queue.shutdown();
                remove_all(registered);
                return Err(error);
            }
            Some(Ok(())) => {}
        }
        info!(controller = %name, workers, objects = primary.store().len(), "caches synced; starting workers");

        let worker = Arc::new(Worker {
            name: name.clone(),
            queue: queue.clone(),
            primary,
            deleted,
            reconcile,
            error_policy,
            context,
            reconcile_timeout,
            stats,
            #[cfg(feature = "prometheus")]
            recorder: reconcile_metrics.map(|m| m.for_controller(&name, workers)),
            cancel: cancel.clone(),
        });
        let mut tasks = tokio::task::JoinSet::new();
        for id in 0..workers {
            let worker = worker.clone();
            tasks.spawn(async move { worker.run(id).await });
        }

        cancel.cancelled().await;
        debug!(controller = %name, "shutting down");
        queue.shutdown();
        let dropped = join_within(&mut tasks, shutdown_timeout, |_| {}).await;
        if dropped > 0 {
            warn!(controller = %name, timeout = ?shutdown_timeout, running = dropped, "reconciles still running at the shutdown deadline; dropped");
        }
        remove_all(registered);
        info!(controller = %name, "stopped");
        Ok(())
    }
}

fn remove_all(registered: Vec<Registration>) {
    for registration in registered {
        registration.remove();
    }
}

/// The wait for a source: its informer synced (or failed for good), then its handler.
fn registration_synced<O: Resource + Send + Sync + 'static>(
    informer: InformerHandle<O>,
    registration: &HandlerRegistration,
) -> BoxFuture<'static, Result<(), Error>> {
    let mut handler_synced = registration.synced_receiver();
    Box::pin(async move {
        informer.wait_synced_or_fatal().await?;
        // The sender goes with the handler: a removed handler never syncs.
        if handler_synced.wait_for(|s| *s).await.is_err() {
            return Err(Error::InformerStopped);
        }
        Ok(())
    })
}

/// The primary's own source: every add and delete, updates that pass `predicate`; the last
/// state of a deleted primary is kept for its reconcile.
fn primary_source<K>(
    primary: InformerHandle<K>,
    predicate: Predicate<K>,
    deleted: Arc<DashMap<ObjectKey, Arc<K>>>,
) -> Source
where
    K: Resource + Send + Sync + 'static,
{
    Box::new(move |enqueue: Enqueue| {
        let (on_add, on_update, on_delete) = (enqueue.clone(), enqueue.clone(), enqueue);
        let handler = handler_fn::<K>()
            .on_add(move |obj, initial| on_add.keys(key_of(&**obj), add_priority(initial)))
            .on_update(move |old, new| {
                if predicate.accepts(old, new) {
                    on_update.keys(key_of(&**new), update_priority(&**old, &**new));
                }
            })
            .on_delete(move |gone: &DeletedObject<K>| {
                let last = gone.object();
                if let Some(key) = key_of(&**last) {
                    deleted.insert(key.clone(), last.clone());
                    on_delete.keys([key], Priority::Normal);
                }
            });
        let registration = primary.add_handler(handler)?;
        let synced = registration_synced(primary, &registration);
        Ok(Registered {
            registration: Registration::Handler(registration),
            synced,
        })
    })
}

struct Worker<K, Ctx, R, P> {
    name: String,
    queue: RateLimitingQueue<ObjectKey>,
    primary: InformerHandle<K>,
    deleted: Arc<DashMap<ObjectKey, Arc<K>>>,
    reconcile: R,
    error_policy: P,
    context: Arc<Ctx>,
    reconcile_timeout: Option<Duration>,
    stats: Arc<ControllerStats>,
    #[cfg(feature = "prometheus")]
    recorder: Option<Recorder>,
    cancel: CancellationToken,
}

impl<K, Ctx, R, P> Worker<K, Ctx, R, P>
where
    K: Resource + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
{
    async fn run<E, Fut>(&self, id: usize)
    where
        E: StdError + Send + Sync + 'static,
        R: Fn(ReconcileRequest<K>, Arc<Ctx>, CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        P: Fn(&Failure<'_, E>, &Ctx) -> ErrorAction + Send + Sync + 'static,
    {
        while let Some(key) = next_key(&self.queue, &self.cancel).await {
            self.reconcile_one(&key).await;
            self.queue.done(&key);
        }
        debug!(controller = %self.name, worker = id, "worker stopped");
    }

    async fn reconcile_one<E, Fut>(&self, key: &ObjectKey)
    where
        E: StdError + Send + Sync + 'static,
        R: Fn(ReconcileRequest<K>, Arc<Ctx>, CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        P: Fn(&Failure<'_, E>, &Ctx) -> ErrorAction + Send + Sync + 'static,
    {
        let request = match self.primary.store().get_by_key(key) {
            Some(obj) => ReconcileRequest::Present(obj),
            None => ReconcileRequest::Deleted {
                key: key.clone(),
                last_known: self.deleted.get(key).map(|e| e.value().clone()),
            },
        };
        let token = self.cancel.child_token();
        #[cfg(feature = "prometheus")]
        let started = {
            if let Some(recorder) = &self.recorder {
                recorder.started();
            }
            tokio::time::Instant::now()
        };
        let outcome = self.call(request, token.clone()).await;
        // Whatever it did, its work is over; anything it spawned under the token stops.
        token.cancel();
        #[cfg(feature = "prometheus")]
        if let Some(recorder) = &self.recorder {
            let result = match &outcome {
                Ok(action) if action.requeue_after.is_some() => Outcome::RequeueAfter,
                Ok(_) => Outcome::Success,
                Err(error) => {
                    if matches!(error, ReconcileError::Panicked(_)) {
                        recorder.panicked();
                    }
                    Outcome::Error
                }
            };
            recorder.finished(result, started.elapsed());
        }
        match outcome {
            Ok(action) => {
                self.stats.record_synced();
                self.queue.forget(key);
                // A deletion reconciled (or an object that exists again) needs no last state.
                self.deleted.remove(key);
                if let Some(delay) = action.requeue_after {
                    debug!(controller = %self.name, %key, ?delay, "requeued after");
                    self.queue.add_after(key.clone(), delay);
                }
            }
            Err(error) => {
                self.stats
                    .record_failed(matches!(error, ReconcileError::Panicked(_)));
                let failure = Failure {
                    key,
                    error: &error,
                    retries: self.queue.num_requeues(key),
                };
                let action = (self.error_policy)(&failure, &self.context);
                let message = error_chain(&error);
                match action {
                    ErrorAction::Backoff => {
                        warn!(controller = %self.name, %key, error = %message, retry = failure.retries + 1, "reconcile failed; requeued with backoff");
                        self.queue.add_rate_limited(key.clone());
                    }
                    ErrorAction::RequeueAfter(delay) => {
                        warn!(controller = %self.name, %key, error = %message, ?delay, "reconcile failed; requeued after");
                        self.queue.forget(key);
                        self.queue.add_after(key.clone(), delay);
                    }
                    ErrorAction::GiveUp => {
                        error!(controller = %self.name, %key, error = %message, retries = failure.retries, "reconcile failed; giving up on this key until it changes");
                        self.stats.record_dropped();
                        #[cfg(feature = "prometheus")]
                        if let Some(recorder) = &self.recorder {
                            recorder.gave_up();
                        }
                        self.queue.forget(key);
                    }
                }
            }
        }
    }

    /// The reconcile, with its panic caught and its timeout applied.
    async fn call<E, Fut>(
        &self,
        request: ReconcileRequest<K>,
        token: CancellationToken,
    ) -> Result<Action, ReconcileError<E>>
    where
        E: StdError + Send + Sync + 'static,
        R: Fn(ReconcileRequest<K>, Arc<Ctx>, CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let context = self.context.clone();
        let future = match std::panic::catch_unwind(AssertUnwindSafe(|| {
            (self.reconcile)(request, context, token.clone())
        })) {
            Ok(future) => future,
            Err(panic) => return Err(ReconcileError::Panicked(panic_message(&*panic).to_owned())),
        };
        let guarded = AssertUnwindSafe(future).catch_unwind();
        let outcome = match self.reconcile_timeout {
            Some(limit) => match tokio::time::timeout(limit, guarded).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    token.cancel();
                    return Err(ReconcileError::TimedOut(limit));
                }
            },
            None => guarded.await,
        };
        match outcome {
            Ok(Ok(action)) => Ok(action),
            Ok(Err(error)) => Err(ReconcileError::Failed(error)),
            Err(panic) => Err(ReconcileError::Panicked(panic_message(&*panic).to_owned())),
        }
    }
}
