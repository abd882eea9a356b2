//! The sharded subject: replicas of one sharded controller, each its own process (this
//! binary run as `soak sharded-replica`), splitting the Pods through a shard ring whose
//! Leases, watches and lists all pass the same faulty proxy as the other subjects. Each
//! storm kills one replica (SIGKILL, its Leases left to expire) and starts it again after
//! a few seconds; one more replica joins halfway through the run. Every replica appends
//! its finished reconciles to a file of its own, which the driver reads for the checks:
//! the last reconcile of each key, by whichever replica, saw its final state, and no two
//! reconciles of a key overlapped, within a replica or across them.
//!
//! The replica processes, their kills and restarts ([`ReplicaSet`], [`churn`]) serve the
//! leader-elected subject ([`crate::leader`]) too: only the subcommand and the records
//! differ.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufRead, BufReader, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Pod;
use kube_informer::lease::LeaseConfig;
use kube_informer::{
    Action, CancellationToken, ClusterSource, Manager, ReconcileRequest, Scope, cancel_on_signals,
    retry_with_backoff, sharding::RingConfig,
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::{Serialize, de::DeserializeOwned};
use tokio::process::{Child, Command};
use tracing::{info, warn};

use crate::{
    faults::Calendar,
    record::{ReconcileRecord, unix_nanos},
    subject::marker_of,
};

/// The controller's name in records and reports; each record also names its replica.
pub const CONTROLLER: &str = "sharded";

/// The namespace of the ring's Leases.
pub const RING_NAMESPACE: &str = "soak-ring";

const RING: &str = "soak";

/// How one replica runs: the driver passes these to `soak sharded-replica`.
#[derive(Clone, Debug, clap::Args)]
pub struct ReplicaArgs {
    /// The kubeconfig to use (the driver's, through its fault proxy).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// This replica's identity in the ring.
    #[arg(long)]
    identity: String,
    /// Appends one JSON line per finished reconcile here.
    #[arg(long)]
    records: PathBuf,
    /// How long the ring's Leases last without renewal, milliseconds.
    #[arg(long, default_value_t = 4_000)]
    lease_ms: u64,
    /// Slots the hash space is cut into.
    #[arg(long, default_value_t = 16)]
    slots: u16,
}

/// Runs one replica until SIGTERM or SIGINT.
///
/// # Errors
///
/// When the cluster cannot be reached at start, the records cannot be written, or the
/// manager fails.
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
    let lease = Duration::from_millis(args.lease_ms);
    let ring = RingConfig::new(
        LeaseConfig::new(RING)
            .in_namespace(RING_NAMESPACE)
            .with_identity(&args.identity)
            .lease_duration(lease)
            .renew_deadline(lease * 2 / 3)
            .retry_period(lease / 15),
    )
    .slots(args.slots);
    let records = File::options()
        .create(true)
        .append(true)
        .open(&args.records)
        .with_context(|| format!("opening {}", args.records.display()))?;
    let mut manager = Manager::new(client)
        .probe_address(None)
        .metrics_address(None);
    let ring = manager.shard_ring(ring)?;
    let controller = manager
        .sharded_controller::<Pod>(CONTROLLER, Scope::all(), &ring)
        .workers(2);
    let context = Arc::new(Replica {
        identity: args.identity.clone(),
        records: Mutex::new(records),
    });
    manager.add_controller(controller, (reconcile, retry_with_backoff(), context));
    info!(identity = %args.identity, "joining the ring");
    manager.bind().await?.run(cancel).await?;
    Ok(())
}

struct Replica {
    identity: String,
    records: Mutex<File>,
}

async fn reconcile(
    request: ReconcileRequest<Pod>,
    replica: Arc<Replica>,
) -> Result<Action, std::io::Error> {
    let started_ns = unix_nanos();
    let marker = match &request {
        ReconcileRequest::Present(pod) => marker_of(&pod.metadata),
        ReconcileRequest::Deleted { .. } => None,
    };
    // Known for a forwarded deletion too, which comes without a last state.
    let uid = request.uid().map(str::to_owned);
    // Long enough for a second reconcile of the key, by this replica or another, to
    // overlap it if the queue or the ring let one start.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let record = ReconcileRecord {
        controller: CONTROLLER.to_owned(),
        replica: Some(replica.identity.clone()),
        uid,
        key: request.key().to_string(),
        marker,
        started_ns,
        finished_ns: unix_nanos(),
    };
    let mut line = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
    line.push(b'\n');
    // One write per line, unbuffered: a killed replica loses no finished reconcile.
    replica
        .records
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .write_all(&line)?;
    Ok(Action::done())
}

/// What happened to the replicas during a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Churn {
    /// Replicas killed with SIGKILL, and started again.
    pub killed: Vec<(String, i64)>,
    pub restarted: Vec<(String, i64)>,
    /// Replicas that joined the ring mid-run.
    pub joined: Vec<(String, i64)>,
    /// Replicas that ended when nobody stopped them, or did not stop cleanly.
    pub unexpected: Vec<String>,
}

impl Churn {
    /// When each replica was killed.
    pub fn kills(&self) -> crate::check::Kills {
        let mut kills = crate::check::Kills::new();
        for (identity, at) in &self.killed {
            kills.entry(identity.clone()).or_default().push(*at);
        }
        kills
    }
}

/// How the driver starts one kind of replica: this binary's hidden subcommand, the names
/// the replicas get, and the arguments they all share.
#[derive(Clone, Debug)]
pub struct ReplicaCommand {
    /// The hidden subcommand (`sharded-replica`, `leader-replica`).
    pub subcommand: &'static str,
    /// Replicas are named `{prefix}0`, `{prefix}1`, …
    pub prefix: &'static str,
    /// Arguments after the kubeconfig, the identity and the records.
    pub args: Vec<String>,
    /// `RUST_LOG` for the replicas, unless `SOAK_REPLICA_LOG` says otherwise.
    pub log_filter: &'static str,
}

/// The sharded subject's replicas: `sharded-replica` with the ring's Lease duration.
pub fn command(lease: Duration) -> ReplicaCommand {
    ReplicaCommand {
        subcommand: "sharded-replica",
        prefix: "r",
        args: vec!["--lease-ms".to_owned(), lease.as_millis().to_string()],
        log_filter: "warn,kube_informer::sharding=info",
    }
}

/// Replicas of one subject, run as child processes of the driver, each appending records
/// of type `R` (one JSON line each) to a file of its own.
pub struct ReplicaSet<R = ReconcileRecord> {
    binary: PathBuf,
    kubeconfig: PathBuf,
    dir: PathBuf,
    command: ReplicaCommand,
    running: BTreeMap<String, Child>,
    readers: BTreeMap<String, RecordReader<R>>,
    churn: Churn,
}

impl<R: DeserializeOwned + Clone> ReplicaSet<R> {
    /// Starts `replicas` replicas named after `command`'s prefix on `kubeconfig`, keeping
    /// their records and logs in `dir`.
    ///
    /// # Errors
    ///
    /// When this binary cannot be found or a replica cannot be started.
    pub fn start(
        command: ReplicaCommand,
        replicas: usize,
        kubeconfig: &Path,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let mut set = Self {
            binary: std::env::current_exe().context("finding the soak binary")?,
            kubeconfig: kubeconfig.to_owned(),
            dir: dir.to_owned(),
            command,
            running: BTreeMap::new(),
            readers: BTreeMap::new(),
            churn: Churn::default(),
        };
        for i in 0..replicas {
            let identity = format!("{}{i}", set.command.prefix);
            set.spawn(&identity)?;
        }
        Ok(set)
    }

    fn spawn(&mut self, identity: &str) -> anyhow::Result<()> {
        let records = self.dir.join(format!("{identity}.jsonl"));
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{identity}.log")))?;
        let child = Command::new(&self.binary)
            .arg(self.command.subcommand)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--identity", identity])
            .arg("--records")
            .arg(&records)
            .args(&self.command.args)
            .env(
                "RUST_LOG",
                std::env::var("SOAK_REPLICA_LOG")
                    .unwrap_or_else(|_| self.command.log_filter.into()),
            )
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting replica {identity}"))?;
        self.running.insert(identity.to_owned(), child);
        self.readers
            .entry(identity.to_owned())
            .or_insert_with(|| RecordReader::new(records));
        Ok(())
    }

    /// Notes replicas that ended on their own.
    fn reap(&mut self) {
        self.running
            .retain(|identity, child| match child.try_wait() {
                Ok(None) => true,
                Ok(Some(status)) => {
                    warn!(%identity, %status, "a replica ended on its own");
                    self.churn
                        .unexpected
                        .push(format!("replica {identity} ended on its own: {status}"));
                    false
                }
                Err(error) => {
                    self.churn.unexpected.push(format!(
                        "replica {identity} could not be waited on: {error}"
                    ));
                    false
                }
            });
    }

    async fn kill(&mut self, identity: &str) {
        self.reap();
        if let Some(mut child) = self.running.remove(identity) {
            info!(%identity, "killing a replica");
            if let Err(error) = child.kill().await {
                warn!(%identity, %error, "a replica could not be killed");
            }
            self.churn.killed.push((identity.to_owned(), unix_nanos()));
        }
    }

    fn restart(&mut self, identity: &str) -> anyhow::Result<()> {
        if !self.running.contains_key(identity) {
            info!(%identity, "starting a killed replica again");
            self.spawn(identity)?;
            self.churn
                .restarted
                .push((identity.to_owned(), unix_nanos()));
        }
        Ok(())
    }

    fn join(&mut self) -> anyhow::Result<String> {
        let identity = format!("{}{}", self.command.prefix, self.readers.len());
        info!(%identity, "a replica joins");
        self.spawn(&identity)?;
        self.churn.joined.push((identity.clone(), unix_nanos()));
        Ok(identity)
    }

    /// When each replica was killed, so far.
    pub fn kills(&self) -> crate::check::Kills {
        self.churn.kills()
    }

    /// Every record the replicas have written so far (for the sharded subject, each
    /// reconcile it finished).
    ///
    /// # Errors
    ///
    /// When a record file cannot be read or holds a line that is not a record.
    pub fn records(&mut self) -> anyhow::Result<Vec<R>> {
        let mut all = Vec::new();
        for reader in self.readers.values_mut() {
            all.extend_from_slice(reader.read_new()?);
        }
        Ok(all)
    }

    /// Stops every replica with SIGTERM and waits for it; returns what happened to them.
    pub async fn stop(&mut self) -> Churn {
        self.reap();
        for (identity, mut child) in std::mem::take(&mut self.running) {
            let stopped = match child.id() {
                Some(pid) => {
                    let _ = std::process::Command::new("kill")
                        .args(["-TERM", &pid.to_string()])
                        .status();
                    tokio::time::timeout(Duration::from_secs(30), child.wait()).await
                }
                None => Ok(child.wait().await),
            };
            match stopped {
                Ok(Ok(status)) if status.success() => {}
                Ok(Ok(status)) => self
                    .churn
                    .unexpected
                    .push(format!("replica {identity} stopped with {status}")),
                Ok(Err(error)) => self.churn.unexpected.push(format!(
                    "replica {identity} could not be waited on: {error}"
                )),
                Err(_) => self
                    .churn
                    .unexpected
                    .push(format!("replica {identity} did not stop within 30 s")),
            }
        }
        self.churn.clone()
    }
}

/// Reads a replica's record file as it grows, across the replica's restarts.
struct RecordReader<R> {
    path: PathBuf,
    offset: u64,
    records: Vec<R>,
}

impl<R: DeserializeOwned> RecordReader<R> {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            offset: 0,
            records: Vec::new(),
        }
    }

    /// All records so far, reading only what was appended since the last call; a line
    /// still being written is left for the next.
    fn read_new(&mut self) -> anyhow::Result<&[R]> {
        let mut file = match File::open(&self.path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(&[]),
            Err(error) => return Err(error.into()),
        };
        file.seek(SeekFrom::Start(self.offset))?;
        let mut reader = BufReader::new(file);
        let mut line = String::new();
        while reader.read_line(&mut line)? > 0 {
            if !line.ends_with('\n') {
                break;
            }
            self.offset += line.len() as u64;
            let record = serde_json::from_str(&line).with_context(|| {
                format!("a record in {} is not one: {line:?}", self.path.display())
            })?;
            self.records.push(record);
            line.clear();
        }
        Ok(&self.records)
    }
}

/// Kills one replica in each storm of `calendar` (the one `victim` names among those
/// running, given the storm's number) and starts it again a few seconds later; with
/// `join_halfway`, adds one replica halfway through the span. `seed` draws when in the
/// storm each kill comes and how long the replica stays down.
pub async fn churn<R, F>(
    set: Arc<tokio::sync::Mutex<ReplicaSet<R>>>,
    seed: u64,
    calendar: Calendar,
    join_halfway: bool,
    victim: F,
    stop: CancellationToken,
) -> anyhow::Result<()>
where
    R: DeserializeOwned + Clone,
    F: Fn(u32, &[String]) -> Option<String>,
{
    let mut rng = StdRng::seed_from_u64(seed);
    let start = calendar.start;
    let span = calendar.span;
    let mut joined = !join_halfway;
    for n in 0u32.. {
        let Some(storm_starts) = calendar.storm(n) else {
            break;
        };
        let kill_at = storm_starts + calendar.storm.mul_f64(rng.random_range(0.0..0.5));
        let down = Duration::from_millis(rng.random_range(1_000..6_000));
        if !joined && kill_at >= span / 2 {
            if !sleep_until(start + span / 2, &stop).await {
                break;
            }
            set.lock().await.join()?;
            joined = true;
        }
        if !sleep_until(start + kill_at, &stop).await {
            break;
        }
        let victim = {
            let mut set = set.lock().await;
            set.reap();
            let identities: Vec<String> = set.running.keys().cloned().collect();
            let Some(victim) = victim(n, &identities) else {
                break;
            };
            set.kill(&victim).await;
            victim
        };
        let restarted = sleep_until(start + kill_at + down, &stop).await;
        set.lock().await.restart(&victim)?;
        if !restarted {
            break;
        }
    }
    if !joined && sleep_until(start + span / 2, &stop).await {
        set.lock().await.join()?;
    }
    Ok(())
}

/// The replica storm `n` kills when nothing else decides: each in turn.
pub fn in_turn(n: u32, running: &[String]) -> Option<String> {
    running.get(n as usize % running.len().max(1)).cloned()
}

/// Sleeps until `at`; false when `stop` fired first.
async fn sleep_until(at: tokio::time::Instant, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        () = tokio::time::sleep_until(at) => true,
    }
}
