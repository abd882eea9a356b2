//! `own-writes-bench`: a controller that reads its own writes beside the same controller
//! that does not, on one local control plane.
//!
//! The controller reconciles Secrets ("parents") and creates one ConfigMap child per
//! parent when its cache holds none; it [`owns`](kube_informer::Controller::owns) the
//! children. Each run creates the parents first, then starts the controller and, at the
//! same time, updates every parent four times in a row (the last update marks it final),
//! so reconciles of a parent follow its own child's creation within milliseconds. The
//! run ends when every parent has been reconciled in its final state. Both modes run in
//! every run, in alternating order: [`OwnWrites::Awaited`] (the default) and
//! [`OwnWrites::Ignored`].
//!
//! Reported per mode (medians over the runs): reconciles per second and their count, the
//! time to converge, each reconcile's latency (p50, p99; the wait included), the API
//! writes the reconciles made (creates, failed ones included), the reconciles that failed
//! and were retried, and the reads that waited. The driver's own updates are the same in
//! both modes and are not counted.

use std::{
    collections::{BTreeMap, HashSet},
    fmt::Write as _,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use benches::{machine, median};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{
    api::core::v1::{ConfigMap, Secret},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube_client::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use kube_informer::{
    Action, CancellationToken, ClientError, Controller, ControllerClient, InformerFactory,
    ObjectKey, ReconcileRequest, Scope, controller::OwnWrites, retry_with_backoff,
};
use kube_testenv::TestEnv;
use serde::Serialize;
use tracing::info;

/// Runs the child-creating controller with and without waiting for its own writes.
#[derive(Debug, Clone, Parser)]
#[command(name = "own-writes-bench")]
struct Args {
    /// Runs of each mode.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Parents per run.
    #[arg(long, default_value_t = 1000)]
    parents: usize,
    /// The controller's workers.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Concurrent requests of the driver (creating and updating parents).
    #[arg(long, default_value_t = 32)]
    in_flight: usize,
    /// Where the results go, as JSON.
    #[arg(long, default_value = "target/own-writes-bench.json")]
    json: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Mode {
    Awaited,
    Ignored,
}

impl Mode {
    fn own_writes(self) -> OwnWrites {
        match self {
            Mode::Awaited => OwnWrites::default(),
            Mode::Ignored => OwnWrites::Ignored,
        }
    }
}

/// One run of one mode.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    mode: Mode,
    run: usize,
    converged_s: f64,
    reconciles: u64,
    reconciles_per_s: f64,
    latency_p50_ms: f64,
    latency_p99_ms: f64,
    api_writes: u64,
    already_exists: u64,
    failed_reconciles: u64,
    waited_reads: u64,
    waited_ms: f64,
}

const CHILD_LABEL: &str = "own-writes-bench/child";

#[derive(Default)]
struct Counts {
    reconciles: AtomicU64,
    failed: AtomicU64,
    creates: AtomicU64,
    already_exists: AtomicU64,
    latencies: Mutex<Vec<Duration>>,
    finished: Mutex<HashSet<String>>,
}

struct Ctx {
    client: ControllerClient,
    counts: Counts,
}

fn child(parent: &Secret) -> ConfigMap {
    let name = parent.metadata.name.clone().unwrap_or_default();
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Secret".into(),
        name: name.clone(),
        uid: parent.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        ..OwnerReference::default()
    };
    let mut labels = BTreeMap::new();
    labels.insert(CHILD_LABEL.to_owned(), "yes".to_owned());
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("{name}-child")),
            namespace: parent.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

async fn reconcile_parent(parent: &Secret, ctx: &Ctx) -> Result<Action, ClientError> {
    let child = child(parent);
    let key = ObjectKey::from_object(&child).map_err(|_| ClientError::Invalid {
        verb: "create",
        kind: "ConfigMap".into(),
        reason: "the parent has no name",
    })?;
    if ctx.client.get::<ConfigMap>(&key).await?.is_none() {
        ctx.counts.creates.fetch_add(1, Ordering::Relaxed);
        if let Err(error) = ctx.client.create(&child).await {
            if error.status_code() == Some(409) {
                ctx.counts.already_exists.fetch_add(1, Ordering::Relaxed);
            }
            return Err(error);
        }
    }
    let annotations = parent.metadata.annotations.as_ref();
    if annotations.and_then(|a| a.get("round")).map(String::as_str) == Some("final") {
        let name = parent.metadata.name.clone().unwrap_or_default();
        ctx.counts.finished.lock().unwrap().insert(name);
    }
    Ok(Action::done())
}

async fn reconcile(
    request: ReconcileRequest<Secret>,
    ctx: Arc<Ctx>,
) -> Result<Action, ClientError> {
    let started = Instant::now();
    let outcome = match &request {
        ReconcileRequest::Present(parent) => reconcile_parent(parent, &ctx).await,
        ReconcileRequest::Deleted { .. } => Ok(Action::done()),
    };
    let counts = &ctx.counts;
    counts.latencies.lock().unwrap().push(started.elapsed());
    counts.reconciles.fetch_add(1, Ordering::Relaxed);
    if outcome.is_err() {
        counts.failed.fetch_add(1, Ordering::Relaxed);
    }
    outcome
}

fn parent_name(i: usize) -> String {
    format!("p-{i:05}")
}

async fn create_parents(api: &Api<Secret>, args: &Args) -> anyhow::Result<()> {
    futures::stream::iter(0..args.parents)
        .map(|i| {
            let parent = Secret {
                metadata: ObjectMeta {
                    name: Some(parent_name(i)),
                    ..ObjectMeta::default()
                },
                ..Secret::default()
            };
            async move { api.create(&PostParams::default(), &parent).await }
        })
        .buffer_unordered(args.in_flight)
        .try_for_each(|_| async { Ok(()) })
        .await
        .context("creating the parents")
}

async fn update_parents(api: &Api<Secret>, args: &Args) -> anyhow::Result<()> {
    futures::stream::iter(0..args.parents)
        .map(|i| async move {
            for round in ["1", "2", "3", "final"] {
                let patch =
                    serde_json::json!({ "metadata": { "annotations": { "round": round } } });
                api.patch(
                    &parent_name(i),
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                )
                .await?;
            }
            Ok::<(), kube_client::Error>(())
        })
        .buffer_unordered(args.in_flight)
        .try_for_each(|()| async { Ok(()) })
        .await
        .context("updating the parents")
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1e3
}

async fn run_once(
    env: &TestEnv,
    client: &Client,
    args: &Args,
    mode: Mode,
    run: usize,
) -> anyhow::Result<Sample> {
    let namespace = env.create_namespace("own-writes-bench").await?;
    let parents: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    create_parents(&parents, args).await?;

    let factory = InformerFactory::new(client.clone());
    let controller =
        Controller::new(
            "own-writes-bench",
            factory.informer::<Secret>(Scope::namespace(&namespace)),
        )
        .owns(factory.informer::<ConfigMap>(
            Scope::namespace(&namespace).labels(format!("{CHILD_LABEL}=yes")),
        ))
        .workers(args.workers)
        .own_writes(mode.own_writes());
    let ctx = Arc::new(Ctx {
        client: controller.client(client.clone()),
        counts: Counts::default(),
    });
    let stats = controller.own_write_stats();
    let cancel = CancellationToken::new();
    let started = Instant::now();
    factory.start(&cancel);
    let run_task = tokio::spawn(controller.run(
        (reconcile, retry_with_backoff(), ctx.clone()),
        cancel.clone(),
    ));
    update_parents(&parents, args).await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut ticker = tokio::time::interval(Duration::from_millis(10));
    while ctx.counts.finished.lock().unwrap().len() < args.parents {
        if Instant::now() > deadline {
            bail!("{mode:?} run {run}: not every parent converged within 10 minutes");
        }
        ticker.tick().await;
    }
    let converged = started.elapsed();
    cancel.cancel();
    run_task.await??;
    // The namespace stays: deleting 2,000 objects would load the next run's server.

    let counts = &ctx.counts;
    let mut latencies = std::mem::take(&mut *counts.latencies.lock().unwrap());
    latencies.sort();
    let reconciles = counts.reconciles.load(Ordering::Relaxed);
    let sample = Sample {
        mode,
        run,
        converged_s: converged.as_secs_f64(),
        reconciles,
        reconciles_per_s: reconciles as f64 / converged.as_secs_f64(),
        latency_p50_ms: percentile(&latencies, 0.50),
        latency_p99_ms: percentile(&latencies, 0.99),
        api_writes: counts.creates.load(Ordering::Relaxed),
        already_exists: counts.already_exists.load(Ordering::Relaxed),
        failed_reconciles: counts.failed.load(Ordering::Relaxed),
        waited_reads: stats.read().waited,
        waited_ms: stats.read().waited_for.as_secs_f64() * 1e3,
    };
    info!(?sample, "run done");
    Ok(sample)
}

fn report(args: &Args, samples: &[Sample]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "`own-writes-bench --runs {} --parents {} --workers {}` on {}; medians of {} runs per mode.\n",
        args.runs,
        args.parents,
        args.workers,
        machine(),
        args.runs
    );
    let _ = writeln!(
        out,
        "| mode | reconciles/s | reconciles | converged (s) | latency p50 (ms) | p99 (ms) | API writes | AlreadyExists | failed reconciles | reads that waited | waited (ms, all) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for mode in [Mode::Awaited, Mode::Ignored] {
        let of = |f: fn(&Sample) -> f64| {
            median(samples.iter().filter(|s| s.mode == mode).map(f).collect())
        };
        let _ = writeln!(
            out,
            "| {mode:?} | {:.0} | {:.0} | {:.2} | {:.3} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            of(|s| s.reconciles_per_s),
            of(|s| s.reconciles as f64),
            of(|s| s.converged_s),
            of(|s| s.latency_p50_ms),
            of(|s| s.latency_p99_ms),
            of(|s| s.api_writes as f64),
            of(|s| s.already_exists as f64),
            of(|s| s.failed_reconciles as f64),
            of(|s| s.waited_reads as f64),
            of(|s| s.waited_ms),
        );
    }
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    benches::init_tracing("info,kube_client=off,kube_informer=warn");
    let args = Args::parse();
    if args.runs == 0 || args.parents == 0 {
        bail!("nothing to run: --runs and --parents must be at least 1");
    }
    info!("starting the control plane");
    let env = TestEnv::builder()
        .start()
        .await
        .context("starting the control plane")?;
    let client = env.client().await?;
    let mut samples = Vec::new();
    for run in 0..args.runs {
        // Alternate which mode goes first, so neither always meets a fresher server.
        let order = if run % 2 == 0 {
            [Mode::Awaited, Mode::Ignored]
        } else {
            [Mode::Ignored, Mode::Awaited]
        };
        for mode in order {
            info!(run, ?mode, parents = args.parents, "running");
            samples.push(run_once(&env, &client, &args, mode, run).await?);
        }
    }
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&samples)?)
        .with_context(|| format!("writing {}", args.json.display()))?;
    print!("{}", report(&args, &samples));
    Ok(())
}
