//! The driver's side of the leader-elected subject ([`crate::leader`]): the writer that
//! creates, annotates and deletes the parents; the outside counter each cleanup calls; the
//! observers that watch the Lease, the parents and the children straight from the API
//! server (not through the subject's fault proxy); the state the server ends in; and
//! [`LeaderRun`], which starts and stops them with the replicas.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::Path,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::ConfigMap},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube_client::{
    Api, Client,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use kube_informer::{
    CancellationToken, DeletedObject, FactoryDefaults, InformerFactory, Scope, handler_fn,
    informer::HandlerRegistration,
};
use rand::{Rng, SeedableRng, rngs::StdRng, seq::IndexedRandom};
use serde::Serialize;
use serde_json::json;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};
use tracing::{debug, info, warn};

use crate::{
    leader::{
        CREATOR_LABEL, CleanupCall, FENCE, FENCED_AT, LISTED_NS, LeaderRecord, NAMESPACE,
        PARENT_LABEL, Parent, READ_AT, SENT_NS, parent_resource,
    },
    record::unix_nanos,
    sharded::{Churn, ReplicaCommand, ReplicaSet},
};

/// How long one write of the parents' writer may take before it is given up: the API
/// server may be down, and the writer must keep its pace.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the parents' writer did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ParentWrites {
    pub created: u64,
    pub annotated: u64,
    pub deleted: u64,
    /// Writes that failed or got no answer in time.
    pub failed: u64,
}

/// Creates, annotates and deletes parents at a steady rate, each under a name never used
/// before, so a deleted parent's finalizer never holds up a new one.
pub struct ParentWriter {
    api: Api<DynamicObject>,
    /// Parents created and not deleted, by name.
    live: Mutex<Vec<String>>,
    next: AtomicU64,
    writes: Mutex<ParentWrites>,
    /// UIDs of parents whose deletion the server answered while our finalizer held them:
    /// each must be cleaned up before it goes.
    deleted_holding: Mutex<BTreeSet<String>>,
}

impl ParentWriter {
    pub fn new(client: &Client) -> Arc<Self> {
        Arc::new(Self {
            api: Api::namespaced_with(client.clone(), NAMESPACE, &parent_resource()),
            live: Mutex::default(),
            next: AtomicU64::new(0),
            writes: Mutex::default(),
            deleted_holding: Mutex::default(),
        })
    }

    /// Creates `count` parents.
    ///
    /// # Errors
    ///
    /// When one cannot be created.
    pub async fn populate(&self, count: usize) -> anyhow::Result<()> {
        for _ in 0..count {
            self.create().await?;
        }
        Ok(())
    }

    pub fn writes(&self) -> ParentWrites {
        lock(&self.writes).clone()
    }

    pub fn deleted_holding(&self) -> BTreeSet<String> {
        lock(&self.deleted_holding).clone()
    }

    /// Writes `rate` times a second until `stop`, keeping about `population` parents.
    pub async fn run(
        self: Arc<Self>,
        seed: u64,
        rate: f64,
        population: usize,
        stop: CancellationToken,
    ) {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x9a7e_47a1);
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.01)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let live = lock(&self.live).len();
            let create = if live < population {
                rng.random_bool(0.6)
            } else {
                rng.random_bool(0.3)
            };
            let outcome = if create || live == 0 {
                self.create().await.map(|()| "created")
            } else {
                let name = lock(&self.live)
                    .choose(&mut rng)
                    .cloned()
                    .unwrap_or_default();
                if rng.random_bool(0.4) {
                    self.annotate(&name).await.map(|()| "annotated")
                } else {
                    self.delete(&name).await.map(|()| "deleted")
                }
            };
            let mut writes = lock(&self.writes);
            match outcome {
                Ok("created") => writes.created += 1,
                Ok("annotated") => writes.annotated += 1,
                Ok(_) => writes.deleted += 1,
                Err(error) => {
                    debug!(%error, "a write of a parent failed");
                    writes.failed += 1;
                }
            }
        }
    }

    async fn create(&self) -> anyhow::Result<()> {
        let name = format!("p-{:05}", self.next.fetch_add(1, Ordering::Relaxed));
        let parent = DynamicObject::new(&name, &parent_resource()).data(json!({ "spec": {} }));
        // Counted as live even when the answer is lost: a delete of a parent that never
        // was fails, and harms nothing.
        lock(&self.live).push(name);
        tokio::time::timeout(
            WRITE_TIMEOUT,
            self.api.create(&PostParams::default(), &parent),
        )
        .await??;
        Ok(())
    }

    async fn annotate(&self, name: &str) -> anyhow::Result<()> {
        let patch = json!({ "metadata": { "annotations": {
            "soak.kube-informer.dev/touched": unix_nanos().to_string()
        } } });
        tokio::time::timeout(
            WRITE_TIMEOUT,
            self.api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await??;
        Ok(())
    }

    async fn delete(&self, name: &str) -> anyhow::Result<()> {
        // Never written again, whatever the answer: a parent being deleted is the
        // controller's until it goes.
        lock(&self.live).retain(|n| n != name);
        let deleted = tokio::time::timeout(
            WRITE_TIMEOUT,
            self.api.delete(name, &DeleteParams::default()),
        )
        .await??;
        if let Some(kept) = deleted.left() {
            let holds = kept
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == crate::leader::FINALIZER);
            if let (true, Some(uid)) = (holds, kept.metadata.uid) {
                lock(&self.deleted_holding).insert(uid);
            }
        }
        Ok(())
    }
}

/// One call the counter received.
#[derive(Clone, Debug, Serialize)]
pub struct CountedCall {
    #[serde(flatten)]
    pub call: CleanupCall,
    pub received_ns: i64,
}

/// The outside counter the cleanups call: a line of JSON in, `ok` out, over TCP on
/// loopback.
pub struct CleanupCounter {
    address: SocketAddr,
    calls: Arc<Mutex<Vec<CountedCall>>>,
    task: JoinHandle<()>,
    stop: CancellationToken,
}

impl CleanupCounter {
    /// Serves on a port of loopback the system picks.
    ///
    /// # Errors
    ///
    /// When no port can be bound.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let calls: Arc<Mutex<Vec<CountedCall>>> = Arc::default();
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(listener, calls.clone(), stop.clone()));
        Ok(Self {
            address,
            calls,
            task,
            stop,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops serving; returns every call counted.
    pub async fn stop(self) -> Vec<CountedCall> {
        self.stop.cancel();
        if let Err(error) = self.task.await {
            warn!(%error, "the cleanup counter ended badly");
        }
        lock(&self.calls).clone()
    }
}

async fn serve(
    listener: TcpListener,
    calls: Arc<Mutex<Vec<CountedCall>>>,
    stop: CancellationToken,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                connections.spawn(count_one(stream, calls.clone()));
            }
            Err(error) => warn!(%error, "the cleanup counter could not accept a call"),
        }
        while connections.try_join_next().is_some() {}
    }
    connections.shutdown().await;
}

/// Counts the call a connection brings, then answers it.
async fn count_one(stream: TcpStream, calls: Arc<Mutex<Vec<CountedCall>>>) {
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    let answer = match stream.read_line(&mut line).await {
        Ok(_) => match serde_json::from_str::<CleanupCall>(&line) {
            Ok(call) => {
                lock(&calls).push(CountedCall {
                    call,
                    received_ns: unix_nanos(),
                });
                "ok\n"
            }
            Err(error) => {
                warn!(%error, line = %line.trim(), "the cleanup counter got a call it cannot read");
                "unreadable\n"
            }
        },
        Err(error) => {
            debug!(%error, "a cleanup call broke off");
            return;
        }
    };
    if let Err(error) = stream.get_mut().write_all(answer.as_bytes()).await {
        debug!(%error, "a cleanup call's answer was lost");
    }
}

/// The replicas of the leader-elected subject and everything the driver runs beside them.
pub struct LeaderRun {
    pub replicas: Arc<tokio::sync::Mutex<ReplicaSet<LeaderRecord>>>,
    pub writer: Arc<ParentWriter>,
    observer: Observer,
    counter: CleanupCounter,
}

/// What the leader-elected subject left for the checks.
pub struct LeaderOutcome {
    pub churn: Churn,
    pub records: Vec<LeaderRecord>,
    pub observed: Observed,
    pub calls: Vec<CountedCall>,
    pub end: EndState,
    pub deleted_holding: BTreeSet<String>,
    pub writes: ParentWrites,
}

impl LeaderOutcome {
    /// Writes what the checks read into `dir/leader.json`.
    ///
    /// # Errors
    ///
    /// When the file cannot be written.
    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        let saved = json!({
            "records": self.records,
            "observed": self.observed,
            "cleanup_calls": self.calls,
            "end": self.end,
            "deleted_holding": self.deleted_holding,
        });
        std::fs::write(dir.join("leader.json"), serde_json::to_vec(&saved)?)?;
        Ok(())
    }
}

/// How the leader-elected subject runs.
#[derive(Clone, Copy, Debug)]
pub struct LeaderSettings {
    pub replicas: usize,
    pub lease_seconds: u64,
    /// Parents created before the load starts, and kept about that many during it.
    pub parents: usize,
}

impl LeaderRun {
    /// Starts the counter and the observers, creates the parents, and starts the replicas
    /// on `kubeconfig` (their fault proxy's), keeping their records and logs in `dir`.
    ///
    /// # Errors
    ///
    /// When the counter cannot listen, the observers do not sync within 60 s, a parent
    /// cannot be created or a replica cannot start.
    pub async fn start(
        admin: &Client,
        settings: LeaderSettings,
        kubeconfig: &Path,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let counter = CleanupCounter::start().await?;
        // Synced before any replica starts: the checks need every term of the Lease.
        let observer = Observer::start(admin.clone())?;
        let synced = tokio::time::timeout(Duration::from_secs(60), async {
            while !observer.has_synced() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        synced.await.map_err(|_| {
            anyhow::anyhow!("the leader subject's observers did not sync within 60 s")
        })?;
        let writer = ParentWriter::new(admin);
        writer.populate(settings.parents).await?;
        let command = ReplicaCommand {
            subcommand: "leader-replica",
            prefix: "l",
            args: vec![
                "--lease-seconds".to_owned(),
                settings.lease_seconds.to_string(),
                "--counter".to_owned(),
                counter.address().to_string(),
            ],
            log_filter: "warn,kube_informer::leader_election=info,soak=info",
        };
        let replicas = ReplicaSet::start(command, settings.replicas, kubeconfig, dir)?;
        Ok(Self {
            replicas: Arc::new(tokio::sync::Mutex::new(replicas)),
            writer,
            observer,
            counter,
        })
    }

    /// The replica leading now, as last seen.
    pub fn leading_replica(&self) -> impl Fn() -> Option<String> + Send + Sync + 'static {
        let seen = self.observer.seen.clone();
        move || {
            let seen = lock(&seen);
            let holder = seen.lease.last()?.holder.as_deref()?;
            Some(holder.split('-').next()?.to_owned())
        }
    }

    /// Stops the replicas (each leader releases the Lease), the observers and the counter,
    /// and reads what the server ends with.
    ///
    /// # Errors
    ///
    /// When the replicas are still shared, their records cannot be read, or the end state
    /// cannot be listed.
    pub async fn stop(self, admin: &Client) -> anyhow::Result<LeaderOutcome> {
        let mut replicas = Arc::try_unwrap(self.replicas)
            .map_err(|_| anyhow::anyhow!("the leader replicas are still shared"))?
            .into_inner();
        let churn = replicas.stop().await;
        let records = replicas.records()?;
        let end = EndState::read(admin).await?;
        Ok(LeaderOutcome {
            churn,
            records,
            observed: self.observer.stop().await,
            calls: self.counter.stop().await,
            end,
            deleted_holding: self.writer.deleted_holding(),
            writes: self.writer.writes(),
        })
    }
}

/// One state of the Lease as the observer saw it.
#[derive(Clone, Debug, Serialize)]
pub struct LeaseSeen {
    pub resource_version: u64,
    pub holder: Option<String>,
    /// When its holder acquired it (or, for a released one, released it), Unix ns, as the
    /// holder wrote it: the replicas share this machine's clock with the checks.
    pub acquired_ns: Option<i64>,
    pub transitions: Option<i32>,
    pub seen_ns: i64,
}

/// A child as the observer (or the last list) saw it, with what its creator wrote on it.
#[derive(Clone, Debug, Serialize)]
pub struct ChildSeen {
    pub name: String,
    pub uid: String,
    pub parent_uid: String,
    pub creator: String,
    /// The version of its first state seen: its creation's (children are never changed).
    pub resource_version: u64,
    pub read_at: u64,
    pub fenced_at: u64,
    pub listed_ns: i64,
    pub sent_ns: i64,
    /// The version its deletion was watched at (not a relist's tombstone's).
    pub deleted_at: Option<u64>,
}

impl ChildSeen {
    /// The child `config_map` is, if it is one (it names a parent).
    pub fn of(config_map: &ConfigMap) -> Option<Self> {
        let meta = &config_map.metadata;
        let label = |name: &str| meta.labels.as_ref()?.get(name).cloned();
        let number =
            |name: &str| -> Option<i64> { meta.annotations.as_ref()?.get(name)?.parse().ok() };
        Some(Self {
            name: meta.name.clone()?,
            uid: meta.uid.clone()?,
            parent_uid: label(PARENT_LABEL)?,
            creator: label(CREATOR_LABEL).unwrap_or_default(),
            resource_version: version(meta)?,
            read_at: number(READ_AT)
                .and_then(|v| u64::try_from(v).ok())
                .unwrap_or(0),
            fenced_at: number(FENCED_AT)
                .and_then(|v| u64::try_from(v).ok())
                .unwrap_or(0),
            listed_ns: number(LISTED_NS).unwrap_or(0),
            sent_ns: number(SENT_NS).unwrap_or(0),
            deleted_at: None,
        })
    }
}

/// What the observer saw of one parent.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ParentSeen {
    pub key: String,
    /// Seen holding the controller's finalizer.
    pub held_finalizer: bool,
    /// Seen being deleted.
    pub deleting: bool,
    /// The version its deletion was watched at (not a relist's tombstone, whose version is
    /// its last known state's).
    pub deleted_at: Option<u64>,
}

/// Everything the observers saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Observed {
    pub lease: Vec<LeaseSeen>,
    /// By child UID.
    pub children: BTreeMap<String, ChildSeen>,
    /// By parent UID.
    pub parents: BTreeMap<String, ParentSeen>,
}

/// Informers straight on the API server (not through a fault proxy) recording the Lease,
/// the parents and the children as they change.
pub struct Observer {
    factory: InformerFactory,
    registrations: Vec<HandlerRegistration>,
    cancel: CancellationToken,
    seen: Arc<Mutex<Observed>>,
}

impl Observer {
    /// Starts the informers on `client`.
    ///
    /// # Errors
    ///
    /// When a handler cannot be added.
    pub fn start(client: Client) -> anyhow::Result<Self> {
        // They run until the observer stops, whoever holds them: no timer is left behind
        // to stop an unused one.
        let factory =
            InformerFactory::with_defaults(client, FactoryDefaults::default().keep_unused());
        let scope = Scope::namespace(NAMESPACE);
        let seen: Arc<Mutex<Observed>> = Arc::default();
        let mut registrations = Vec::new();

        let leases = factory.informer::<Lease>(scope.clone());
        let (on_add, on_update) = (seen.clone(), seen.clone());
        registrations.push(
            leases.add_handler(
                handler_fn::<Lease>()
                    .on_add(move |lease, _| see_lease(&on_add, lease))
                    .on_update(move |_, lease, _| see_lease(&on_update, lease)),
            )?,
        );

        let children = factory.informer::<ConfigMap>(scope.clone());
        let (on_add, on_update, on_delete) = (seen.clone(), seen.clone(), seen.clone());
        registrations.push(
            children.add_handler(
                handler_fn::<ConfigMap>()
                    .on_add(move |child, _| see_child(&on_add, child, None))
                    .on_update(move |_, child, _| see_child(&on_update, child, None))
                    .on_delete(move |deleted: &DeletedObject<ConfigMap>| {
                        let at = (!deleted.is_final_state_unknown())
                            .then(|| version(&deleted.object().metadata))
                            .flatten();
                        see_child(&on_delete, deleted.object(), Some(at));
                    }),
            )?,
        );

        let parents = factory.informer::<Parent>(scope);
        let (on_add, on_update, on_delete) = (seen.clone(), seen.clone(), seen.clone());
        registrations.push(
            parents.add_handler(
                handler_fn::<Parent>()
                    .on_add(move |parent, _| see_parent(&on_add, parent, None))
                    .on_update(move |_, parent, _| see_parent(&on_update, parent, None))
                    .on_delete(move |deleted: &DeletedObject<Parent>| {
                        let at = (!deleted.is_final_state_unknown())
                            .then(|| version(&deleted.object().metadata))
                            .flatten();
                        see_parent(&on_delete, deleted.object(), Some(at));
                    }),
            )?,
        );

        let cancel = CancellationToken::new();
        factory.start(&cancel);
        Ok(Self {
            factory,
            registrations,
            cancel,
            seen,
        })
    }

    pub fn has_synced(&self) -> bool {
        self.factory.has_synced()
    }

    /// Stops the informers; returns what they saw.
    pub async fn stop(mut self) -> Observed {
        self.cancel.cancel();
        for registration in self.registrations.drain(..) {
            registration.remove();
        }
        self.factory.shutdown().await;
        lock(&self.seen).clone()
    }
}

fn see_lease(seen: &Mutex<Observed>, lease: &Lease) {
    let Some(resource_version) = version(&lease.metadata) else {
        return;
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let nanos =
        |time: Option<MicroTime>| time.and_then(|t| i64::try_from(t.0.as_nanosecond()).ok());
    lock(seen).lease.push(LeaseSeen {
        resource_version,
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        acquired_ns: nanos(spec.acquire_time),
        transitions: spec.lease_transitions,
        seen_ns: unix_nanos(),
    });
}

/// `deleted`: `Some` for a deletion, with the version it was watched at if known.
fn see_child(seen: &Mutex<Observed>, config_map: &ConfigMap, deleted: Option<Option<u64>>) {
    if let Some(child) = ChildSeen::of(config_map) {
        let mut seen = lock(seen);
        let entry = seen.children.entry(child.uid.clone()).or_insert(child);
        if let Some(at) = deleted {
            entry.deleted_at = entry.deleted_at.or(at);
        }
    }
}

/// `deleted`: `Some` for a deletion, with the version it was watched at if known.
fn see_parent(seen: &Mutex<Observed>, parent: &Parent, deleted: Option<Option<u64>>) {
    let Some(uid) = parent.metadata.uid.clone() else {
        return;
    };
    let mut seen = lock(seen);
    let entry = seen.parents.entry(uid).or_default();
    entry.key = key_of(&parent.metadata);
    entry.held_finalizer |= parent.holds_finalizer();
    entry.deleting |= parent.metadata.deletion_timestamp.is_some();
    if let Some(at) = deleted {
        entry.deleted_at = entry.deleted_at.or(at);
    }
}

/// A parent as the server holds it at the end.
#[derive(Clone, Debug, Serialize)]
pub struct ParentAtEnd {
    pub key: String,
    pub holds_finalizer: bool,
    pub deleting: bool,
}

/// The server's parents and children once the run has settled, read straight from it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EndState {
    /// By UID.
    pub parents: BTreeMap<String, ParentAtEnd>,
    pub children: Vec<ChildSeen>,
}

impl EndState {
    /// Reads them.
    ///
    /// # Errors
    ///
    /// When a list fails.
    pub async fn read(client: &Client) -> anyhow::Result<Self> {
        let parents = Api::<Parent>::namespaced(client.clone(), NAMESPACE)
            .list(&ListParams::default())
            .await?;
        let children = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
            .list(&ListParams::default().labels(PARENT_LABEL))
            .await?;
        Ok(Self {
            parents: parents
                .items
                .iter()
                .filter_map(|p| {
                    Some((
                        p.metadata.uid.clone()?,
                        ParentAtEnd {
                            key: key_of(&p.metadata),
                            holds_finalizer: p.holds_finalizer(),
                            deleting: p.metadata.deletion_timestamp.is_some(),
                        },
                    ))
                })
                .collect(),
            children: children.items.iter().filter_map(ChildSeen::of).collect(),
        })
    }

    /// What keeps the controller's world from matching the parents: a live parent without
    /// the finalizer or a child, a parent still being deleted (its cleanup not done).
    pub fn unsettled(&self) -> Vec<String> {
        let with_child: BTreeSet<&str> = self
            .children
            .iter()
            .map(|c| c.parent_uid.as_str())
            .collect();
        self.parents
            .iter()
            .filter_map(|(uid, parent)| {
                if parent.deleting {
                    Some(format!("{} is still being deleted", parent.key))
                } else if !parent.holds_finalizer {
                    Some(format!("{} lacks the finalizer", parent.key))
                } else if !with_child.contains(uid.as_str()) {
                    Some(format!("{} has no child", parent.key))
                } else {
                    None
                }
            })
            .collect()
    }
}

/// Creates the subject's namespace's fences: the ConfigMap and the Parent each term's
/// first reconcile writes. The parents' CRD must be served.
///
/// # Errors
///
/// When one cannot be created.
pub async fn create_fences(client: &Client) -> anyhow::Result<()> {
    let config_map: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": FENCE, "namespace": NAMESPACE }
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &config_map)
        .await?;
    let parent = DynamicObject::new(FENCE, &parent_resource()).data(json!({ "spec": {} }));
    Api::<DynamicObject>::namespaced_with(client.clone(), NAMESPACE, &parent_resource())
        .create(&PostParams::default(), &parent)
        .await?;
    info!("the leader-elected subject's fences are in place");
    Ok(())
}

fn version(meta: &ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

fn key_of(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
