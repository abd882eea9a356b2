//! The manager: runs a factory's informers, controllers and other tasks, serves probes and
//! metrics, and shuts all of it down within a deadline (controller-runtime's `Manager`).
//! The full documentation is on [`Manager`].

mod http;

use std::{
    error::Error as StdError, future::Future, net::SocketAddr, pin::Pin, sync::Arc, time::Duration,
};

use kube_client::Client;
use prometheus_client::registry::Registry;
use tokio::{net::TcpListener, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

#[cfg(feature = "leader-election")]
use crate::leader_election::{LeaderElectionConfig, LeaderElectionError, LeaderElector};
use kube_core::Resource;

use crate::{
    controller::{Controller, ControllerClient, ControllerMetrics, Reconciler},
    error::error_chain,
    events::{
        Recorder, Reporter,
        metrics::{Recorders, register_event_metrics},
    },
    fleet::FleetView,
    informer::{
        FactoryScope, InformerFactory, Scope, TypedResource, metrics::register_informer_metrics,
    },
    sharding::{
        RingConfig, RingError, RingView, ShardRing,
        metrics::{Rings, register_ring_metrics},
    },
    task::join_within,
    workqueue::PrometheusMetrics,
};

/// Without the `leader-election` feature, nothing to configure or run.
#[cfg(not(feature = "leader-election"))]
type LeaderElectionConfig = std::convert::Infallible;
#[cfg(not(feature = "leader-election"))]
type LeaderElector = std::convert::Infallible;
#[cfg(not(feature = "leader-election"))]
type LeaderElectionError = std::convert::Infallible;

/// Why a manager could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// The probe or metrics address could not be bound.
    #[error("cannot serve {what} on {addr}: {source}")]
    Bind {
        /// `health probes` or `metrics`.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The cluster the flags name cannot be reached or its configuration read.
    #[error("cannot connect to the cluster: {0}")]
    Connect(#[source] crate::error::Error),
    /// The shard ring the flags ask for cannot run (timings that cannot fence).
    #[error(transparent)]
    Ring(#[from] RingError),
    /// Leader election could not start (an invalid configuration) or this replica lost
    /// the lease.
    #[error(transparent)]
    LeaderElection(LeaderElectionError),
    /// A task (a controller, a runnable) ended with an error, which stopped the others.
    #[error("{task} failed: {source}")]
    Task {
        /// The task's name.
        task: String,
        /// Its error.
        #[source]
        source: TaskError,
    },
}

/// A task's error, whatever its type.
type TaskError = Box<dyn StdError + Send + Sync>;
type Task = Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;
type TaskFn = Box<dyn FnOnce(CancellationToken) -> Task + Send>;
/// Where `/healthz` and `/readyz` are served by default, on loopback: a port the usual
/// local services (8080, 8081) leave free.
pub(crate) const DEFAULT_PROBE_ADDRESS: &str = "127.0.0.1:9808";
/// Where `/metrics` is served by default, on loopback.
pub(crate) const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9807";

/// Gives a sharded controller's informer its ring's first view, before it lists.
type InitialShard = Box<dyn FnOnce(&RingView) + Send>;

/// How long the informers' start waits for the shard rings' first look at their Leases; a
/// ring that takes longer has its informers relist once it has looked.
const FIRST_RING_VIEW_WAIT: Duration = Duration::from_secs(10);

/// Runs a factory's informers and any number of controllers and other tasks, with
/// controller-runtime's endpoints and shutdown (controller-runtime's `Manager`).
///
/// - **Probes** on [`probe_address`](Self::probe_address) (default `127.0.0.1:9808`):
///   `/healthz` answers 200 while the manager runs; `/readyz` answers 200 once every
///   informer of the factory has synced, 503 before.
/// - **Metrics** on [`metrics_address`](Self::metrics_address) (default
///   `127.0.0.1:9807`): `/metrics` in the OpenMetrics text format, with the workqueue
///   metrics ([`workqueue_metrics`](Self::workqueue_metrics)), the reconcile metrics
///   ([`controller_metrics`](Self::controller_metrics)), the informers' gauges and counters
///   (`informer_objects`, `informer_synced`, `informer_users`,
///   `informer_last_sync_resource_version`,
///   `informer_lists_total`, `informer_watch_restarts_total`, and the cache's working set:
///   `informer_working_set_bytes`, `_objects`, `_hits_total`, `_misses_total`,
///   `_evictions_total`), each event handler's lag (`informer_handler_waiting`,
///   `informer_handler_oldest_waiting_seconds`, `informer_handler_delivered_total`,
///   `informer_handler_coalesced_total`, the histogram `informer_handler_processing_seconds`; a controller's handlers are named
///   after it), client-go's informer metrics under their own names and labels (`name`,
///   `group`, `version`, `resource`: `informer_queued_items`,
///   `informer_store_resource_version`, the histogram
///   `informer_processing_latency_seconds`), client-go's REST client metrics for the
///   clients built by [`client`](crate::client::client) or
///   [`ClusterSource`](crate::ClusterSource) (`rest_client_requests_total{code, host,
///   method}`, the histogram `rest_client_request_duration_seconds{host, verb}`), and
///   whatever is added to the
///   [`registry`](Self::registry). Both
///   bind to loopback unless told otherwise, and read request headers within 10 s.
/// - **Controllers** ([`controller`](Self::controller), [`add_controller`](Self::add_controller))
///   report to the registry's metrics and run as tasks.
/// - **Sharded controllers** ([`shard_ring`](Self::shard_ring),
///   [`sharded_controller`](Self::sharded_controller)) split one controller's objects
///   across replicas on a [shard ring](crate::sharding); they run on every replica, with
///   or without leader election, and the ring's metrics are served (`shard_ring_members`,
///   `shard_ring_slots_assigned`, `shard_ring_slots_held`, `shard_ring_objects`,
///   `shard_ring_slots_taken_total`, `_released_total`, `_lost_total`,
///   `shard_ring_handover_seconds`).
/// - **Tasks** ([`add`](Self::add)) start after the factory's informers, each with a
///   child of the manager's token; one that fails stops the others, and
///   [`run`](BoundManager::run) returns its error, logged with its whole source chain.
/// - **Shutdown**: on cancellation (e.g. [`cancel_on_signals`]) every task is cancelled
///   and gets until the [shutdown timeout](Self::shutdown_timeout) (30 s) to end; then
///   the informers stop.
///
/// ```no_run
/// use std::sync::Arc;
/// use k8s_openapi::api::{apps::v1::{Deployment, ReplicaSet}};
/// use kube_informer::{Action, Manager, ReconcileRequest, Scope, cancel_on_signals, retry_with_backoff};
///
/// # async fn doc(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let mut manager = Manager::new(client);
/// let scope = Scope::namespace("web");
/// let deployments = manager
///     .controller::<Deployment>("deployments", scope.clone())
///     .owns(manager.factory().informer::<ReplicaSet>(scope));
/// let reconcile = |_: ReconcileRequest<Deployment>, _: Arc<()>| async {
///     Ok::<_, kube_client::Error>(Action::done())
/// };
/// manager.add_controller(deployments, (reconcile, retry_with_backoff(), Arc::new(())));
/// manager.bind().await?.run(cancel_on_signals()).await?;
/// # Ok(()) }
/// ```
pub struct Manager {
    factory: InformerFactory,
    registry: Registry,
    workqueue_metrics: PrometheusMetrics,
    controller_metrics: ControllerMetrics,
    tasks: Vec<(String, TaskFn)>,
    probe_address: Option<SocketAddr>,
    metrics_address: Option<SocketAddr>,
    shutdown_timeout: Duration,
    leader_election: Option<LeaderElectionConfig>,
    /// The event recorders handed out, flushed at shutdown and read at each scrape.
    recorders: Recorders,
    /// The shard rings this replica takes part in, read at each scrape.
    rings: Rings,
    /// Tasks every replica runs, leading or not: the rings and the sharded controllers.
    replica_tasks: Vec<(String, TaskFn)>,
    initial_shards: Vec<(Arc<ShardRing>, InitialShard)>,
    /// What the controllers watch unless told otherwise.
    scope: Scope,
    /// The ring the flags made this replica take part in.
    ring: Option<Arc<ShardRing>>,
    /// Fleets whose clusters `/readyz` names when they are behind.
    fleets: Vec<FleetView>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("factory", &self.factory)
            .field(
                "tasks",
                &self.tasks.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("probe_address", &self.probe_address)
            .field("metrics_address", &self.metrics_address)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .finish_non_exhaustive()
    }
}

impl Manager {
    /// A manager whose factory's informers use `client`.
    pub fn new(client: Client) -> Self {
        Self::with_factory(InformerFactory::new(client))
    }

    /// A manager of `factory` (one built
    /// [with defaults](InformerFactory::with_defaults), say) and its informers.
    pub fn with_factory(factory: InformerFactory) -> Self {
        let mut registry = Registry::default();
        let workqueue_metrics = PrometheusMetrics::new(&mut registry);
        let controller_metrics = ControllerMetrics::new(&mut registry);
        register_informer_metrics(&mut registry, factory.clone());
        crate::client::metrics::register_rest_client_metrics(&mut registry);
        let recorders = Recorders::default();
        register_event_metrics(&mut registry, recorders.clone());
        let rings = Rings::default();
        register_ring_metrics(&mut registry, rings.clone());
        Self {
            factory,
            registry,
            workqueue_metrics,
            controller_metrics,
            tasks: Vec::new(),
            probe_address: DEFAULT_PROBE_ADDRESS.parse().ok(),
            metrics_address: DEFAULT_METRICS_ADDRESS.parse().ok(),
            shutdown_timeout: Duration::from_secs(30),
            leader_election: None,
            recorders,
            rings,
            replica_tasks: Vec::new(),
            initial_shards: Vec::new(),
            scope: Scope::all(),
            ring: None,
            fleets: Vec::new(),
        }
    }

    /// The manager an operator's standard flags describe ([`cli::OperatorArgs`]): a client
    /// of the cluster they name, probes and metrics where they say, leader election when
    /// `--leader-elect` is given, the shard ring `--shard-ring` names (see
    /// [`ring`](Self::ring)), and `--namespace` as the [scope](Self::scope).
    ///
    /// # Errors
    ///
    /// [`ManagerError::Connect`] when the cluster's configuration cannot be read;
    /// [`ManagerError::Ring`] for ring timings that cannot fence.
    ///
    /// [`cli::OperatorArgs`]: crate::cli::OperatorArgs
    #[cfg(feature = "cli")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cli")))]
    pub async fn from_args(args: &crate::cli::OperatorArgs) -> Result<Self, ManagerError> {
        let client = args
            .cluster()
            .client()
            .await
            .map_err(ManagerError::Connect)?;
        Self::new(client).configure(args)
    }

    /// This manager (of a factory with defaults of its own, say) configured as
    /// [`from_args`](Self::from_args) configures one, except for the client.
    ///
    /// # Errors
    ///
    /// [`ManagerError::Ring`] for ring timings that cannot fence.
    #[cfg(feature = "cli")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cli")))]
    pub fn configure(self, args: &crate::cli::OperatorArgs) -> Result<Self, ManagerError> {
        #[allow(unused_mut)]
        let mut manager = self
            .probe_address(args.probe_address())
            .metrics_address(args.metrics_address())
            .with_scope(args.scope());
        #[cfg(feature = "leader-election")]
        if args.leader_elect {
            let config = LeaderElectionConfig::new(args.lease(args.leader_election_id()));
            info!(lease = %format!("{}/{}", config.namespace, config.name), identity = %config.identity, "leader election enabled");
            manager = manager.leader_election(config);
        }
        if let Some(ring) = &args.shard_ring {
            let config = RingConfig::new(args.lease(ring)).slots(args.shard_slots);
            let ring = manager.shard_ring(config)?;
            manager.ring = Some(ring);
        }
        Ok(manager)
    }

    /// What controllers and informers watch unless told otherwise: every namespace, or
    /// the one [`with_scope`](Self::with_scope) (or `--namespace`) gave.
    pub fn scope(&self) -> Scope {
        self.scope.clone()
    }

    /// Watches `scope` unless told otherwise (see [`scope`](Self::scope)).
    #[must_use]
    pub fn with_scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    /// The shard ring the flags made this replica take part in, for
    /// [`sharded_controller`](Self::sharded_controller).
    pub fn ring(&self) -> Option<&Arc<ShardRing>> {
        self.ring.as_ref()
    }

    /// The client a reconcile of `controller` reads and writes with (see
    /// [`ControllerClient`]): the manager's, writing as the controller.
    pub fn client_for<K>(&self, controller: &Controller<K>) -> ControllerClient
    where
        K: Resource<DynamicType = ()> + Send + Sync + 'static,
        K::Scope: FactoryScope,
    {
        controller.client(self.factory.client())
    }

    /// Takes part in the shard ring `config` names, as its identity: the manager runs the
    /// ring on this replica from before its informers start (so they list only their
    /// shard) until it shuts down (when the ring lets go of its slots, so the other
    /// replicas take them at once), and serves its metrics. Give the ring to
    /// [`sharded_controller`](Self::sharded_controller).
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube_informer::{
    ///     Action, Manager, ReconcileRequest, Scope, lease::LeaseConfig, retry_with_backoff,
    ///     sharding::RingConfig,
    /// };
    ///
    /// # async fn doc(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut manager = Manager::new(client);
    /// // Every replica runs this, each with its own identity (by default its Pod's name
    /// // and a random suffix).
    /// let ring = manager.shard_ring(RingConfig::new(LeaseConfig::new("config-maps")))?;
    /// let controller =
    ///     manager.sharded_controller::<ConfigMap>("config-maps", Scope::namespace("web"), &ring);
    /// let reconcile = |_: ReconcileRequest<ConfigMap>, _: Arc<()>| async {
    ///     Ok::<_, kube_client::Error>(Action::done())
    /// };
    /// manager.add_controller(controller, (reconcile, retry_with_backoff(), Arc::new(())));
    /// manager.bind().await?.run(kube_informer::cancel_on_signals()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`RingError::Config`] for timings that cannot fence.
    pub fn shard_ring(&mut self, config: RingConfig) -> Result<Arc<ShardRing>, RingError> {
        let ring = Arc::new(ShardRing::new(self.factory.client(), config)?);
        self.rings.add(ring.clone());
        let name = format!("shard ring {}", ring.config().name);
        let running = ring.clone();
        self.replica_tasks.push((
            name,
            Box::new(move |cancel| {
                Box::pin(async move { running.run(cancel).await.map_err(|e| Box::new(e) as _) })
            }),
        ));
        Ok(ring)
    }

    /// A controller of the factory's informer of `K` in `scope`, split across the
    /// replicas of `ring` ([`Controller::sharded`]): its informer caches only the slots
    /// this replica is dealt or holds, and it reconciles only the ones it holds. Give it
    /// to [`add_controller`](Self::add_controller); it runs on every replica, whether or
    /// not this one leads.
    pub fn sharded_controller<K>(
        &self,
        name: impl Into<String>,
        scope: Scope,
        ring: &Arc<ShardRing>,
    ) -> Controller<K>
    where
        K: TypedResource,
        K::Scope: FactoryScope,
    {
        Controller::sharded(name, &self.factory, scope, ring)
    }

    /// An event recorder for the controller named `controller` (its
    /// `reportingController`, e.g. `example.com/traefik-operator`), reporting as this
    /// replica: its leader election identity when leader election is on, else its Pod
    /// name. The manager writes what it buffered when it shuts down, within the shutdown
    /// timeout, and serves its counts on `/metrics` (`events_published_total`,
    /// `events_written_total`, `events_dropped_total` by reason).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime: the recorder's writer is a task.
    pub fn recorder(&mut self, controller: impl Into<String>) -> Recorder {
        #[allow(unused_mut)]
        let mut reporter = Reporter::new(controller);
        #[cfg(feature = "leader-election")]
        if let Some(config) = &self.leader_election {
            reporter = reporter.instance(&config.identity);
        }
        let recorder = Recorder::new(self.factory.client(), reporter);
        self.recorders.add(recorder.clone());
        recorder
    }

    /// Runs the tasks only while this replica holds the Lease `config` names (the
    /// informers run on every replica, so a standby takes over with a warm cache). A
    /// replica that loses the lease stops its tasks before another can acquire it, and
    /// [`run`](BoundManager::run) returns [`ManagerError::LeaderElection`] (restart it as a
    /// candidate, as controller-runtime's managers do); `/healthz` fails while the
    /// leader's renewals are stalled.
    #[cfg(feature = "leader-election")]
    #[cfg_attr(docsrs, doc(cfg(feature = "leader-election")))]
    #[must_use]
    pub fn leader_election(mut self, config: LeaderElectionConfig) -> Self {
        self.leader_election = Some(config);
        self
    }

    /// The informer factory whose informers the manager starts and stops.
    pub fn factory(&self) -> &InformerFactory {
        &self.factory
    }

    /// Reports a [`Fleet`](crate::fleet::Fleet) (its [`view`](crate::fleet::Fleet::view)):
    /// its per-cluster metrics on `/metrics` ([`FleetView::register_metrics`]), and on
    /// `/readyz` the clusters that are behind, named with why (unreachable since when,
    /// not synced, backing off). A cluster behind does not fail the probe: one member
    /// down must not take the replica out of service for every other.
    pub fn report_fleet(&mut self, view: FleetView) {
        view.register_metrics(&mut self.registry);
        self.fleets.push(view);
    }

    /// The registry served on `/metrics`, to add metrics of your own.
    pub fn registry(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The workqueue metrics, for queues of your own (the manager's controllers report to
    /// it already).
    pub fn workqueue_metrics(&self) -> PrometheusMetrics {
        self.workqueue_metrics.clone()
    }

    /// The reconcile metrics (the manager's controllers record in it already).
    pub fn controller_metrics(&self) -> ControllerMetrics {
        self.controller_metrics.clone()
    }

    /// A controller of the factory's informer of `K` in `scope`; give it to
    /// [`add_controller`](Self::add_controller) once its sources are added.
    pub fn controller<K>(&self, name: impl Into<String>, scope: Scope) -> Controller<K>
    where
        K: TypedResource,
        K::Scope: FactoryScope,
    {
        Controller::new(name, self.factory.informer::<K>(scope))
    }

    /// Runs `controller` as one of the manager's tasks, named after it: started once the
    /// informers are, only while leading when leader election is on (a
    /// [sharded](Controller::sharded) one on every replica), cancelled with the
    /// manager and given its shutdown timeout; a controller that fails (a source that
    /// cannot sync) stops the manager with its error. Its queue and reconcile metrics go
    /// to the manager's registry, unless it was given metrics of its own.
    pub fn add_controller<K>(&mut self, controller: Controller<K>, reconciler: impl Reconciler<K>)
    where
        K: Resource<DynamicType = ()> + Send + Sync + 'static,
        K::Scope: FactoryScope,
    {
        let mut controller = controller;
        if !controller.has_metrics() {
            controller = controller.metrics(self.workqueue_metrics());
        }
        if !controller.has_reconcile_metrics() {
            controller = controller.reconcile_metrics(self.controller_metrics());
        }
        let name = controller.name().to_owned();
        let Some(ring) = controller.ring().cloned() else {
            self.add(name, move |cancel| controller.run(reconciler, cancel));
            return;
        };
        let store = controller.store();
        self.rings
            .follow(&ring, name.clone(), Box::new(move || store.len()));
        let followers = controller.followers();
        let initial: InitialShard = Box::new(move |view| {
            for follower in &followers {
                follower.follow(view);
            }
        });
        self.initial_shards.push((ring, initial));
        let task: TaskFn = Box::new(move |cancel| {
            Box::pin(async move {
                controller
                    .run(reconciler, cancel)
                    .await
                    .map_err(|e| Box::new(e) as _)
            })
        });
        self.replica_tasks.push((name, task));
    }

    /// Where `/healthz` and `/readyz` are served; `None` serves none.
    #[must_use]
    pub fn probe_address(mut self, address: Option<SocketAddr>) -> Self {
        self.probe_address = address;
        self
    }

    /// Where `/metrics` is served; `None` serves none.
    #[must_use]
    pub fn metrics_address(mut self, address: Option<SocketAddr>) -> Self {
        self.metrics_address = address;
        self
    }

    /// How long tasks get to end once the manager is cancelled (default 30 s).
    #[must_use]
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Adds a task (a controller's `run`, a periodic job, ...), started with a child of
    /// the manager's token once the informers have been started.
    pub fn add<F, Fut, E>(&mut self, name: impl Into<String>, task: F)
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: StdError + Send + Sync + 'static,
    {
        let task: TaskFn = Box::new(move |cancel| {
            Box::pin(async move { task(cancel).await.map_err(|e| Box::new(e) as _) })
        });
        self.tasks.push((name.into(), task));
    }

    /// Binds the probe and metrics addresses and runs until SIGINT or SIGTERM
    /// ([`cancel_on_signals`]): [`bind`](Self::bind) then [`run`](BoundManager::run).
    ///
    /// # Errors
    ///
    /// As [`bind`](Self::bind) and [`run`](BoundManager::run).
    pub async fn run(self) -> Result<(), ManagerError> {
        self.bind().await?.run(cancel_on_signals()).await
    }

    /// Binds the probe and metrics addresses (so a port in use fails here, before
    /// anything starts).
    ///
    /// # Errors
    ///
    /// [`ManagerError::Bind`] when an address cannot be bound.
    pub async fn bind(self) -> Result<BoundManager, ManagerError> {
        let bind = |what, addr| async move {
            match addr {
                None => Ok(None),
                Some(addr) => TcpListener::bind(addr)
                    .await
                    .map(Some)
                    .map_err(|source| ManagerError::Bind { what, addr, source }),
            }
        };
        let elector = match &self.leader_election {
            #[cfg(feature = "leader-election")]
            Some(config) => Some(Arc::new(
                LeaderElector::new(self.factory.client(), config.clone())
                    .map_err(ManagerError::LeaderElection)?,
            )),
            _ => None,
        };
        let probes = bind("health probes", self.probe_address).await?;
        let metrics = bind("metrics", self.metrics_address).await?;
        Ok(BoundManager {
            manager: self,
            probes,
            metrics,
            elector,
        })
    }
}

/// A [`Manager`] whose addresses are bound, ready to [`run`](Self::run).
#[derive(Debug)]
pub struct BoundManager {
    manager: Manager,
    probes: Option<TcpListener>,
    metrics: Option<TcpListener>,
    elector: Option<Arc<LeaderElector>>,
}

impl BoundManager {
    /// The address the probes are served on (with the port the system chose for port 0).
    pub fn probe_address(&self) -> Option<SocketAddr> {
        self.probes.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The address the metrics are served on.
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves the endpoints, starts the informers and the tasks, and runs until `cancel`
    /// fires or a task fails; then cancels every task, waits for them up to the shutdown
    /// timeout, and stops the informers.
    ///
    /// # Errors
    ///
    /// [`ManagerError::Task`]: the first task that failed.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), ManagerError> {
        let Self {
            manager,
            probes,
            metrics,
            elector,
        } = self;
        let Manager {
            factory,
            registry,
            tasks,
            shutdown_timeout,
            recorders,
            replica_tasks,
            initial_shards,
            fleets,
            ..
        } = manager;
        let elector: Option<Arc<LeaderElector>> = elector;
        let state = Arc::new(http::State::new(
            factory.clone(),
            registry,
            elector.clone(),
            fleets,
        ));
        let servers = CancellationToken::new();
        let mut server_tasks = JoinSet::new();
        for (listener, paths) in [(probes, http::PROBE_PATHS), (metrics, http::METRICS_PATHS)] {
            if let Some(listener) = listener {
                server_tasks.spawn(http::serve(listener, state.clone(), paths, servers.clone()));
            }
        }

        // Tasks of every replica (the rings, the sharded controllers) and the leader's
        // share one token: a failure on either side stops both.
        let stop = cancel.child_token();
        let replicas = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let failure = run_tasks(replica_tasks, stop.clone(), shutdown_timeout).await;
                stop.cancel();
                failure
            })
        };
        take_first_ring_views(initial_shards, &stop).await;

        // Every replica's caches start at once (a standby is warm when it takes over);
        // the leader's tasks run only while leading, when leader election is on.
        factory.start(&stop);
        let leading = match elector {
            #[cfg(feature = "leader-election")]
            Some(elector) => {
                info!("waiting to lead before starting the tasks");
                let work = |leading| run_tasks(tasks, leading, shutdown_timeout);
                match elector.run(stop.clone(), work).await {
                    Ok(Some(failure)) => failure,
                    Ok(None) => None,
                    Err(lost) => Some(ManagerError::LeaderElection(lost)),
                }
            }
            _ => run_tasks(tasks, stop.child_token(), shutdown_timeout).await,
        };
        stop.cancel();
        let replicas = match replicas.await {
            Ok(failure) => failure,
            Err(join) => Some(ManagerError::Task {
                task: "the replica's tasks".to_owned(),
                source: format!("panicked: {join}").into(),
            }),
        };
        let failure = leading.or(replicas);
        if tokio::time::timeout(shutdown_timeout, recorders.shutdown())
            .await
            .is_err()
        {
            warn!(timeout = ?shutdown_timeout, "events still unwritten at the shutdown deadline; dropped");
        }
        factory.shutdown().await;
        servers.cancel();
        while server_tasks.join_next().await.is_some() {}
        match failure {
            Some(error) => {
                error!(error = %error_chain(&error), "manager stopped");
                Err(error)
            }
            None => {
                info!("manager stopped");
                Ok(())
            }
        }
    }
}

/// Waits (up to [`FIRST_RING_VIEW_WAIT`]) for each ring's first look at its Leases and gives
/// its sharded informers that shard, so their first list is of their shard alone.
async fn take_first_ring_views(
    initial: Vec<(Arc<ShardRing>, InitialShard)>,
    cancel: &CancellationToken,
) {
    for (ring, give) in initial {
        let first = tokio::select! {
            () = cancel.cancelled() => return,
            first = tokio::time::timeout(FIRST_RING_VIEW_WAIT, ring.first_view()) => first,
        };
        match first {
            Ok(view) => give(&view),
            Err(_) => warn!(
                ring = %ring.config().name,
                waited = ?FIRST_RING_VIEW_WAIT,
                "no first look at the shard ring yet; its informers relist when it comes"
            ),
        }
    }
}

/// Runs `tasks` until `cancel` fires or one fails; then cancels the others and waits for
/// them up to `shutdown_timeout`. Returns the first failure.
async fn run_tasks(
    tasks: Vec<(String, TaskFn)>,
    cancel: CancellationToken,
    shutdown_timeout: Duration,
) -> Option<ManagerError> {
    let mut running = JoinSet::new();
    for (name, task) in tasks {
        let future = task(cancel.child_token());
        running.spawn(async move { (name, future.await) });
    }
    info!(tasks = running.len(), "tasks started");
    let mut failure = None;
    loop {
        tokio::select! {
            () = cancel.cancelled() => {
                info!("shutting down the tasks");
                break;
            }
            Some(done) = running.join_next() => {
                // A task that ends without an error leaves the others running.
                if let Some(error) = ended(done) {
                    failure = Some(error);
                    break;
                }
            }
        }
    }
    cancel.cancel();
    let dropped = join_within(&mut running, shutdown_timeout, |done| {
        if let Some(error) = ended(done) {
            failure.get_or_insert(error);
        }
    })
    .await;
    if dropped > 0 {
        warn!(timeout = ?shutdown_timeout, running = dropped, "tasks still running at the shutdown deadline; dropped");
    }
    failure
}

/// The error of a task that ended, if it failed (a panic counts as a failure).
fn ended(
    done: Result<(String, Result<(), TaskError>), tokio::task::JoinError>,
) -> Option<ManagerError> {
    match done {
        Ok((name, Ok(()))) => {
            info!(task = %name, "task ended");
            None
        }
        Ok((task, Err(source))) => Some(ManagerError::Task { task, source }),
        Err(join) if join.is_cancelled() => None,
        Err(join) => Some(ManagerError::Task {
            task: "a task".to_owned(),
            source: format!("panicked: {join}").into(),
        }),
    }
}

/// A token cancelled by the first Ctrl-C or `SIGTERM`; a second one exits the process at
/// once (status 130), for a shutdown that hangs.
pub fn cancel_on_signals() -> CancellationToken {
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    tokio::spawn(async move {
        let mut signals = Signals::new();
        signals.next().await;
        info!("signal received; shutting down (a second signal exits at once)");
        token.cancel();
        signals.next().await;
        warn!("second signal; exiting now");
        std::process::exit(130);
    });
    cancel
}

/// Ctrl-C and, on Unix, `SIGTERM`.
struct Signals {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Self {
        Self {
            #[cfg(unix)]
            terminate: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(|error| warn!(%error, "no SIGTERM handler; Ctrl-C still works"))
                .ok(),
        }
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        if let Some(terminate) = &mut self.terminate {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}
