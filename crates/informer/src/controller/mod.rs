//! The controller: a primary resource, the sources that map changes onto it (owned
//! children, other watched objects, streams of keys), a rate-limited queue of keys, and
//! workers that reconcile each primary. The full documentation is on [`Controller`].

mod client;
mod finalizer;
mod handover;
mod last_state;
#[cfg(feature = "prometheus")]
mod metrics;
mod own_writes;
mod predicate;
mod reconciler;
mod request;
mod source;
mod worker;

use std::{fmt, future::Future, sync::Arc, time::Duration};

use futures::Stream;
use kube_core::Resource;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

pub use client::{ClientError, ControllerClient, Writable};
pub use finalizer::{FinalizerError, FinalizerEvent, finalizer};
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub use metrics::ControllerMetrics;
use own_writes::Caches;
pub use own_writes::{OwnWriteStats, OwnWrites};
pub use predicate::Predicate;
pub use reconciler::Reconciler;
pub use request::{
    Action, ErrorAction, Failure, ReconcileError, ReconcileRequest, SyncFuture, retry_up_to,
    retry_with_backoff, sync_by_key,
};
#[cfg(feature = "manager")]
pub(crate) use source::Follower;
use source::{Enqueue, Mapper, Source, key_of, remove_all};
pub use worker::ControllerStats;
use worker::{Worker, WorkerCounters};

use crate::{
    error::{Error, error_chain},
    informer::{
        FactoryScope, InformerFactory, InformerHandle, RunningInformer, Scope, SharedInformer,
        TypedResource,
    },
    key::ObjectKey,
    list_watch::{Shard, ShardField},
    sharding::ShardRing,
    stats::LiveStats,
    store::Store,
    task::join_within,
    workqueue::{
        MetricsProvider, QueueConfig, RateLimiter, RateLimitingQueue, Tenant,
        default_controller_rate_limiter,
    },
};

/// A controller for the primary resource `K` (kube-runtime's `Controller`,
/// controller-runtime's builder, client-go's sample controller), on shared informers,
/// usually from an [`InformerFactory`] or a
/// [`Manager`](crate::Manager).
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
/// - [`reconcile_on`](Self::reconcile_on) and [`reconcile_every`](Self::reconcile_every):
///   keys from a stream or a periodic scan, for changes outside the cluster.
///
/// Keys from replays (the initial list, a resync) are queued at
/// [`Priority::Low`](crate::workqueue::Priority::Low), behind live changes, so an edit is
/// not stuck behind thousands of replayed objects (for at most
/// [`LOW_PRIORITY_MAX_WAIT`](crate::workqueue::LOW_PRIORITY_MAX_WAIT), so none starves).
///
/// Workers take each key once at a time (a key is never reconciled twice at once) and call
/// the reconcile function with the [`ReconcileRequest`] and the shared context. A success returns an [`Action`]: done, or requeue after a delay; a
/// failure (an error, a panic, the [timeout](Self::reconcile_timeout)) goes to the error
/// policy, which returns an [`ErrorAction`]. The default rate limiter backs off per key
/// from 5 ms to 1000 s; [`retry_with_backoff`] retries, ever more rarely, until the key
/// succeeds, [`retry_up_to`] gives the client-go tutorials' rule (give up after 5 retries).
/// A reconcile written as the tutorials' `sync(key)` runs through [`sync_by_key`].
///
/// On cancellation the workers take no new key and the running reconciles are cancelled
/// as futures are, by dropping them (at their next `.await`); [`run`](Self::run) returns
/// once the workers have ended, or the [shutdown timeout](Self::shutdown_timeout) has
/// passed.
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use k8s_openapi::api::{apps::v1::{Deployment, ReplicaSet}, core::v1::ConfigMap};
/// use kube_informer::{
///     Action, CancellationToken, Controller, InformerFactory, ObjectKey, Predicate,
///     ReconcileRequest, Scope, retry_with_backoff,
/// };
///
/// # async fn doc(client: kube_client::Client) -> Result<(), kube_informer::Error> {
/// let factory = InformerFactory::new(client);
/// let deployments = factory.informer::<Deployment>(Scope::namespace("web"));
/// let cancel = CancellationToken::new();
/// let controller = Controller::new("deployments", deployments)
///     .predicate(Predicate::generation_changed())
///     .owns(factory.informer::<ReplicaSet>(Scope::namespace("web")))
///     .watches(factory.informer::<ConfigMap>(Scope::namespace("web")), |cm: &ConfigMap| {
///         // The Deployment named like the ConfigMap.
///         vec![ObjectKey::new(cm.metadata.namespace.as_deref(), cm.metadata.name.as_deref().unwrap_or_default())]
///     });
/// factory.start(&cancel);
/// let reconcile = |request: ReconcileRequest<Deployment>, _ctx: Arc<()>| async move {
///     tracing::info!(key = %request.key(), "reconciled");
///     Ok::<_, std::io::Error>(Action::requeue_after(Duration::from_secs(300)))
/// };
/// controller
///     .run((reconcile, retry_with_backoff(), Arc::new(())), cancel)
///     .await
/// # }
/// ```
pub struct Controller<K> {
    name: String,
    primary: InformerHandle<K>,
    /// The primary's informer when the controller runs it itself ([`owning`](Self::owning)).
    owned: Option<SharedInformer<K>>,
    predicate: Predicate<K>,
    sources: Vec<Source>,
    workers: usize,
    /// The fleet's turns the workers take before each reconcile, if they share any.
    turns: Option<Tenant>,
    reconcile_timeout: Option<Duration>,
    shutdown_timeout: Duration,
    startup_grace: Duration,
    rate_limiter: Option<Arc<dyn RateLimiter<ObjectKey>>>,
    metrics: Option<Arc<dyn MetricsProvider>>,
    #[cfg(feature = "prometheus")]
    reconcile_metrics: Option<ControllerMetrics>,
    stats: Arc<WorkerCounters>,
    caches: Arc<Caches>,
    ring: Option<Arc<ShardRing>>,
    /// The informers that follow the ring's shard: the primary's, then owned children's.
    followers: Vec<source::Follower>,
}

impl<K> fmt::Debug for Controller<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.name)
            .field("sources", &(self.sources.len() + 1))
            .field("owns_its_informer", &self.owned.is_some())
            .field("workers", &self.workers)
            .field("reconcile_timeout", &self.reconcile_timeout)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("startup_grace", &self.startup_grace)
            .field("own_writes", &self.caches.mode())
            .finish_non_exhaustive()
    }
}

impl<K> Controller<K>
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
    K::Scope: FactoryScope,
{
    /// A controller named `name` (logs, metrics, the queue) reconciling the objects of
    /// `primary`, an informer someone else runs (a factory, a manager).
    pub fn new(name: impl Into<String>, primary: InformerHandle<K>) -> Self {
        let followers = vec![source::Follower::primary(primary.clone())];
        let caches = Arc::new(Caches::default());
        caches.register(primary.clone());
        Self {
            name: name.into(),
            primary,
            owned: None,
            predicate: Predicate::any(),
            sources: Vec::new(),
            workers: 1,
            turns: None,
            reconcile_timeout: None,
            shutdown_timeout: Duration::from_secs(30),
            startup_grace: Duration::from_secs(10),
            rate_limiter: None,
            metrics: None,
            #[cfg(feature = "prometheus")]
            reconcile_metrics: None,
            stats: Arc::default(),
            caches,
            ring: None,
            followers,
        }
    }

    /// A controller that runs its primary informer itself: [`run`](Self::run) starts it
    /// and stops it before returning (client-go's sample controller, which owns its
    /// informer). The informer must not have run yet; one that runs cannot be passed.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use k8s_openapi::api::core::v1::Pod;
    /// use kube_client::Api;
    /// use kube_informer::{CancellationToken, Controller, ObjectKey, SharedInformer, retry_up_to, sync_by_key};
    ///
    /// # async fn demo(client: kube_client::Client) -> Result<(), kube_informer::Error> {
    /// let informer = SharedInformer::new(Api::<Pod>::namespaced(client, "default"));
    /// let controller = Controller::owning("pods", informer).workers(2);
    /// let store = controller.store();
    /// let sync = move |key: ObjectKey, _: Arc<()>| {
    ///     let pod = store.get_by_key(&key);
    ///     async move {
    ///         match pod {
    ///             Some(pod) => tracing::info!(%key, phase = ?pod.status.as_ref().and_then(|s| s.phase.as_deref()), "synced"),
    ///             None => tracing::info!(%key, "deleted"),
    ///         }
    ///         Ok::<(), std::convert::Infallible>(())
    ///     }
    /// };
    /// controller.run((sync_by_key(sync), retry_up_to(5), Arc::new(())), CancellationToken::new()).await
    /// # }
    /// ```
    pub fn owning(name: impl Into<String>, informer: SharedInformer<K>) -> Self {
        let mut controller = Self::new(name, informer.handle());
        controller.owned = Some(informer);
        controller
    }

    /// A controller named `name` that reconciles only the primaries in the slots of `ring`
    /// this replica holds: one controller split across replicas (see
    /// [`sharding`](crate::sharding)). Its primary is `factory`'s informer of `K` in
    /// `scope`, built to follow a shard: the controller gives it the ring's
    /// [`RingView::shard`] as the ring changes, so it caches only the slots this replica is
    /// dealt, holds, warms or owes. A primary is reconciled under the ring's
    /// [`SlotGuard`], so its slot is not handed over mid-reconcile; when this replica takes
    /// a slot, the slot's cached primaries are reconciled. Run the ring itself
    /// ([`ShardRing::run`]) beside the controller, or let a [`Manager`](crate::Manager)
    /// do both ([`Manager::sharded_controller`](crate::Manager::sharded_controller)).
    ///
    /// Children given to [`owns`](Self::owns) follow their parent when their informer was
    /// built with a shard (say [`Shard::everything`] of [`ShardField::ControllerUid`]): it
    /// then caches only the children whose controller owner is in this replica's shard.
    /// The API server cannot select on an owner, so every child is still sent to every
    /// replica and the informer keeps its own; the saving is the cache's memory, not the
    /// traffic. Children of an informer built without a shard are all cached, and those
    /// of other replicas' parents are dropped at the reconcile, as any key outside the
    /// held slots is.
    ///
    /// [`Shard::everything`]: crate::list_watch::Shard::everything
    /// [`ShardField::ControllerUid`]: crate::list_watch::ShardField::ControllerUid
    /// [`RingView::shard`]: crate::sharding::RingView::shard
    /// [`SlotGuard`]: crate::sharding::SlotGuard
    pub fn sharded(
        name: impl Into<String>,
        factory: &InformerFactory,
        scope: Scope,
        ring: &Arc<ShardRing>,
    ) -> Self
    where
        K: TypedResource,
    {
        // Replaced by the ring's shard before the informer lists (see `run`).
        let scope = scope.shard(Shard::everything(ShardField::Uid));
        let mut controller = Self::new(name, factory.informer::<K>(scope));
        ring.expect_handover();
        controller.ring = Some(ring.clone());
        controller
    }

    /// The controller's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The primary informer.
    pub fn informer(&self) -> InformerHandle<K> {
        self.primary.clone()
    }

    /// The primary informer's cache.
    pub fn store(&self) -> Store<K> {
        self.primary.store()
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
        let mut controller = self;
        if children.shard().is_some() {
            controller
                .followers
                .push(source::Follower::children(children.clone()));
        }
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
        controller.mapped(children, Arc::new(owner), predicate)
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
        self.mapped(others, Arc::new(map), predicate)
    }

    /// Reconciles every primary that refers to a changed object of `others`: `refers`
    /// names the objects a primary refers to (the ConfigMap a Deployment names, say). The
    /// controller indexes its primaries by them (client-go's indexer, controller-runtime's
    /// field index), so a change to one object reconciles exactly the primaries naming it.
    ///
    /// ```no_run
    /// use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
    /// use kube_informer::{Controller, InformerFactory, ObjectKey, Scope};
    ///
    /// # fn doc(factory: InformerFactory) {
    /// let scope = Scope::namespace("web");
    /// let controller = Controller::new("deployments", factory.informer::<Deployment>(scope.clone()))
    ///     .watches_referenced(factory.informer::<ConfigMap>(scope), |d: &Deployment| {
    ///         let namespace = d.metadata.namespace.as_deref();
    ///         let named = d.metadata.annotations.as_ref().and_then(|a| a.get("example.com/config"));
    ///         named.map(|name| ObjectKey::new(namespace, name)).into_iter().collect()
    ///     });
    /// # }
    /// ```
    #[must_use]
    pub fn watches_referenced<O>(
        self,
        others: InformerHandle<O>,
        refers: impl Fn(&K) -> Vec<ObjectKey> + Send + Sync + 'static,
    ) -> Self
    where
        O: Resource + Send + Sync + 'static,
    {
        let index = format!("references of {}", std::any::type_name::<O>());
        let keys = move |primary: &K| refers(primary).iter().map(ToString::to_string).collect();
        if let Err(error) = self.primary.add_indexer(&index, keys) {
            // Referring to one kind twice: the first index stands, and serves both.
            warn!(controller = %self.name, %error, "watches_referenced: an index of these references exists already");
        }
        self.watches_by_index(others, &index)
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
        self.mapped(others, Arc::new(map), Predicate::any())
    }

    fn mapped<O>(
        mut self,
        informer: InformerHandle<O>,
        map: Mapper<O>,
        predicate: Predicate<O>,
    ) -> Self
    where
        O: Resource + Send + Sync + 'static,
    {
        self.caches.register(informer.clone());
        self.sources.push(source::mapped(informer, map, predicate));
        self
    }

    /// Reconciles every key `keys` yields, as it yields it (kube-runtime's
    /// `reconcile_on`): for changes the informers cannot see. A key whose object is not
    /// cached is reconciled as [`ReconcileRequest::Deleted`] (with no last state unless the
    /// informer saw it go), so the reconcile can clean up after an object deleted while no
    /// controller ran. The stream is polled from the start of [`run`](Self::run) until it
    /// ends or the controller stops; keys it yields before the caches have synced are
    /// reconciled once they have.
    #[must_use]
    pub fn reconcile_on(mut self, keys: impl Stream<Item = ObjectKey> + Send + 'static) -> Self {
        self.sources.push(source::stream(keys));
        self
    }

    /// Reconciles the keys `scan` returns once the primary's cache has synced and every
    /// `period` after: a periodic look at an external system for what it still holds (the
    /// routes, records or buckets of objects deleted while no controller ran), so the
    /// reconcile can clean up after them. A scan that fails should log why and return no
    /// keys; the next one comes a period later.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use k8s_openapi::api::core::v1::Service;
    /// # use kube_informer::{Controller, InformerHandle, ObjectKey};
    /// # async fn keys_in_my_database() -> Vec<ObjectKey> { Vec::new() }
    /// # fn doc(services: InformerHandle<Service>) {
    /// let store = services.store();
    /// let controller = Controller::new("services", services).reconcile_every(Duration::from_secs(300), move || {
    ///     let store = store.clone();
    ///     async move {
    ///         // Records whose Service is gone are reconciled as deleted.
    ///         keys_in_my_database().await.into_iter().filter(|key| !store.contains_key(key)).collect()
    ///     }
    /// });
    /// # }
    /// ```
    #[must_use]
    pub fn reconcile_every<F, Fut>(self, period: Duration, scan: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<ObjectKey>> + Send + 'static,
    {
        let primary = self.primary.clone();
        let scan = Arc::new(scan);
        let keys = futures::stream::unfold(true, move |first| {
            let (primary, scan) = (primary.clone(), scan.clone());
            async move {
                if first {
                    primary.wait_synced().await;
                } else {
                    tokio::time::sleep(period).await;
                }
                Some((futures::stream::iter(scan().await), false))
            }
        });
        self.reconcile_on(futures::StreamExt::flatten(keys))
    }

    /// Whether reads through the [controller's client](Self::client) wait for the cache
    /// to observe the client's own writes (default: they do, for at most 10 s).
    #[must_use]
    pub fn own_writes(self, own_writes: OwnWrites) -> Self {
        self.caches.set_mode(own_writes);
        self
    }

    /// A client that writes as this controller (its name is the field manager) and
    /// reads its informers' caches, waiting until they have observed its own writes; see
    /// [`ControllerClient`]. Clones share what was written; give one to the reconcile
    /// through its context.
    pub fn client(&self, client: kube_client::Client) -> ControllerClient {
        ControllerClient::new(client, self.caches.clone(), &self.name)
    }

    /// What the reads of the controller's clients do about its own writes, readable while
    /// it runs and after.
    pub fn own_write_stats(&self) -> LiveStats<OwnWriteStats> {
        let caches = self.caches.clone();
        LiveStats::new(move || caches.stats())
    }

    /// [`sharded`](Self::sharded) for an informer this crate's tests build.
    #[cfg(test)]
    pub(crate) fn sharded_on(mut self, ring: Arc<ShardRing>) -> Self {
        ring.expect_handover();
        self.ring = Some(ring);
        self
    }

    /// The ring the controller is [sharded](Self::sharded) on, if any.
    pub fn ring(&self) -> Option<&Arc<ShardRing>> {
        self.ring.as_ref()
    }

    /// The informers that follow the ring: the primary's, and owned children's built with
    /// a shard.
    #[cfg(feature = "manager")]
    pub(crate) fn followers(&self) -> Vec<Follower> {
        self.followers.clone()
    }

    /// Reconciles this many keys at once (at least one; default one).
    #[must_use]
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// Takes a turn of `tenant`'s [`FairShare`] before each reconcile, and gives it back
    /// after: the controllers of a fleet's clusters share the fleet's workers fairly, so
    /// a cluster with a backlog delays another cluster's single change by at most one
    /// reconcile. Give this controller as many [`workers`](Self::workers) as the share
    /// has turns, so that it can use them all while the other clusters are idle.
    ///
    /// [`FairShare`]: crate::workqueue::FairShare
    #[must_use]
    pub fn share_workers(mut self, tenant: Tenant) -> Self {
        self.turns = Some(tenant);
        self
    }

    /// Cancels a reconcile that runs longer than `timeout` and hands the error policy a
    /// [`ReconcileError::TimedOut`] (default: no limit).
    #[must_use]
    pub fn reconcile_timeout(mut self, timeout: Duration) -> Self {
        self.reconcile_timeout = Some(timeout);
        self
    }

    /// How long [`run`](Self::run) waits, once cancelled, for its workers to end (default
    /// 30 s): a running reconcile is dropped at its next `.await`, so only one that blocks
    /// its thread takes longer.
    #[must_use]
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// How long a source's first sync may keep failing with an error that retrying cannot
    /// fix (403, 401, 404) before [`run`](Self::run) gives up with it (default 10 s). The
    /// grace covers permissions or CRDs applied moments before the controller starts,
    /// which the API server needs a moment to honour.
    #[must_use]
    pub fn startup_grace(mut self, grace: Duration) -> Self {
        self.startup_grace = grace;
        self
    }

    /// The limiter that spaces retries (default:
    /// [`default_controller_rate_limiter`]).
    #[must_use]
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<ObjectKey> + 'static) -> Self {
        self.rate_limiter = Some(Arc::new(limiter));
        self
    }

    /// Reports the queue's metrics to `provider` (a [`Manager`](crate::Manager)'s
    /// controllers report to its registry without being told).
    #[must_use]
    pub fn metrics(mut self, provider: impl MetricsProvider + 'static) -> Self {
        self.metrics = Some(Arc::new(provider));
        self
    }

    /// Whether queue metrics are reported somewhere already.
    #[cfg(feature = "manager")]
    pub(crate) fn has_metrics(&self) -> bool {
        self.metrics.is_some()
    }

    /// Records controller-runtime's reconcile metrics (`controller_runtime_*`) in
    /// `metrics` (a [`Manager`](crate::Manager)'s controllers record them in its registry
    /// without being told).
    #[cfg(feature = "prometheus")]
    #[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
    #[must_use]
    pub fn reconcile_metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.reconcile_metrics = Some(metrics);
        self
    }

    /// Whether reconcile metrics are recorded somewhere already.
    #[cfg(feature = "manager")]
    pub(crate) fn has_reconcile_metrics(&self) -> bool {
        self.reconcile_metrics.is_some()
    }

    /// What the workers do, readable while the controller runs and after.
    pub fn stats(&self) -> LiveStats<ControllerStats> {
        let counters = self.stats.clone();
        LiveStats::new(move || counters.snapshot())
    }

    /// Runs the controller until `cancel` fires, reconciling with `reconciler` (a
    /// [`Reconciler`], or the closure form `(reconcile, error_policy, context)`):
    /// registers the sources' handlers, waits for their informers to sync (informers someone else runs must be started, e.g. by
    /// [`InformerFactory::start`](crate::InformerFactory::start); an
    /// [owned](Self::owning) one is started here), then reconciles.
    ///
    /// # Errors
    ///
    /// [`Error::InformerStopped`] when a source's informer has stopped; an error that
    /// retrying cannot fix (missing RBAC, an unknown resource) from a source's first sync
    /// that lasts past the [startup grace](Self::startup_grace).
    pub async fn run(
        self,
        reconciler: impl Reconciler<K>,
        cancel: CancellationToken,
    ) -> Result<(), Error> {
        let Self {
            name,
            primary,
            owned,
            predicate,
            mut sources,
            workers,
            turns,
            reconcile_timeout,
            shutdown_timeout,
            startup_grace,
            rate_limiter,
            metrics,
            #[cfg(feature = "prometheus")]
            reconcile_metrics,
            stats,
            caches,
            ring,
            followers,
        } = self;
        #[cfg(feature = "prometheus")]
        if let Some(metrics) = &reconcile_metrics {
            caches.set_recorder(metrics.own_writes_of(&name));
        }
        let queue_config = QueueConfig {
            name: name.clone(),
            metrics,
        };
        let limiter = rate_limiter.unwrap_or_else(|| Arc::new(default_controller_rate_limiter()));
        let queue = RateLimitingQueue::with_config(limiter, queue_config);
        let deleted: last_state::LastStates<K> = Arc::default();
        let parked = source::Parked::default();

        sources.insert(
            0,
            source::primary(primary.clone(), predicate, deleted.clone()),
        );
        #[cfg(feature = "opentelemetry")]
        let spans = Arc::new(crate::telemetry::spans::QueuedSpans::default());
        let enqueue = Enqueue {
            queue: queue.clone(),
            controller: Arc::from(name.as_str()),
            #[cfg(feature = "opentelemetry")]
            spans: spans.clone(),
        };
        // Reported from before the first list (as following nothing), so no slot is
        // handed to this replica before its cache can take the slot's changes.
        let _handover = ring.as_ref().map(|ring| {
            ring.report_handover(Arc::new(handover::CacheHandover {
                handler: name.clone(),
                primary: primary.clone(),
                queue: queue.clone(),
                deleted: deleted.clone(),
                parked: parked.clone(),
                slots: ring.view().borrow().slots,
                relist_asked: std::sync::Mutex::default(),
            }))
        });
        let mut registered = Vec::new();
        let mut syncs = Vec::new();
        for source in sources {
            match source(enqueue.clone(), startup_grace) {
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
        // Started after its handler is registered, and stopped by this run alone (not by
        // the caller's token).
        let owned: Option<RunningInformer<K>> =
            owned.map(|informer| informer.spawn(CancellationToken::new()));
        let stop_owned = |owned: Option<RunningInformer<K>>| async move {
            if let Some(informer) = owned {
                informer.stop().await;
            }
        };

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
                caches.stop();
                queue.shutdown();
                remove_all(registered);
                stop_owned(owned).await;
                return Ok(());
            }
            Some(Err(error)) => {
                error!(controller = %name, error = %error_chain(&error), "a source cannot sync; stopping");
                queue.shutdown();
                remove_all(registered);
                stop_owned(owned).await;
                return Err(error);
            }
            Some(Ok(())) => {}
        }
        info!(controller = %name, workers, objects = primary.store().len(), "caches synced; starting workers");

        let follower = ring.clone().map(|ring| {
            let follow = source::follow_ring(
                ring,
                followers,
                primary.clone(),
                queue.clone(),
                parked.clone(),
                deleted.clone(),
            );
            tokio::spawn(follow)
        });
        let worker = Arc::new(Worker {
            ring,
            parked,
            primary_writes: caches.cache::<K>(),
            caches: caches.clone(),
            name: name.clone(),
            queue: queue.clone(),
            primary,
            deleted,
            reconciler,
            reconcile_timeout,
            turns,
            stats,
            #[cfg(feature = "prometheus")]
            recorder: reconcile_metrics.map(|m| m.for_controller(&name, workers)),
            cancel: cancel.clone(),
            #[cfg(feature = "opentelemetry")]
            spans,
        });
        let mut tasks = tokio::task::JoinSet::new();
        for id in 0..workers {
            let worker = worker.clone();
            tasks.spawn(async move { worker.run(id).await });
        }

        cancel.cancelled().await;
        debug!(controller = %name, "shutting down");
        caches.stop();
        queue.shutdown();
        let dropped = join_within(&mut tasks, shutdown_timeout, |_| {}).await;
        if dropped > 0 {
            warn!(controller = %name, timeout = ?shutdown_timeout, running = dropped, "reconciles still running at the shutdown deadline; dropped");
        }
        if let Some(follower) = follower {
            follower.abort();
        }
        remove_all(registered);
        stop_owned(owned).await;
        info!(controller = %name, "stopped");
        Ok(())
    }
}
