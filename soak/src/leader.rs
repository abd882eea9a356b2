//! The leader-elected subject: replicas of one controller (each its own process, this
//! binary run as `soak leader-replica`) on one Lease, through a fault proxy of their own.
//! Only the one holding the Lease reconciles. It reconciles the run's `Parent` objects
//! (`parents.soak.kube-informer.dev`, written by the driver, [`crate::parents`]) under a
//! finalizer: a live parent gets one child ConfigMap, created through the controller's
//! client (its own writes); a parent being deleted has its cleanup counted by an outside
//! counter the driver serves, then loses the finalizer and goes. Each storm kills one
//! replica; a replica that loses the Lease stands again as a new candidate under a new
//! identity, as a restarted Pod would.
//!
//! Every replica appends what it did to a file of its own ([`LeaderRecord`]); the children
//! carry on themselves what their creator read before creating them. The checks
//! ([`crate::leader_check`]) hold these to what the library promises: no replica acts
//! outside its own term of the Lease, no parent gets a child its creator's reads should
//! have shown it already had, and each cleanup runs where the finalizer says it must.
//!
//! **Term fences.** The library's reads wait for a client's own writes, not for another
//! replica's. So that a new leader's reads hold everything the previous leaders wrote, the
//! first reconcile of each term writes a fence through the controller's client (an
//! annotation on the ConfigMap and on the Parent named [`FENCE`]) and waits until both
//! caches have observed it: every write the server applied before the fence is then in
//! the caches. A write of an earlier leader that the server applies only after the fence
//! (sent before its fencing, held up in the server) is the one thing left that a reader
//! cannot know of; the checks tell those apart.

use std::{
    borrow::Cow,
    collections::HashMap,
    fmt,
    fs::File,
    io::Write as _,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use k8s_openapi::{
    NamespaceResourceScope,
    api::core::v1::ConfigMap,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube_client::{
    Resource,
    api::Patch,
    core::{ApiResource, GroupVersionKind},
};
use kube_informer::{
    Action, CancellationToken, ClientError, ClusterSource, ControllerClient, ErrorAction, Failure,
    FinalizerError, FinalizerEvent, InformerHandle, Manager, ManagerError, ObjectKey,
    ReconcileRequest, Scope, Selector, cancel_on_signals, finalizer,
    leader_election::{LeaderElectionConfig, LeaderElectionError},
    lease::LeaseConfig,
};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
    sync::OnceCell,
};
use tracing::{debug, info, warn};

use crate::{record::unix_nanos, writer::WIDGET_GROUP};

/// The namespace of the subject's Lease, parents and children.
pub const NAMESPACE: &str = "soak-leader";

/// The Lease the replicas campaign for, and the controller's name (its field manager).
pub const LEASE: &str = "soak-leader";

/// The finalizer the controller holds on each parent.
pub const FINALIZER: &str = "soak.kube-informer.dev/cleanup";

/// The ConfigMap and the Parent each term's first reconcile writes, so that its reads
/// wait until its caches hold every earlier leader's writes.
pub const FENCE: &str = "term-fence";

/// On a child: the UID of its parent.
pub const PARENT_LABEL: &str = "soak.kube-informer.dev/parent-uid";

/// On a child: the identity (the replica's term) that created it.
pub const CREATOR_LABEL: &str = "soak.kube-informer.dev/creator";

/// On a child: the version the creator's cache of children was at before the read that
/// found no child (a lower bound of the state that read saw).
pub const READ_AT: &str = "soak.kube-informer.dev/read-at";

/// On a child: the version of its creator's fence write to the ConfigMaps, which that read
/// waited for.
pub const FENCED_AT: &str = "soak.kube-informer.dev/fenced-at";

/// On a child: when its creator started the read that found no child, Unix ns.
pub const LISTED_NS: &str = "soak.kube-informer.dev/listed-ns";

/// On a child: when its creator sent the create, Unix ns.
pub const SENT_NS: &str = "soak.kube-informer.dev/sent-ns";

/// On the fences: the term that wrote them last.
const TERM_ANNOTATION: &str = "soak.kube-informer.dev/term";

/// A parent as the controller reads it: the run's own custom resource, whose spec nobody
/// reads.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Parent {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub spec: Value,
}

impl Resource for Parent {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Parent".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        WIDGET_GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "parents".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Parent {
    /// Whether it holds the controller's finalizer.
    pub fn holds_finalizer(&self) -> bool {
        self.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    }
}

/// The parents' API resource, for the driver's dynamic writes.
pub fn parent_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(WIDGET_GROUP, "v1", "Parent"),
        "parents",
    )
}

/// The parents' CustomResourceDefinition.
pub fn parent_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("parents.{WIDGET_GROUP}") },
        "spec": {
            "group": WIDGET_GROUP,
            "scope": "Namespaced",
            "names": { "plural": "parents", "singular": "parent", "kind": "Parent", "listKind": "ParentList" },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } }
                }}
            }]
        }
    })
}

/// How one replica runs: the driver passes these to `soak leader-replica`.
#[derive(Clone, Debug, clap::Args)]
pub struct ReplicaArgs {
    /// The kubeconfig to use (the driver's, through the subject's fault proxy).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// This replica's name; each of its terms as a candidate holds the Lease as
    /// `{name}-{pid}-{n}`.
    #[arg(long)]
    identity: String,
    /// Appends one JSON line per record here.
    #[arg(long)]
    records: PathBuf,
    /// How long the Lease lasts without renewal, whole seconds.
    #[arg(long, default_value_t = 4)]
    lease_seconds: u64,
    /// The driver's cleanup counter.
    #[arg(long)]
    counter: SocketAddr,
}

/// One line of a replica's record file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "kebab-case")]
pub enum LeaderRecord {
    /// A term's first reconcile wrote its fences and its caches observed them.
    Term {
        identity: String,
        /// The versions the server gave the fence writes (ConfigMap, Parent).
        children_fence: u64,
        parents_fence: u64,
        at_ns: i64,
    },
    /// A reconcile finished (one dropped when leadership was lost leaves none).
    Reconcile {
        identity: String,
        key: String,
        /// The parent's UID, when it was still cached.
        uid: Option<String>,
        started_ns: i64,
        finished_ns: i64,
        /// When its cleanup called the counter, if it ran one.
        cleanup_sent_ns: Option<i64>,
        /// Whether the reconcile succeeded: after a cleanup, the finalizer is off.
        succeeded: bool,
        /// The step that failed (`fence`, `apply`, `add`, `cleanup`, `remove`, `record`)
        /// and why.
        #[serde(default)]
        failed: Option<(String, String)>,
    },
    /// A create of a child that the server answered.
    Child {
        identity: String,
        parent_uid: String,
        name: String,
        resource_version: u64,
        sent_ns: i64,
        answered_ns: i64,
    },
    /// The term ended without being stopped: the Lease was lost.
    Lost {
        identity: String,
        reason: String,
        at_ns: i64,
    },
}

/// What a cleanup tells the outside counter, one JSON line per call.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CleanupCall {
    pub uid: String,
    pub key: String,
    pub identity: String,
    /// When the replica sent it, Unix ns.
    pub sent_ns: i64,
}

/// Runs one replica until SIGTERM or SIGINT: a candidate for the Lease, again under a new
/// identity each time it loses it.
///
/// # Errors
///
/// When the cluster cannot be reached at start, the records cannot be written, or the
/// manager fails other than by losing the Lease.
pub async fn run_replica(args: ReplicaArgs) -> anyhow::Result<()> {
    // A panic anywhere ends the process, so the driver sees it as an unexpected exit.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
    let cancel = cancel_on_signals();
    let client = ClusterSource::default()
        .kubeconfig(&args.kubeconfig)
        .client()
        .await?;
    let records = Arc::new(Records(Mutex::new(
        File::options()
            .create(true)
            .append(true)
            .open(&args.records)
            .with_context(|| format!("opening {}", args.records.display()))?,
    )));
    for term in 0u32.. {
        let identity = format!("{}-{}-{term}", args.identity, std::process::id());
        info!(%identity, "standing for the lease");
        match candidate(&args, client.clone(), &identity, &records, cancel.clone()).await {
            Ok(()) => break,
            Err(ManagerError::LeaderElection(LeaderElectionError::Lost { reason, .. })) => {
                warn!(%identity, %reason, "lost the lease; standing again under a new identity");
                records.write(&LeaderRecord::Lost {
                    identity,
                    reason,
                    at_ns: unix_nanos(),
                })?;
            }
            Err(error) => return Err(error.into()),
        }
        if cancel.is_cancelled() {
            break;
        }
    }
    Ok(())
}

/// One term as a candidate: a manager whose controller runs while it holds the Lease.
async fn candidate(
    args: &ReplicaArgs,
    client: kube_client::Client,
    identity: &str,
    records: &Arc<Records>,
    cancel: CancellationToken,
) -> Result<(), ManagerError> {
    let lease = Duration::from_secs(args.lease_seconds);
    let election = LeaderElectionConfig::new(
        LeaseConfig::new(LEASE)
            .in_namespace(NAMESPACE)
            .with_identity(identity)
            .lease_duration(lease)
            .renew_deadline(lease * 2 / 3)
            .retry_period(lease / 15),
    );
    let mut manager = Manager::new(client)
        .probe_address(None)
        .metrics_address(None)
        .leader_election(election);
    let scope = Scope::namespace(NAMESPACE);
    let children = manager.factory().informer::<ConfigMap>(scope.clone());
    let controller = manager
        .controller::<Parent>(LEASE, scope)
        .owns(children.clone())
        .workers(2);
    let leader = Arc::new(Leader {
        identity: identity.to_owned(),
        client: manager.client_for(&controller),
        children,
        records: records.clone(),
        counter: args.counter,
        fence: OnceCell::new(),
        pending: Mutex::new(HashMap::new()),
    });
    manager.add_controller(controller, (reconcile, retry_soon, leader));
    manager.bind().await?.run(cancel).await
}

/// The record file, one unbuffered write per line: a killed replica loses no finished
/// record.
struct Records(Mutex<File>);

impl Records {
    fn write(&self, record: &LeaderRecord) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write_all(&line)
    }
}

/// One term's controller: its identity, client and caches.
struct Leader {
    identity: String,
    client: ControllerClient,
    children: InformerHandle<ConfigMap>,
    records: Arc<Records>,
    counter: SocketAddr,
    /// This term's fences, written by its first reconcile.
    fence: OnceCell<Fence>,
    /// Per parent UID, the name of a child whose create was sent and not answered: sent
    /// again under the same name until a read shows the child, so that a lost answer
    /// never makes a second child.
    pending: Mutex<HashMap<String, String>>,
}

/// The versions of a term's fence writes.
#[derive(Clone, Copy, Debug)]
struct Fence {
    children: u64,
    parents: u64,
}

/// Why a step of a reconcile failed.
#[derive(Debug)]
enum StepError {
    Client(ClientError),
    Counter(std::io::Error),
    Record(std::io::Error),
    Invalid(String),
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepError::Client(error) => error.fmt(f),
            StepError::Counter(error) => {
                write!(f, "the cleanup counter did not count the call: {error}")
            }
            StepError::Record(error) => write!(f, "writing the record: {error}"),
            StepError::Invalid(reason) => f.write_str(reason),
        }
    }
}

impl std::error::Error for StepError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StepError::Client(error) => error.source(),
            StepError::Counter(error) | StepError::Record(error) => Some(error),
            StepError::Invalid(_) => None,
        }
    }
}

impl From<ClientError> for StepError {
    fn from(error: ClientError) -> Self {
        StepError::Client(error)
    }
}

/// Why a reconcile failed.
#[derive(Debug)]
enum ReconcileFailure {
    Fence(StepError),
    Finalizer(FinalizerError<StepError>),
    Record(std::io::Error),
}

impl ReconcileFailure {
    /// The step that failed, as the records name it.
    fn step(&self) -> &'static str {
        match self {
            ReconcileFailure::Fence(_) => "fence",
            ReconcileFailure::Finalizer(FinalizerError::Apply(_)) => "apply",
            ReconcileFailure::Finalizer(FinalizerError::Add { .. }) => "add",
            ReconcileFailure::Finalizer(FinalizerError::Cleanup(_)) => "cleanup",
            ReconcileFailure::Finalizer(FinalizerError::Remove { .. }) => "remove",
            ReconcileFailure::Finalizer(_) => "finalizer",
            ReconcileFailure::Record(_) => "record",
        }
    }
}

impl fmt::Display for ReconcileFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReconcileFailure::Fence(error) => write!(f, "writing the term's fence: {error}"),
            ReconcileFailure::Finalizer(error) => error.fmt(f),
            ReconcileFailure::Record(error) => write!(f, "writing the record: {error}"),
        }
    }
}

impl std::error::Error for ReconcileFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReconcileFailure::Fence(error) => Some(error),
            ReconcileFailure::Finalizer(error) => error.source(),
            ReconcileFailure::Record(error) => Some(error),
        }
    }
}

/// Backs off, but never for long: a storm's failures must not leave keys waiting for
/// minutes after it.
fn retry_soon(failure: &Failure<'_, ReconcileFailure>, _: &Leader) -> ErrorAction {
    if failure.retries < 8 {
        ErrorAction::Backoff
    } else {
        ErrorAction::RequeueAfter(Duration::from_secs(1))
    }
}

async fn reconcile(
    request: ReconcileRequest<Parent>,
    leader: Arc<Leader>,
) -> Result<Action, ReconcileFailure> {
    let started_ns = unix_nanos();
    let key = request.key();
    let cleanup_sent = AtomicI64::new(0);
    let (uid, outcome) = leader.reconcile(&key, &cleanup_sent).await;
    let sent = cleanup_sent.load(Ordering::Relaxed);
    leader
        .records
        .write(&LeaderRecord::Reconcile {
            identity: leader.identity.clone(),
            key: key.to_string(),
            uid,
            started_ns,
            finished_ns: unix_nanos(),
            cleanup_sent_ns: (sent != 0).then_some(sent),
            succeeded: outcome.is_ok(),
            failed: outcome
                .as_ref()
                .err()
                .map(|error| (error.step().to_owned(), error.to_string())),
        })
        .map_err(ReconcileFailure::Record)?;
    outcome
}

impl Leader {
    /// Reconciles the parent at `key` as the cache holds it once this term's fence is
    /// observed; returns its UID and the outcome. A cleanup stores when it called the
    /// counter in `cleanup_sent`.
    async fn reconcile(
        &self,
        key: &ObjectKey,
        cleanup_sent: &AtomicI64,
    ) -> (Option<String>, Result<Action, ReconcileFailure>) {
        let fence = match self.fence().await {
            Ok(fence) => fence,
            Err(error) => return (None, Err(ReconcileFailure::Fence(error))),
        };
        // Read again past the fence: the request's state may be from before it.
        let Some(parent) = self
            .client
            .store::<Parent>()
            .and_then(|s| s.get_by_key(key))
        else {
            return (None, Ok(Action::done()));
        };
        let uid = parent.metadata.uid.clone();
        let outcome = finalizer(&self.client, FINALIZER, parent, |event| async move {
            match event {
                FinalizerEvent::Apply(parent) => self.ensure_child(&parent, fence).await,
                FinalizerEvent::Cleanup(parent) => {
                    let sent_ns = unix_nanos();
                    cleanup_sent.store(sent_ns, Ordering::Relaxed);
                    self.count_cleanup(&parent, sent_ns).await
                }
            }
        })
        .await;
        (uid, outcome.map_err(ReconcileFailure::Finalizer))
    }

    /// The term's fence, written by the first reconcile that asks: an annotation on the
    /// ConfigMap and on the Parent named [`FENCE`], through the controller's client, and
    /// then reads of both through it, which wait until the caches have observed them.
    async fn fence(&self) -> Result<Fence, StepError> {
        let fence = self
            .fence
            .get_or_try_init(|| async {
                let key = ObjectKey::new(Some(NAMESPACE), FENCE);
                let patch = json!({ "metadata": { "annotations": {
                    TERM_ANNOTATION: format!("{} {}", self.identity, unix_nanos())
                } } });
                let config_map: ConfigMap = self.client.patch(&key, &Patch::Merge(&patch)).await?;
                let parent: Parent = self.client.patch(&key, &Patch::Merge(&patch)).await?;
                self.client.get::<ConfigMap>(&key).await?;
                self.client.get::<Parent>(&key).await?;
                let fence = Fence {
                    children: version_of(&config_map.metadata)?,
                    parents: version_of(&parent.metadata)?,
                };
                info!(identity = %self.identity, children = fence.children, parents = fence.parents, "leading; the caches passed this term's fence");
                self.records
                    .write(&LeaderRecord::Term {
                        identity: self.identity.clone(),
                        children_fence: fence.children,
                        parents_fence: fence.parents,
                        at_ns: unix_nanos(),
                    })
                    .map_err(StepError::Record)?;
                Ok::<_, StepError>(fence)
            })
            .await?;
        Ok(*fence)
    }

    /// Gives a live parent its child, unless a read through the controller's client shows
    /// it has one: a read that missed a child would make a second one.
    async fn ensure_child(&self, parent: &Parent, fence: Fence) -> Result<Action, StepError> {
        let (Some(uid), Some(name)) = (&parent.metadata.uid, &parent.metadata.name) else {
            return Err(StepError::Invalid(
                "a cached parent without a UID or name".into(),
            ));
        };
        let selector = Selector::parse(&format!("{PARENT_LABEL}={uid}"))
            .map_err(|error| StepError::Invalid(error.to_string()))?;
        // Read before the list: the list's state is at least this version.
        let read_at = self
            .children
            .last_sync_resource_version()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let listed_ns = unix_nanos();
        let children = self.client.list_selector::<ConfigMap>(&selector).await?;
        if !children.is_empty() {
            self.pending().remove(uid);
            return Ok(Action::done());
        }
        let child_name = self
            .pending()
            .entry(uid.clone())
            .or_insert_with(|| format!("{name}-{:08x}", rand::rng().random::<u32>()))
            .clone();
        let sent_ns = unix_nanos();
        let annotations = [
            (READ_AT, read_at.to_string()),
            (FENCED_AT, fence.children.to_string()),
            (LISTED_NS, listed_ns.to_string()),
            (SENT_NS, sent_ns.to_string()),
        ];
        let child = ConfigMap {
            metadata: ObjectMeta {
                name: Some(child_name.clone()),
                namespace: Some(NAMESPACE.to_owned()),
                labels: Some(
                    [
                        (PARENT_LABEL.to_owned(), uid.clone()),
                        (CREATOR_LABEL.to_owned(), self.identity.clone()),
                    ]
                    .into(),
                ),
                annotations: Some(
                    annotations
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect(),
                ),
                owner_references: Some(vec![OwnerReference {
                    api_version: Parent::api_version(&()).into_owned(),
                    kind: Parent::kind(&()).into_owned(),
                    name: name.clone(),
                    uid: uid.clone(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        match self.client.create(&child).await {
            Ok(created) => {
                self.pending().remove(uid);
                let record = LeaderRecord::Child {
                    identity: self.identity.clone(),
                    parent_uid: uid.clone(),
                    name: child_name,
                    resource_version: version_of(&created.metadata)?,
                    sent_ns,
                    answered_ns: unix_nanos(),
                };
                self.records.write(&record).map_err(StepError::Record)?;
                Ok(Action::done())
            }
            // The child a create whose answer was lost made: the cache shows it soon.
            Err(error) if error.status_code() == Some(409) => {
                debug!(identity = %self.identity, child = %child_name, "the child exists already; waiting for the cache to show it");
                Ok(Action::requeue_after(Duration::from_millis(250)))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The cleanup: one call to the outside counter, counted once it answers.
    async fn count_cleanup(&self, parent: &Parent, sent_ns: i64) -> Result<Action, StepError> {
        let call = CleanupCall {
            uid: parent.metadata.uid.clone().unwrap_or_default(),
            key: format!(
                "{}/{}",
                parent.metadata.namespace.as_deref().unwrap_or_default(),
                parent.metadata.name.as_deref().unwrap_or_default()
            ),
            identity: self.identity.clone(),
            sent_ns,
        };
        let exchange = async {
            let mut line = serde_json::to_vec(&call).map_err(std::io::Error::other)?;
            line.push(b'\n');
            let mut stream = TcpStream::connect(self.counter).await?;
            stream.write_all(&line).await?;
            let mut reply = String::new();
            BufReader::new(stream).read_line(&mut reply).await?;
            match reply.trim() {
                "ok" => Ok(()),
                other => Err(std::io::Error::other(format!(
                    "the counter answered {other:?}"
                ))),
            }
        };
        tokio::time::timeout(Duration::from_secs(5), exchange)
            .await
            .map_err(|_| {
                StepError::Counter(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer within 5 s",
                ))
            })?
            .map_err(StepError::Counter)?;
        Ok(Action::done())
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An object's resourceVersion as a number.
fn version_of(meta: &ObjectMeta) -> Result<u64, StepError> {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            StepError::Invalid(format!(
                "resourceVersion {:?} is not a number",
                meta.resource_version
            ))
        })
}
