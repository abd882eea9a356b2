//! sharded-controller: one controller run as several replicas that split its objects.
//!
//! Each replica joins a shard ring (one `coordination.k8s.io` Lease per replica and one per
//! slot of the hash space of object UIDs), caches only the ConfigMaps of its slots (the API
//! server selects them when its `ShardedListAndWatch` gate is on, the informer otherwise),
//! and logs the labels of each ConfigMap it reconciles, as object-tutorials does. A replica
//! that stops lets go of its slots at once; one that dies loses them when its Leases
//! expire; either way the others take them over and reconcile their objects.
//!
//! ```text
//! cargo run -p examples --bin sharded-controller -- --identity a &
//! cargo run -p examples --bin sharded-controller -- --identity b &
//! cargo run -p examples --bin sharded-controller -- --identity c &
//! ```

use std::{
    collections::BTreeMap,
    fs::File,
    io::Write,
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use clap::Parser;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_informer::lease::{LeaseConfig, default_identity};
use kube_informer::{
    Action, ClusterSource, Manager, ReconcileRequest, Scope, cancel_on_signals, retry_with_backoff,
    sharding::RingConfig,
};
use serde::Serialize;

/// Logs the labels of the ConfigMaps in one namespace, split across every replica that
/// runs with the same ring.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The namespace whose ConfigMaps are reconciled; the ring's Leases live there too.
    #[arg(long, default_value = "sharded-controller")]
    namespace: String,
    /// The ring's name: replicas with the same one split the objects.
    #[arg(long, default_value = "sharded-controller")]
    ring: String,
    /// This replica's identity in the ring (a DNS label); default: $POD_NAME, else the
    /// host name, and a random suffix.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Slots the hash space is cut into.
    #[arg(long, default_value_t = 16)]
    slots: u16,
    /// Seconds a replica's Leases last without renewal; the renew deadline is two thirds
    /// of it and the Leases are renewed every fifteenth.
    #[arg(long, default_value_t = 15.0)]
    lease_seconds: f64,
    /// Reconciles run at once.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Milliseconds each reconcile takes after logging (to watch a handover wait for the
    /// reconciles in flight).
    #[arg(long, default_value_t = 0)]
    hold_ms: u64,
    /// Appends one JSON line per finished reconcile here: replica, key, labels, start and
    /// end in nanoseconds since the Unix epoch.
    #[arg(long)]
    reconcile_log: Option<PathBuf>,
    /// Where `/metrics` is served (the ring's metrics among them); none by default.
    #[arg(long)]
    metrics_address: Option<SocketAddr>,
    /// The kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or the in-cluster
    /// service account).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long)]
    context: Option<String>,
}

/// One finished reconcile, as `--reconcile-log` records it.
#[derive(Serialize)]
struct Reconciled<'a> {
    replica: &'a str,
    key: String,
    /// The object's UID (which slot it is in), when it was cached.
    uid: Option<String>,
    labels: BTreeMap<String, String>,
    started_ns: u128,
    ended_ns: u128,
}

struct Context {
    identity: String,
    hold: Duration,
    log: Option<Mutex<File>>,
}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

async fn reconcile(
    request: ReconcileRequest<ConfigMap>,
    ctx: Arc<Context>,
) -> Result<Action, std::io::Error> {
    let started_ns = unix_nanos();
    let key = request.key().to_string();
    let uid = request.uid().map(str::to_owned);
    let labels = match &request {
        ReconcileRequest::Present(cm) => {
            let labels = cm.metadata.labels.clone().unwrap_or_default();
            tracing::info!(%key, ?labels, replica = %ctx.identity, "reconciled");
            labels
        }
        ReconcileRequest::Deleted { .. } => {
            tracing::info!(%key, replica = %ctx.identity, "gone");
            BTreeMap::new()
        }
    };
    if !ctx.hold.is_zero() {
        tokio::time::sleep(ctx.hold).await;
    }
    if let Some(log) = &ctx.log {
        let record = Reconciled {
            replica: &ctx.identity,
            key,
            uid,
            labels,
            started_ns,
            ended_ns: unix_nanos(),
        };
        let mut line = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        // One write per line, unbuffered: a killed replica loses no finished reconcile.
        log.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .write_all(&line)?;
    }
    Ok(Action::done())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let cancel = cancel_on_signals();
    let mut cluster = ClusterSource::default();
    if let Some(path) = &args.kubeconfig {
        cluster = cluster.kubeconfig(path);
    }
    if let Some(context) = &args.context {
        cluster = cluster.context(context);
    }
    let client = cluster.client().await?;
    let identity = args.identity.unwrap_or_else(default_identity);
    let lease = Duration::from_secs_f64(args.lease_seconds);
    let ring_config = RingConfig::new(
        LeaseConfig::new(&args.ring)
            .in_namespace(&args.namespace)
            .with_identity(&identity)
            .lease_duration(lease)
            .renew_deadline(lease * 2 / 3)
            .retry_period(lease / 15),
    )
    .slots(args.slots);
    let log = match &args.reconcile_log {
        Some(path) => Some(Mutex::new(
            File::options()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?,
        )),
        None => None,
    };

    let mut manager = Manager::new(client)
        .probe_address(None)
        .metrics_address(args.metrics_address);
    let ring = manager.shard_ring(ring_config)?;
    let controller = manager
        .sharded_controller::<ConfigMap>(
            "sharded-controller",
            Scope::namespace(&args.namespace),
            &ring,
        )
        .workers(args.workers);
    let context = Arc::new(Context {
        identity: identity.clone(),
        hold: Duration::from_millis(args.hold_ms),
        log,
    });
    manager.add_controller(controller, (reconcile, retry_with_backoff(), context));
    tracing::info!(namespace = %args.namespace, ring = %args.ring, %identity, "joining the ring");
    manager.bind().await?.run(cancel).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    examples::init_tracing();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}
