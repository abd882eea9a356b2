//! `subject-fleet`: kube-informer's side of `fleet-bench`, one process so that its memory
//! is its own.
//!
//! A [`Fleet`] with the library's defaults but for `.workers(W)` and the provider
//! ([`KubeconfigDirectory`] over `--dir` for real clusters, [`NamespaceClusters`] with a
//! label selector for namespace-clusters) engages each cluster as a user writes it: an
//! informer on the cluster's ConfigMaps (of the whole cluster, or of its one namespace)
//! feeding `Controller::new(...).workers(cluster.workers()).share_workers(cluster.tenant())`,
//! whose reconcile (client-go's `sync(key)` form, [`sync_by_key`]) reads the object from the
//! cache, works for the milliseconds its cost annotation says (none for the initial
//! objects), and records the time.
//!
//! It prints the lines of `fleet_lines.rs` on stdout: `ready` once the fleet runs (with no
//! cluster yet), `engaged` as each cluster's run starts, `first` at its first reconcile,
//! `synced` once its `--objects` initial objects are reconciled, `sample` at each sample
//! object's first reconcile, `flood_done` once a cluster has reconciled `--flood` objects
//! of one flood. It runs until stdin closes.

use std::{
    collections::{HashMap, HashSet},
    convert::Infallible,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use clap::{Parser, ValueEnum};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_informer::{
    CancellationToken, Controller, ObjectKey,
    fleet::{Engaged, Fleet, KubeconfigDirectory, NamespaceClusters},
    retry_with_backoff, sync_by_key,
};
use tracing::{info, warn};

#[path = "../fleet_lines.rs"]
mod fleet_lines;

use fleet_lines::{COST_ANNOTATION, FLOOD_PREFIX, INITIAL_PREFIX, Line, SAMPLE_PREFIX};

/// Where the clusters come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Setup {
    /// One kubeconfig file per cluster in `--dir` (`KubeconfigDirectory`, read every 2 s).
    Real,
    /// Each namespace of one API server selected by `--selector` (`NamespaceClusters`).
    Namespaces,
}

/// kube-informer's fleet subject of `fleet-bench`.
#[derive(Debug, Parser)]
#[command(name = "subject-fleet")]
struct Args {
    /// Where the clusters come from.
    #[arg(long, value_enum)]
    setup: Setup,
    /// The directory of kubeconfig files (`--setup real`).
    #[arg(long, required_if_eq("setup", "real"))]
    dir: Option<PathBuf>,
    /// The kubeconfig of the API server whose namespaces are the clusters
    /// (`--setup namespaces`).
    #[arg(long, required_if_eq("setup", "namespaces"))]
    kubeconfig: Option<PathBuf>,
    /// The label selector of the namespaces that are clusters.
    #[arg(long, default_value = "fleet-bench/member=yes")]
    selector: String,
    /// The fleet's workers (`Fleet::workers`).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Initial objects per cluster: `synced` once this many are reconciled.
    #[arg(long)]
    objects: usize,
    /// Objects per flood: `flood_done` once a cluster has reconciled this many of one.
    #[arg(long, default_value_t = 0)]
    flood: usize,
}

/// What each cluster's reconciles have seen, and the lines they print.
struct Recorder {
    objects: usize,
    flood: usize,
    clusters: Mutex<HashMap<String, Seen>>,
}

/// One cluster's reconciles.
#[derive(Default)]
struct Seen {
    first: bool,
    initial: HashSet<String>,
    synced: bool,
    /// Each flood's objects reconciled, by flood.
    floods: HashMap<String, HashSet<String>>,
    samples: HashSet<String>,
}

impl Recorder {
    fn print(line: &Line) {
        match serde_json::to_string(line) {
            Ok(text) => println!("{text}"),
            Err(error) => warn!(%error, "a line did not serialise"),
        }
    }

    fn engaged(&self, cluster: &str) {
        Self::print(&Line::Engaged {
            cluster: cluster.to_owned(),
            at_ns: benches::unix_nanos(),
        });
    }

    /// A reconcile of `name` in `cluster` ended.
    fn reconciled(&self, cluster: &str, name: &str) {
        let at_ns = benches::unix_nanos();
        let mut lines = Vec::new();
        {
            let mut clusters = self.clusters.lock().unwrap_or_else(|p| p.into_inner());
            let seen = clusters.entry(cluster.to_owned()).or_default();
            if !seen.first {
                seen.first = true;
                lines.push(Line::First {
                    cluster: cluster.to_owned(),
                    name: name.to_owned(),
                    at_ns,
                });
            }
            if name.starts_with(INITIAL_PREFIX) {
                if !seen.synced
                    && seen.initial.insert(name.to_owned())
                    && seen.initial.len() >= self.objects
                {
                    seen.synced = true;
                    lines.push(Line::Synced {
                        cluster: cluster.to_owned(),
                        objects: seen.initial.len(),
                        at_ns,
                    });
                    // Held no longer: the cluster is synced.
                    seen.initial = HashSet::new();
                }
            } else if let Some(rest) = name.strip_prefix(FLOOD_PREFIX) {
                let phase = rest.rsplit_once('-').map_or(rest, |(phase, _)| phase);
                let flood = seen.floods.entry(phase.to_owned()).or_default();
                if flood.insert(name.to_owned()) && flood.len() == self.flood {
                    lines.push(Line::FloodDone {
                        cluster: cluster.to_owned(),
                        phase: phase.to_owned(),
                        reconciled: flood.len(),
                        at_ns,
                    });
                }
            } else if name.starts_with(SAMPLE_PREFIX) && seen.samples.insert(name.to_owned()) {
                lines.push(Line::Sample {
                    cluster: cluster.to_owned(),
                    name: name.to_owned(),
                    at_ns,
                });
            }
        }
        for line in &lines {
            Self::print(line);
        }
    }
}

/// How long a reconcile of `config_map` works: its cost annotation, ms.
fn cost_of(config_map: Option<&ConfigMap>) -> Duration {
    let ms = config_map
        .and_then(|cm| cm.metadata.annotations.as_ref())
        .and_then(|annotations| annotations.get(COST_ANNOTATION))
        .and_then(|value| value.parse::<u64>().ok())
        .unwrap_or(0);
    Duration::from_millis(ms)
}

/// What the fleet runs in each cluster: the ConfigMaps' informer and its controller.
async fn engage(cluster: Engaged, recorder: Arc<Recorder>) -> Result<(), kube_informer::Error> {
    let name = cluster.cluster().name().to_string();
    let informer = cluster.factory().informer::<ConfigMap>(cluster.scope());
    let store = informer.store();
    recorder.engaged(&name);
    let sync = move |key: ObjectKey, recorder: Arc<Recorder>| {
        let cost = cost_of(store.get_by_key(key.as_str()).as_deref());
        let cluster = name.clone();
        async move {
            if !cost.is_zero() {
                tokio::time::sleep(cost).await;
            }
            recorder.reconciled(&cluster, key.name());
            Ok::<(), Infallible>(())
        }
    };
    Controller::new("fleet-bench", informer)
        .workers(cluster.workers())
        .share_workers(cluster.tenant())
        .run(
            (sync_by_key(sync), retry_with_backoff(), recorder),
            cluster.cancel(),
        )
        .await
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    benches::init_tracing("warn,kube_informer::fleet=info");
    let args = Args::parse();
    if args.workers == 0 || args.objects == 0 {
        anyhow::bail!("--workers and --objects must be at least 1");
    }
    let recorder = Arc::new(Recorder {
        objects: args.objects,
        flood: args.flood,
        clusters: Mutex::new(HashMap::new()),
    });
    let fleet = match args.setup {
        Setup::Real => {
            let dir = args.dir.context("--setup real needs --dir")?;
            if !dir.is_dir() {
                anyhow::bail!("--dir {} is not a directory", dir.display());
            }
            Fleet::new(KubeconfigDirectory::new(dir))
        }
        Setup::Namespaces => {
            let path = args
                .kubeconfig
                .context("--setup namespaces needs --kubeconfig")?;
            let client = benches::informer_client(&path)
                .await
                .with_context(|| format!("a client from {}", path.display()))?;
            Fleet::new(NamespaceClusters::new(client).label_selector(args.selector.clone()))
        }
    }
    .workers(args.workers);
    let cancel = CancellationToken::new();
    let running = tokio::spawn({
        let (recorder, cancel) = (recorder.clone(), cancel.clone());
        fleet.run(
            move |cluster: Engaged| engage(cluster, recorder.clone()),
            cancel,
        )
    });
    let workers = args.workers;
    Recorder::print(&Line::Ready {
        subject: "kube-informer".to_owned(),
        workers: format!(
            "Fleet::workers({workers}): a FairShare of {workers} turns, at most {} per cluster \
             (the default); each cluster's Controller has {workers} workers",
            workers.saturating_sub(1).max(1)
        ),
        at_ns: benches::unix_nanos(),
    });
    info!(setup = ?args.setup, workers, "the fleet runs");
    benches::wait_for_stdin().await;
    cancel.cancel();
    match tokio::time::timeout(Duration::from_secs(30), running).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => warn!(%error, "the fleet's task failed"),
        Err(_) => warn!("the fleet did not stop within 30 s"),
    }
    Ok(())
}
