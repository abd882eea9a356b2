//! [`Fleet`]: what runs in each cluster, started as the cluster appears, started again as
//! its credentials change, stopped as it goes, with the fleet's workers shared fairly.

use std::{
    collections::HashMap,
    future::Future,
    panic::AssertUnwindSafe,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use dashmap::DashMap;
use futures::{FutureExt, StreamExt, future::BoxFuture};
use kube_client::Client;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Cluster, ClusterEvent, ClusterEvents, ClusterName, ClusterProvider};
use crate::{
    error::{Error, panic_message},
    informer::{FactoryDefaults, InformerFactory, Scope},
    list_watch::{HashRange, fnv1a_64},
    sharding::{ShardRing, SlotGuard},
    store::{SharedBudget, WorkingSet},
    workqueue::{FairShare, Tenant},
};

/// One controller over a fleet of clusters: for each cluster a [`ClusterProvider`]
/// announces, [`run`](Self::run) calls `engage` with an [`Engaged`] cluster (its client,
/// an [`InformerFactory`] of its own, started, and a [`Tenant`] of the fleet's
/// [`FairShare`] of workers) and runs what it returns until the cluster goes, or changes
/// (then it runs again with the new client, once the old run has ended). A run that fails
/// is started again after a backoff (1 s, doubling to 60 s) while the cluster is there;
/// the other clusters never wait for it. When a cluster goes, its informers are stopped
/// and dropped with everything the run held.
///
/// ```no_run
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{
///     Action, CancellationToken, Controller, ReconcileRequest, retry_with_backoff,
///     fleet::{Engaged, Fleet, KubeconfigSecrets},
/// };
///
/// # async fn doc(hub: kube_client::Client) {
/// let fleet = Fleet::new(KubeconfigSecrets::new(hub, "fleet-system")).workers(4);
/// fleet
///     .run(
///         |cluster: Engaged| async move {
///             let name = cluster.cluster().name().clone();
///             let reconcile = move |request: ReconcileRequest<ConfigMap>, _: Arc<()>| {
///                 let name = name.clone();
///                 async move {
///                     tracing::info!(cluster = %name, key = %request.key(), "reconciled");
///                     Ok::<_, std::convert::Infallible>(Action::done())
///                 }
///             };
///             Controller::new("config-maps", cluster.factory().informer::<ConfigMap>(cluster.scope()))
///                 .workers(cluster.workers())
///                 .share_workers(cluster.tenant())
///                 .run((reconcile, retry_with_backoff(), Arc::new(())), cluster.cancel())
///                 .await
///         },
///         CancellationToken::new(),
///     )
///     .await;
/// # }
/// ```
pub struct Fleet {
    events: Box<dyn FnOnce(CancellationToken) -> ClusterEvents + Send>,
    share: FairShare,
    workers: usize,
    per_cluster: Option<usize>,
    clusters: Arc<DashMap<ClusterName, Entry>>,
    max_backoff: Duration,
    probe_every: Duration,
    engagements: u64,
    ring: Option<Arc<ShardRing>>,
    working_set: SharedBudget,
}

/// The decoded objects all of a fleet's compact caches keep together by default (see
/// [`Fleet::working_set`]).
pub const FLEET_WORKING_SET_BYTES: usize = 1 << 20;

/// What the fleet knows of one cluster, behind [`FleetView`].
struct Entry {
    /// Which engagement of the cluster this is: a run that ended after the cluster came
    /// back changes nothing of the new one's.
    engagement: u64,
    cluster: Cluster,
    factory: Option<InformerFactory>,
    phase: ClusterPhase,
    starts: u64,
    last_error: Option<String>,
    reach: Reachability,
}

/// Whether the fleet reaches a cluster's API server, as its last probe (`GET /readyz`,
/// every [`Fleet::probe_every`]) found. An informer's cache keeps saying it has synced
/// while the link under its watch is stalled; the probe is what tells.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reachability {
    /// Not probed yet in this run.
    Unknown,
    /// The last probe was answered: the server is ready.
    Reachable {
        /// How long the answer took.
        round_trip: Duration,
    },
    /// Every probe since `since` failed: no answer in time, or not ready.
    Unreachable {
        /// When the first of them was sent.
        since: SystemTime,
        /// Why the last one failed.
        error: String,
    },
}

/// Where a cluster's run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClusterPhase {
    /// Announced; its run waits for the previous one (before new credentials) to end.
    Starting,
    /// Its run is going.
    Running,
    /// Its run failed and starts again after a backoff.
    BackingOff,
    /// Its run ended by itself, without an error.
    Finished,
}

/// One cluster of a running fleet, from [`FleetView::clusters`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClusterStatus {
    /// Its name.
    pub name: ClusterName,
    /// The namespace it is, for a cluster that is one namespace of a larger one.
    pub namespace: Option<String>,
    /// Where its run stands.
    pub phase: ClusterPhase,
    /// Whether every informer its run asked for has synced.
    pub synced: bool,
    /// How often its run was started: once, plus once per failure or change.
    pub starts: u64,
    /// The last error of its run, or the provider's last refusal of its kubeconfig.
    pub last_error: Option<String>,
    /// Whether its API server answers the fleet's probe.
    pub reach: Reachability,
}

/// A read-only view of a running [`Fleet`]'s clusters, for probes and metrics.
#[derive(Clone)]
pub struct FleetView {
    clusters: Arc<DashMap<ClusterName, Entry>>,
    share: FairShare,
}

impl FleetView {
    /// Every cluster engaged now, by name.
    pub fn clusters(&self) -> Vec<ClusterStatus> {
        let mut clusters: Vec<ClusterStatus> = self
            .clusters
            .iter()
            .map(|entry| ClusterStatus {
                name: entry.key().clone(),
                namespace: entry.cluster.namespace().map(str::to_owned),
                phase: entry.phase,
                synced: entry.factory.as_ref().is_some_and(|f| f.has_synced()),
                starts: entry.starts,
                last_error: entry.last_error.clone(),
                reach: entry.reach.clone(),
            })
            .collect();
        clusters.sort_by(|a, b| a.name.cmp(&b.name));
        clusters
    }

    /// The clusters whose run is not going with every informer synced, or whose API server
    /// the fleet's probe does not reach (a cache over a stalled link still says it has
    /// synced): what a readiness probe reports, without failing for them.
    pub fn behind(&self) -> Vec<ClusterName> {
        self.clusters()
            .into_iter()
            .filter(|c| {
                let following = !matches!(c.reach, Reachability::Unreachable { .. });
                !(c.phase == ClusterPhase::Running && c.synced && following)
            })
            .map(|c| c.name)
            .collect()
    }

    /// The fleet's workers.
    pub fn share(&self) -> &FairShare {
        &self.share
    }
}

impl std::fmt::Debug for FleetView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetView")
            .field("clusters", &self.clusters.len())
            .field("share", &self.share)
            .finish()
    }
}

/// One cluster, handed to the fleet's `engage` for one run.
pub struct Engaged {
    cluster: Cluster,
    factory: InformerFactory,
    tenant: Tenant,
    workers: usize,
    cancel: CancellationToken,
}

impl Engaged {
    /// The cluster.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// A client for it.
    pub fn client(&self) -> Client {
        self.cluster.client().clone()
    }

    /// This run's informers of the cluster, started: one asked for now starts at once,
    /// and all stop when the run ends.
    pub fn factory(&self) -> &InformerFactory {
        &self.factory
    }

    /// What an informer of this cluster covers: the cluster's namespace for a cluster
    /// that is one, else every namespace.
    pub fn scope(&self) -> Scope {
        match self.cluster.namespace() {
            Some(namespace) => Scope::namespace(namespace),
            None => Scope::all(),
        }
    }

    /// The cluster's place in the fleet's [`FairShare`] of workers, for
    /// [`Controller::share_workers`](crate::Controller::share_workers).
    pub fn tenant(&self) -> Tenant {
        self.tenant.clone()
    }

    /// The fleet's workers: give a controller of this cluster as many, so that it can use
    /// every turn the fleet lets one cluster have.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Cancelled when this run is to end: the cluster went or changed, or the fleet
    /// stops.
    pub fn cancel(&self) -> CancellationToken {
        self.cancel.clone()
    }
}

/// What the fleet runs in each cluster, boxed once so that its helpers take no type
/// parameters.
type EngageFn = Arc<dyn Fn(Engaged) -> BoxFuture<'static, Result<(), Error>> + Send + Sync>;

/// The clusters the provider announced, and those running here.
struct Places {
    known: HashMap<ClusterName, Cluster>,
    running: HashMap<ClusterName, Engagement>,
    /// Runs stopped and not yet ended: a run started again here waits for its own.
    stopping: HashMap<ClusterName, JoinHandle<()>>,
}

/// A guard on `name`'s slot if `ring` deals it to this replica and admits reconciles on
/// it now (held, renewed in time).
fn admitted_here(ring: &ShardRing, name: &ClusterName) -> Option<SlotGuard> {
    let slot = {
        let view = ring.view();
        let view = view.borrow();
        let slot = cluster_slot(name, view.slots);
        view.assigned.contains(&slot).then_some(slot)
    };
    slot.and_then(|slot| ring.admit_slot(slot).ok())
}

/// The slot of the cluster `name`, of `slots`. Objects fall in slots by the FNV-1a hash
/// of their UID, as the API server shards them; names of clusters are seldom random
/// (`edge-1`, `edge-2`, ...), and FNV-1a leaves a change in the last characters out of
/// the hash's high bits, which choose the slot, so the hash is mixed first (MurmurHash3's
/// finaliser): `edge-1` to `edge-8` then spread over the slots instead of sharing one.
pub(super) fn cluster_slot(name: &ClusterName, slots: u16) -> u16 {
    let mut hash = fnv1a_64(name.as_str().as_bytes());
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^= hash >> 33;
    let part = HashRange::part_of(hash, usize::from(slots.max(1)));
    u16::try_from(part).unwrap_or(0)
}

/// One cluster's run, as the fleet holds it.
struct Engagement {
    id: u64,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Fleet {
    /// A fleet of the clusters `provider` announces, with 4 workers, a cluster using at
    /// most 3 at once.
    pub fn new(provider: impl ClusterProvider) -> Self {
        Self {
            events: Box::new(move |cancel| provider.events(cancel)),
            share: share_of(4, None),
            workers: 4,
            per_cluster: None,
            clusters: Arc::new(DashMap::new()),
            max_backoff: Duration::from_secs(60),
            probe_every: Duration::from_secs(10),
            engagements: 0,
            ring: None,
            working_set: SharedBudget::new(FLEET_WORKING_SET_BYTES),
        }
    }

    /// The decoded objects the clusters' caches keep between them, in bytes
    /// ([`FLEET_WORKING_SET_BYTES`], 1 MiB, by default, what one standalone informer
    /// keeps): each cache built by a cluster's factory holds its part of it
    /// ([`SharedBudget`]). A [`WorkingSet`] budget of 1 MiB held per cluster would let a
    /// fleet of a hundred clusters keep a hundred times that, decoded objects of reconciles
    /// long done; a read that misses decodes the object from its bytes again.
    #[must_use]
    pub fn working_set(mut self, total_bytes: usize) -> Self {
        self.working_set = SharedBudget::new(total_bytes);
        self
    }

    /// The reconciles the fleet runs at once, over every cluster, shared fairly (4 by
    /// default).
    #[must_use]
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self.share = share_of(self.workers, self.per_cluster);
        self
    }

    /// The most reconciles one cluster runs at once: by default every worker but one (of
    /// one worker, that one), so that a cluster whose reconciles hang on a stalled API
    /// server leaves a worker to the others.
    #[must_use]
    pub fn max_workers_per_cluster(mut self, max: usize) -> Self {
        self.per_cluster = Some(max.max(1));
        self.share = share_of(self.workers, self.per_cluster);
        self
    }

    /// Spreads the clusters over the replicas of `ring`: each cluster falls in a slot by a
    /// hash of its name, and runs on the replica that holds that slot, from when the ring admits
    /// reconciles there until the slot is dealt elsewhere or its renewals lapse. The run
    /// holds a [`SlotGuard`], so the ring lets the slot go only once the run has ended:
    /// no cluster runs on two replicas at once. Run the ring beside the fleet
    /// ([`ShardRing::run`]).
    #[must_use]
    pub fn spread_over(mut self, ring: Arc<ShardRing>) -> Self {
        self.ring = Some(ring);
        self
    }

    /// The longest wait before a failed run starts again (60 s by default).
    #[must_use]
    pub fn max_backoff(mut self, max: Duration) -> Self {
        self.max_backoff = max;
        self
    }

    /// How often the fleet probes each running cluster's API server (`GET /readyz`, which
    /// every authenticated user may read), and how long a probe may take before the
    /// cluster reads as [unreachable](Reachability::Unreachable) (10 s by default).
    #[must_use]
    pub fn probe_every(mut self, interval: Duration) -> Self {
        self.probe_every = interval.max(Duration::from_millis(100));
        self
    }

    /// A view of the clusters, which stays valid while the fleet runs.
    pub fn view(&self) -> FleetView {
        FleetView {
            clusters: self.clusters.clone(),
            share: self.share.clone(),
        }
    }

    /// Follows the provider until `cancel` is cancelled (or its stream ends), running
    /// `engage` in each cluster it announces (with a [ring](Self::spread_over), each
    /// cluster whose slot this replica holds); then stops every run and waits for each.
    pub async fn run<F, Fut>(mut self, engage: F, cancel: CancellationToken)
    where
        F: Fn(Engaged) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), Error>> + Send + 'static,
    {
        let engage: EngageFn = Arc::new(move |cluster| engage(cluster).boxed());
        let provider = std::mem::replace(
            &mut self.events,
            Box::new(|_| futures::stream::empty().boxed()),
        );
        let mut events = provider(cancel.child_token());
        let mut places = Places {
            known: HashMap::new(),
            running: HashMap::new(),
            stopping: HashMap::new(),
        };
        let mut ring_view = self.ring.as_ref().map(|ring| ring.view());
        // Admission also lapses with time (renewals late), which no view change says.
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                event = events.next() => {
                    let Some(event) = event else {
                        warn!("the fleet's cluster provider stopped; stopping every cluster");
                        break;
                    };
                    self.take(event, &mut places, &engage, &cancel);
                }
                changed = async {
                    match ring_view.as_mut() {
                        Some(view) => view.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if changed.is_err() {
                        ring_view = None;
                    }
                    self.place_all(&mut places, &engage, &cancel);
                }
                _ = tick.tick(), if self.ring.is_some() => {
                    self.place_all(&mut places, &engage, &cancel);
                }
            }
        }
        for run in places.running.values() {
            run.cancel.cancel();
        }
        for (name, run) in places.running {
            if let Err(error) = run.task.await {
                warn!(cluster = %name, %error, "a cluster's run did not end cleanly");
            }
        }
        for (_, stopping) in places.stopping {
            let _ = stopping.await;
        }
    }

    /// What the provider saw.
    fn take(
        &mut self,
        event: ClusterEvent,
        places: &mut Places,
        engage: &EngageFn,
        cancel: &CancellationToken,
    ) {
        match event {
            ClusterEvent::Appeared(cluster) => {
                let name = cluster.name().clone();
                places.known.insert(name.clone(), cluster);
                self.place(&name, places, engage, cancel, false);
            }
            ClusterEvent::Changed(cluster) => {
                let name = cluster.name().clone();
                places.known.insert(name.clone(), cluster);
                self.place(&name, places, engage, cancel, true);
            }
            ClusterEvent::Gone(name) => {
                places.known.remove(&name);
                self.stop(places, &name, "the cluster went");
            }
            ClusterEvent::Refused {
                cluster: Some(name),
                error,
            } => {
                if let Some(mut entry) = self.clusters.get_mut(&name) {
                    entry.last_error = Some(error.to_string());
                }
            }
            ClusterEvent::Refused {
                cluster: None,
                error,
            } => warn!(%error, "the fleet's cluster provider failed"),
        }
    }

    /// Starts or stops each known cluster's run as the ring now deals it.
    fn place_all(&mut self, places: &mut Places, engage: &EngageFn, cancel: &CancellationToken) {
        // A running cluster is a known one: a cluster that goes is stopped at once.
        let names: Vec<ClusterName> = places.known.keys().cloned().collect();
        for name in names {
            self.place(&name, places, engage, cancel, false);
        }
    }

    /// Runs `name` here if it is known and (with a ring) its slot is this replica's and
    /// admitted now, starting it again if `restart`; stops its run otherwise.
    fn place(
        &mut self,
        name: &ClusterName,
        places: &mut Places,
        engage: &EngageFn,
        cancel: &CancellationToken,
        restart: bool,
    ) {
        let Some(cluster) = places.known.get(name).cloned() else {
            self.stop(places, name, "the cluster went");
            return;
        };
        let admitted = match &self.ring {
            None => Some(None),
            Some(ring) => admitted_here(ring, name).map(Some),
        };
        let running = places.running.contains_key(name);
        let Some(slot) = admitted else {
            if running {
                self.stop(
                    places,
                    name,
                    "its slot is no longer this replica's to reconcile",
                );
            }
            return;
        };
        if running && !restart {
            return;
        }
        // The new run starts once the old one has ended: two never reconcile one cluster
        // at once.
        let previous = places
            .running
            .remove(name)
            .map(|old| {
                old.cancel.cancel();
                old.task
            })
            .or_else(|| places.stopping.remove(name));
        info!(cluster = %name, restart = previous.is_some(), "engaging a cluster");
        let run_cancel = cancel.child_token();
        self.engagements += 1;
        let id = self.engagements;
        let task = tokio::spawn(self.run_cluster(
            id,
            cluster,
            previous,
            slot,
            engage.clone(),
            run_cancel.clone(),
        ));
        places.running.insert(
            name.clone(),
            Engagement {
                id,
                cancel: run_cancel,
                task,
            },
        );
    }

    /// Stops `name`'s run, and forgets the cluster once the run has ended (and its memory
    /// is free), unless it was engaged again meanwhile.
    fn stop(&self, places: &mut Places, name: &ClusterName, why: &str) {
        let Some(old) = places.running.remove(name) else {
            return;
        };
        info!(cluster = %name, why, "stopping a cluster's run");
        old.cancel.cancel();
        let clusters = self.clusters.clone();
        let forget = name.clone();
        let ended = tokio::spawn(async move {
            let _ = old.task.await;
            clusters.remove_if(&forget, |_, entry| entry.engagement == old.id);
        });
        places.stopping.retain(|_, task| !task.is_finished());
        places.stopping.insert(name.clone(), ended);
    }

    /// One cluster's runs until `cancel`: after `previous` has ended, `engage` with a fresh
    /// factory, again after a backoff while it fails.
    fn run_cluster(
        &self,
        id: u64,
        cluster: Cluster,
        previous: Option<JoinHandle<()>>,
        slot: Option<SlotGuard>,
        engage: EngageFn,
        cancel: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static {
        let clusters = self.clusters.clone();
        let tenant = self.share.tenant(cluster.name().as_str());
        let workers = self.workers;
        let max_backoff = self.max_backoff;
        let defaults =
            FactoryDefaults::default().working_set(WorkingSet::shared(&self.working_set));
        let name = cluster.name().clone();
        clusters
            .entry(name.clone())
            .and_modify(|entry| {
                entry.engagement = id;
                entry.cluster = cluster.clone();
                entry.phase = ClusterPhase::Starting;
            })
            .or_insert_with(|| Entry {
                engagement: id,
                cluster: cluster.clone(),
                factory: None,
                phase: ClusterPhase::Starting,
                starts: 0,
                last_error: None,
                reach: Reachability::Unknown,
            });
        let probe = probe(
            clusters.clone(),
            cluster.clone(),
            id,
            self.probe_every,
            cancel.clone(),
        );

        async move {
            // Held until every run here has ended: the ring lets the slot go only then.
            let _slot = slot;
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            let probe = tokio::spawn(probe);
            let mut backoff = Duration::from_secs(1);
            while !cancel.is_cancelled() {
                let factory =
                    InformerFactory::with_defaults(cluster.client().clone(), defaults.clone());
                let run_cancel = cancel.child_token();
                factory.start(&run_cancel);
                if let Some(mut entry) = entry_of(&clusters, &name, id) {
                    entry.factory = Some(factory.clone());
                    entry.phase = ClusterPhase::Running;
                    entry.starts += 1;
                }
                let engaged = Engaged {
                    cluster: cluster.clone(),
                    factory: factory.clone(),
                    tenant: tenant.clone(),
                    workers,
                    cancel: run_cancel.clone(),
                };
                let outcome = AssertUnwindSafe(engage(engaged)).catch_unwind().await;
                run_cancel.cancel();
                factory.shutdown().await;
                let failure = match outcome {
                    Ok(Ok(())) => None,
                    Ok(Err(error)) => Some(crate::error::error_chain(&error)),
                    Err(panic) => Some(format!("panicked: {}", panic_message(&*panic))),
                };
                let mut entry = entry_of(&clusters, &name, id);
                if let Some(entry) = entry.as_deref_mut() {
                    entry.factory = None;
                }
                if cancel.is_cancelled() {
                    break;
                }
                let Some(failure) = failure else {
                    debug!(cluster = %name, "the cluster's run ended");
                    if let Some(entry) = entry.as_deref_mut() {
                        entry.phase = ClusterPhase::Finished;
                    }
                    break;
                };
                warn!(cluster = %name, error = %failure, ?backoff, "the cluster's run failed; starting it again after a backoff");
                if let Some(entry) = entry.as_deref_mut() {
                    entry.phase = ClusterPhase::BackingOff;
                    entry.last_error = Some(failure);
                }
                drop(entry);
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(max_backoff);
            }
            probe.abort();
        }
    }
}

/// Probes `cluster`'s API server every `interval` until `cancel`, writing what it finds in
/// engagement `id`'s entry.
async fn probe(
    clusters: Arc<DashMap<ClusterName, Entry>>,
    cluster: Cluster,
    id: u64,
    interval: Duration,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let sent = SystemTime::now();
        let started = Instant::now();
        let request = http::Request::get("/readyz").body(Vec::new());
        let answer = match request {
            Ok(request) => {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    answer = tokio::time::timeout(interval, cluster.client().request_text(request)) => answer,
                }
            }
            Err(error) => Ok(Err(kube_client::Error::HttpError(error))),
        };
        let failure = match answer {
            Ok(Ok(_)) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(_) => Some(format!("no answer to GET /readyz within {interval:?}")),
        };
        let Some(mut entry) = entry_of(&clusters, cluster.name(), id) else {
            return;
        };
        entry.reach = match (failure, &entry.reach) {
            (None, was) => {
                if let Reachability::Unreachable { since, .. } = was {
                    let unreachable_for = since.elapsed().unwrap_or_default();
                    info!(cluster = %cluster.name(), ?unreachable_for, "the cluster's API server answers the fleet's probe again");
                }
                Reachability::Reachable {
                    round_trip: started.elapsed(),
                }
            }
            (Some(error), Reachability::Unreachable { since, .. }) => Reachability::Unreachable {
                since: *since,
                error,
            },
            (Some(error), _) => {
                warn!(cluster = %cluster.name(), %error, "the cluster's API server does not answer the fleet's probe");
                Reachability::Unreachable { since: sent, error }
            }
        };
    }
}

/// `workers` turns, each cluster held to `per_cluster` (by default all but one).
fn share_of(workers: usize, per_cluster: Option<usize>) -> FairShare {
    let per_cluster = per_cluster.unwrap_or_else(|| workers.saturating_sub(1).max(1));
    FairShare::new(workers).max_per_tenant(per_cluster)
}

/// Engagement `id`'s entry for `name`, unless a later engagement replaced it.
fn entry_of<'a>(
    clusters: &'a DashMap<ClusterName, Entry>,
    name: &ClusterName,
    id: u64,
) -> Option<dashmap::mapref::one::RefMut<'a, ClusterName, Entry>> {
    clusters
        .get_mut(name)
        .filter(|entry| entry.engagement == id)
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("workers", &self.workers)
            .field("clusters", &self.clusters.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn names_that_differ_at_the_end_spread_over_the_slots() {
        let slots: BTreeSet<u16> = (1..=16)
            .map(|i| cluster_slot(&ClusterName::from(format!("edge-{i}")), 16))
            .collect();
        // FNV-1a alone puts the sixteen in two slots.
        assert!(slots.len() >= 8, "{slots:?}");
        assert!(slots.iter().all(|&slot| slot < 16));
        assert_eq!(cluster_slot(&ClusterName::from("a"), 1), 0);
    }
}
