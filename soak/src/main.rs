//! `soak`: kube-informer's and client-go's informers under steady load and random
//! combined faults on a real control plane, every handler's event history and every
//! reconcile checked against the server's history.
//!
//! A writer changes a few hundred (or thousand) Pods and custom resources across
//! namespaces at a steady rate, recording each write as the server answered it. Faults
//! drawn from the seed fire meanwhile, several at once at times: connection resets,
//! stalls, latency and bandwidth limits through a Toxiproxy in front of each subject,
//! kube-apiserver killed and restarted, etcd compacted (watches get 410 Gone), etcd
//! restarted; the subjects' watch timeouts may be made short. When the load stops, the
//! faults are lifted and every subject must reach the server's final state within a
//! bound; then the checks of [`check`] run over everything recorded, and the last line
//! says how many violations they found.
//!
//! Beside them, replicas of a sharded controller split the Pods through a shard ring on
//! the same faulty link, one killed and started again each storm, one more joining
//! halfway ([`sharded`]). Two replicas of a leader-elected controller share one Lease on a
//! faulty link of their own, the leader killed each storm; it gives each of the run's
//! parents a child through its controller's client and holds a finalizer on them whose
//! cleanup calls a counter outside the cluster ([`leader`], [`parents`],
//! [`leader_check`]). A Pod informer is stopped in each storm and started again from its
//! snapshot, and its synced cache compared with the server's list at its version
//! ([`warm`]).
//!
//! ```text
//! cargo run -p soak -- --seconds 120           # the short mode CI runs
//! cargo run -p soak -- --seconds 1800 --seed 7 # a long run; the seed replays its faults
//! ```

mod check;
mod client_go;
mod faults;
mod leader;
mod leader_check;
mod parents;
mod record;
mod sharded;
mod subject;
mod warm;
mod watchdog;
mod writer;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::Parser;
use k8s_openapi::{
    api::core::v1::Namespace,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube_client::{
    Api, Client,
    api::{DynamicObject, ListParams, PostParams},
};
use kube_testenv::{FaultProxy, TestEnv};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::info;
use tracing_subscriber::{EnvFilter, Layer, layer::SubscriberExt, util::SubscriberInitExt};

use crate::{
    check::{Bounds, Calm, Findings, LagSummary, Rule, Violation},
    faults::{FaultKind, Injected},
    record::{EventRecord, Resource, ServerHistory, unix_nanos},
    subject::Tuning,
    watchdog::{MemorySample, Uncaused},
    writer::{Load, Writer},
};

/// Runs kube-informer's and client-go's informers under steady load and random combined
/// faults on a real control plane, and checks every event history against the server's.
#[derive(Debug, Clone, Parser)]
#[command(name = "soak", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    mode: Option<Mode>,
    #[command(flatten)]
    args: Args,
}

#[derive(Debug, Clone, clap::Subcommand)]
enum Mode {
    /// One replica of the sharded subject (the driver starts these itself).
    #[command(hide = true)]
    ShardedReplica(sharded::ReplicaArgs),
    /// One replica of the leader-elected subject (the driver starts these itself).
    #[command(hide = true)]
    LeaderReplica(leader::ReplicaArgs),
}

#[derive(Debug, Clone, clap::Args)]
struct Args {
    /// How long the load and the faults last, seconds (about 120 is the short mode CI
    /// runs; 1800 or more is a long run).
    #[arg(long, default_value_t = 120)]
    seconds: u64,
    /// The seed of the fault schedule and the writer's choices; a random one is drawn and
    /// printed when none is given.
    #[arg(long)]
    seed: Option<u64>,
    /// Pods the writer changes.
    #[arg(long, default_value_t = 600)]
    pods: usize,
    /// Widgets (the run's custom resource) the writer changes.
    #[arg(long, default_value_t = 300)]
    widgets: usize,
    /// Namespaces the objects are spread over.
    #[arg(long, default_value_t = 3)]
    namespaces: usize,
    /// Writes per second.
    #[arg(long, default_value_t = 40.0)]
    rate: f64,
    /// During a storm, a fault starts about this often, seconds.
    #[arg(long, default_value_t = 5)]
    fault_every: u64,
    /// Storms of faults last this long, seconds.
    #[arg(long, default_value_t = 30)]
    storm_seconds: u64,
    /// Calm spells, without faults, last this long, seconds; the run starts with one.
    #[arg(long, default_value_t = 20)]
    calm_seconds: u64,
    /// The kinds of fault to draw from (all by default).
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<FaultKind>,
    /// Runs kube-informer's subject alone.
    #[arg(long)]
    no_client_go: bool,
    /// Replicas of the sharded controller at the start (one more joins halfway; 0, the
    /// default, runs none; 3 is the sharded subject's usual run).
    #[arg(long, default_value_t = 0)]
    replicas: usize,
    /// How long the shard ring's Leases last without renewal, milliseconds.
    #[arg(long, default_value_t = 4_000)]
    replica_lease_ms: u64,
    /// Replicas of the leader-elected controller (0 runs none; its leader is killed and
    /// started again each storm).
    #[arg(long, default_value_t = 2)]
    leader_replicas: usize,
    /// How long the leader-elected controller's Lease lasts without renewal, whole seconds.
    #[arg(long, default_value_t = 4)]
    leader_lease_seconds: u64,
    /// Parents (the leader-elected controller's custom resource) created at the start and
    /// kept about that many while the writer creates and deletes them.
    #[arg(long, default_value_t = 40)]
    parents: usize,
    /// Writes of parents per second (creates, annotations, deletes).
    #[arg(long, default_value_t = 4.0)]
    parent_rate: f64,
    /// Runs no warm-restarted informer (one is stopped and started again from its
    /// snapshot each storm by default).
    #[arg(long)]
    no_warm_restart: bool,
    /// The bound on a write's delivery to a fast handler while no fault is active, ms.
    #[arg(long, default_value_t = 5_000)]
    lag_bound_ms: u64,
    /// How long after a fault is lifted writes are not yet held to the lag bound, seconds
    /// (a watch reconnects with backoff; a relist takes time).
    #[arg(long, default_value_t = 8)]
    grace_seconds: u64,
    /// The bound on reaching the final state once the load and faults stop, seconds
    /// (slow handlers included).
    #[arg(long, default_value_t = 120)]
    settle_seconds: u64,
    /// Writes the whole report as JSON here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Writes what the checks read into this directory: the server's history as the
    /// writer recorded it, every event and every reconcile (JSON), the replicas' records
    /// and logs, and the leader-elected subject's observations (`leader.json`).
    #[arg(long)]
    records: Option<PathBuf>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(mode) = cli.mode {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(EnvFilter::from_default_env())
            .init();
        return match mode {
            Mode::ShardedReplica(replica) => sharded::run_replica(replica).await,
            Mode::LeaderReplica(replica) => leader::run_replica(replica).await,
        };
    }
    let args = cli.args;
    let uncaused = Uncaused::default();
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(
                    EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info,kube_informer=warn".into()),
                ),
        )
        .with(uncaused.clone())
        .init();
    watchdog::count_panics();
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    let replicas = match args.replicas {
        0 => String::new(),
        n => format!(" --replicas {n}"),
    };
    println!(
        "seed {seed} (replay its faults with: soak --seed {seed} --seconds {}{replicas})",
        args.seconds
    );
    let report = run(&args, seed, uncaused).await?;
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    print_report(&report);
    // client-go's subject runs beside ours for comparison: what it breaks is reported,
    // not counted against this library.
    let (theirs, ours): (Vec<_>, Vec<_>) = report
        .findings
        .violations
        .iter()
        .partition(|v| v.source.starts_with(client_go::NAME));
    println!(
        "client-go's subject: {} violations (for comparison)",
        theirs.len()
    );
    println!("{} violations", ours.len());
    if !ours.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

/// Everything a run found and measured.
#[derive(Debug, Serialize)]
struct Report {
    seed: u64,
    seconds: u64,
    tuning: String,
    /// Whether the API server had the `ShardedListAndWatch` gate (drawn from the seed).
    sharded_list_and_watch: bool,
    /// The sharded subject's replicas: killed, restarted, joined, and what went wrong.
    churn: sharded::Churn,
    /// The sharded subject's reconciles per replica.
    replica_reconciles: BTreeMap<String, usize>,
    /// Reconciles of a deleted object and of one created again under its name that ran at
    /// once on two replicas (their UIDs fall in two slots).
    recreated_at_once: usize,
    /// The leader-elected subject: its replicas, the parents written, what its checks
    /// covered.
    leader: Option<LeaderReport>,
    /// The warm-restarted informer's restarts and comparisons.
    warm_restarts: Option<warm::WarmSummary>,
    writes: u64,
    unanswered_writes: u64,
    faults: Vec<Injected>,
    late_handlers_added_during_relist: bool,
    /// Per stream, seconds from the end of the load and faults to its final state.
    settled_s: BTreeMap<String, Option<f64>>,
    /// Per fault kind and subject, the worst lag of a write made during the fault or its
    /// grace to reach the fast handler, ms.
    worst_lag_after_fault_ms: BTreeMap<String, f64>,
    /// Per subject and resource, the most the slow handler (10 ms an event) fell behind
    /// the fast one on the same event, ms: its buffer's longest backlog, in time.
    slow_behind_fast_ms: BTreeMap<String, f64>,
    /// Per stream, updates that re-delivered an object at the version already delivered
    /// (what a relist hands every handler for each unchanged object).
    redelivered: BTreeMap<String, usize>,
    memory: Vec<MemorySample>,
    findings: Findings,
}

/// The leader-elected subject's part of the report.
#[derive(Debug, Serialize)]
struct LeaderReport {
    replicas: usize,
    lease_seconds: u64,
    churn: sharded::Churn,
    parent_writes: parents::ParentWrites,
    checked: leader_check::LeaderSummary,
}

async fn run(args: &Args, seed: u64, uncaused: Uncaused) -> anyhow::Result<Report> {
    let client_go_binary = if args.no_client_go {
        None
    } else {
        Some(client_go::build()?)
    };
    let sharded_list_and_watch = StdRng::seed_from_u64(seed ^ 0x6a7e).random_bool(0.5);
    info!(sharded_list_and_watch, "starting the control plane");
    let mut builder = TestEnv::builder();
    if sharded_list_and_watch {
        builder = builder.apiserver_arg("--feature-gates=ShardedListAndWatch=true");
    }
    let env = Arc::new(builder.start().await?);
    let tasks_before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let admin = env.client().await?;
    let namespaces = prepare(&admin, args.namespaces).await?;
    let writer = Writer::new(
        &admin,
        Load {
            namespaces,
            pods: args.pods,
            widgets: args.widgets,
            rate: args.rate,
            workers: 8,
        },
    );
    info!(
        pods = args.pods,
        widgets = args.widgets,
        "creating the objects"
    );
    writer.populate(16).await?;

    let mut rng = StdRng::seed_from_u64(seed);
    let tuning = Tuning {
        watch_timeout: rng
            .random_bool(0.5)
            .then(|| Duration::from_secs(rng.random_range(10..30))),
        slow_handler_delay: Duration::from_millis(10),
    };
    info!(?tuning, "starting the subjects");
    // One proxy per subject: ours (with the warm-restarted informer), client-go's, the
    // sharded replicas', the leader-elected replicas'.
    let proxies = Arc::new(vec![
        FaultProxy::for_apiserver(&env).await?,
        FaultProxy::for_apiserver(&env).await?,
        FaultProxy::for_apiserver(&env).await?,
        FaultProxy::for_apiserver(&env).await?,
    ]);
    let subject_client = kube_informer::client(env.config_via(&proxies[0]).await?)?;
    let mut subject = subject::Subject::start(subject_client, tuning)?;
    let scratch = env.dir().join("soak");
    std::fs::create_dir_all(&scratch)?;
    let warm_subject = if args.no_warm_restart {
        None
    } else {
        let client = kube_informer::client(env.config_via(&proxies[0]).await?)?;
        Some(warm::WarmSubject::start(
            client,
            scratch.join("pods.snapshot"),
        ))
    };
    let mut client_go = match &client_go_binary {
        Some(binary) => {
            let kubeconfig = scratch.join("client-go.kubeconfig");
            env.kubeconfig_via(&proxies[1], &kubeconfig)?;
            Some(client_go::Subject::spawn(
                binary,
                &kubeconfig,
                scratch.join("client-go-events.jsonl"),
                &scratch.join("client-go.log"),
                tuning,
            )?)
        }
        None => None,
    };
    // Beside the records when they are kept: the replicas' logs explain their findings.
    let replica_dir = args.records.as_ref().map_or_else(
        || scratch.join("sharded"),
        |records| records.join("sharded"),
    );
    std::fs::create_dir_all(&replica_dir)?;
    let replica_kubeconfig = scratch.join("sharded.kubeconfig");
    env.kubeconfig_via(&proxies[2], &replica_kubeconfig)?;
    let replicas = Arc::new(tokio::sync::Mutex::new(sharded::ReplicaSet::start(
        sharded::command(Duration::from_millis(args.replica_lease_ms)),
        args.replicas,
        &replica_kubeconfig,
        &replica_dir,
    )?));
    let leader = if args.leader_replicas > 0 {
        let dir = replica_dir.with_file_name("leader");
        std::fs::create_dir_all(&dir)?;
        let kubeconfig = scratch.join("leader.kubeconfig");
        env.kubeconfig_via(&proxies[3], &kubeconfig)?;
        let settings = parents::LeaderSettings {
            replicas: args.leader_replicas,
            lease_seconds: args.leader_lease_seconds,
            parents: args.parents,
        };
        info!(?settings, "starting the leader-elected subject");
        Some(parents::LeaderRun::start(&admin, settings, &kubeconfig, &dir).await?)
    } else {
        None
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(subject.has_synced()
        && client_go.as_ref().is_none_or(|c| c.said().synced)
        && warm_subject
            .as_ref()
            .is_none_or(warm::WarmSubject::has_synced))
    {
        if Instant::now() > deadline {
            bail!("the subjects did not sync within 120 s");
        }
        if client_go.as_ref().is_some_and(|c| c.said().ended) {
            bail!(
                "client-go's subject exited; see {}",
                scratch.join("client-go.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let synced_ns = unix_nanos();
    info!("both subjects synced; the load and the faults start");

    let span = Duration::from_secs(args.seconds);
    let kinds = if args.faults.is_empty() {
        vec![
            FaultKind::Reset,
            FaultKind::Stall,
            FaultKind::Latency,
            FaultKind::Bandwidth,
            FaultKind::KillApiserver,
            FaultKind::Compact,
            FaultKind::CompactAndKill,
            FaultKind::RestartEtcd,
        ]
    } else {
        args.faults.clone()
    };
    let schedule = faults::plan(
        seed,
        span,
        Duration::from_secs(args.fault_every),
        Duration::from_secs(args.calm_seconds),
        Duration::from_secs(args.storm_seconds),
        &kinds,
    );
    info!(faults = schedule.len(), "fault schedule drawn");
    let started = tokio::time::Instant::now();
    let stop_load = CancellationToken::new();
    let fault_log = faults::Log::default();
    let load = tokio::spawn(writer.clone().run(seed, stop_load.clone()));
    let injector = tokio::spawn(faults::inject(
        env.clone(),
        proxies.clone(),
        schedule,
        started,
        fault_log.clone(),
        stop_load.clone(),
    ));
    let stop_relists = CancellationToken::new();
    let relists_recorded = subject.record_relists(stop_relists.clone());
    let calendar = faults::Calendar {
        start: started,
        span,
        calm: Duration::from_secs(args.calm_seconds),
        storm: Duration::from_secs(args.storm_seconds),
    };
    let churn = (args.replicas > 0).then(|| {
        tokio::spawn(sharded::churn(
            replicas.clone(),
            seed ^ 0x5a4d_c4a1,
            calendar,
            true,
            sharded::in_turn,
            stop_load.clone(),
        ))
    });
    // The leader is the replica killed each storm: its successor takes over once the
    // Lease expires.
    let leader_tasks = leader.as_ref().map(|leader| {
        let leading = leader.leading_replica();
        let churn = tokio::spawn(sharded::churn(
            leader.replicas.clone(),
            seed ^ 0x1ead_e4c1,
            calendar,
            false,
            move |n, running: &[String]| {
                leading()
                    .filter(|replica| running.contains(replica))
                    .or_else(|| sharded::in_turn(n, running))
            },
            stop_load.clone(),
        ));
        let writes = tokio::spawn(leader.writer.clone().run(
            seed,
            args.parent_rate,
            args.parents,
            stop_load.clone(),
        ));
        (churn, writes)
    });
    let warm_restarts = warm_subject.map(|subject| {
        tokio::spawn(warm::restarts(
            subject,
            admin.clone(),
            seed,
            calendar,
            stop_load.clone(),
        ))
    });
    let mut memory = Vec::new();
    let mut late_added = None;
    let lists_at_start = subject.lists();
    let mut progress = tokio::time::interval(Duration::from_secs(1));
    let recorded = writer.recorded();
    while started.elapsed() < span {
        progress.tick().await;
        let elapsed = started.elapsed();
        memory.push(sample(elapsed, client_go.as_ref()));
        // The late handlers join during a relist: the first one after half the run, or
        // at three quarters of it if none comes.
        if late_added.is_none()
            && elapsed >= span / 2
            && (subject.lists() > lists_at_start || elapsed >= span * 3 / 4)
        {
            let during_relist = subject.lists() > lists_at_start;
            subject.add_late_handlers()?;
            if let Some(client_go) = &mut client_go {
                client_go.add_late_handlers().await?;
            }
            info!(during_relist, "late handlers added");
            late_added = Some(during_relist);
        }
        if elapsed.as_secs().is_multiple_of(10) {
            info!(
                elapsed_s = elapsed.as_secs(),
                writes = recorded.writes(),
                faults = fault_log.snapshot().len(),
                "soaking"
            );
        }
    }
    stop_load.cancel();
    load.await?;
    injector.await?;
    if let Some(churn) = churn {
        churn.await??;
    }
    if let Some((churn, writes)) = leader_tasks {
        churn.await??;
        writes.await?;
    }
    let warm_subject = match warm_restarts {
        Some(task) => Some(task.await?),
        None => None,
    };
    if !env.apiserver_running() {
        env.start_apiserver().await?;
    }
    let quiet_ns = unix_nanos();
    info!(
        writes = recorded.writes(),
        "load and faults stopped; waiting for every subject to settle"
    );

    let history = recorded.history();
    let settle = Duration::from_secs(args.settle_seconds);
    let settle_deadline = Instant::now() + settle;
    let mut settled_s = settle_all(
        &history,
        &subject,
        client_go.as_ref(),
        &replicas,
        args.replicas > 0,
        settle,
        quiet_ns,
    )
    .await?;
    let mut leader_unsettled = Vec::new();
    if leader.is_some() {
        let (took, unsettled) = settle_leader(&admin, settle_deadline, quiet_ns).await;
        settled_s.insert("leader".into(), took);
        leader_unsettled = unsettled;
    }
    let mut replicas = Arc::try_unwrap(replicas)
        .map_err(|_| anyhow::anyhow!("the replicas are still shared"))?
        .into_inner();
    let churn = replicas.stop().await;
    let replica_records = replicas.records()?;
    let leader = match leader {
        Some(leader) => Some(leader.stop(&admin).await?),
        None => None,
    };
    let warm_checks = match warm_subject {
        Some((warm_subject, mut checks)) => {
            checks.push(warm_subject.check_now("end", &admin).await);
            warm_subject.stop().await;
            Some(checks)
        }
        None => None,
    };

    stop_relists.cancel();
    let mut relists = check::Relists::new();
    relists.insert(subject::NAME.to_owned(), relists_recorded.await?);
    let mut events = subject.events.snapshot();
    let reconciles_recorded = subject.reconciles.clone();
    let mut process = Vec::new();
    if let Err(error) = subject.stop().await {
        process.push(format!(
            "kube-informer's subject did not stop cleanly: {error:#}"
        ));
    }
    if let Some(client_go) = client_go.take() {
        let said_before = client_go.said();
        let go_events = client_go.events()?;
        // client-go reports few of its relists, but every relist re-delivers each
        // unchanged object as an update to the same version: those mark them.
        let mut go_relists: Vec<i64> = go_events
            .iter()
            .filter(|e| e.resync)
            .map(|e| e.at_ns)
            .chain(said_before.watch_errors.iter().copied())
            .collect();
        go_relists.sort_unstable();
        relists.insert(client_go::NAME.to_owned(), go_relists);
        events.extend(go_events);
        let clean = client_go.stop(Duration::from_secs(10)).await?;
        if !clean {
            process.push("client-go's subject did not exit cleanly".to_owned());
        }
        if late_added.is_some() && !said_before.late_added {
            process.push("client-go's subject did not confirm its late handlers".to_owned());
        }
    }
    drop(writer);
    drop(admin);
    let left = tasks_left(tasks_before).await;
    if left > 0 {
        process.push(format!(
            "{left} tasks still running after the subjects stopped"
        ));
    }

    let faults = fault_log.snapshot();
    let grace = Duration::from_secs(args.grace_seconds).as_nanos() as i64;
    let lag_bound = Duration::from_millis(args.lag_bound_ms).as_nanos() as i64;
    let mut calm = Calm {
        unsettled: vec![(0, synced_ns + grace)],
    };
    for fault in &faults {
        calm.unsettled
            .push((fault.applied_ns - lag_bound, fault.lifted_ns + grace));
    }
    let recreated_at_once = check::recreated_at_once(&replica_records.iter().collect::<Vec<_>>());
    let mut reconciles = reconciles_recorded.snapshot();
    let mut replica_reconciles = BTreeMap::new();
    for record in &replica_records {
        if let Some(replica) = &record.replica {
            *replica_reconciles.entry(replica.clone()).or_default() += 1;
        }
    }
    reconciles.extend(replica_records);
    process.extend(churn.unexpected.iter().cloned());
    if let Some(dir) = &args.records {
        save_records(dir, &history, &events, &reconciles)?;
    }
    let mut findings = check::check(
        &history,
        &events,
        &reconciles,
        &relists,
        &calm,
        Bounds {
            calm_lag_ns: lag_bound,
        },
        &churn.kills(),
    );
    if args.replicas > 0 && replica_reconciles.is_empty() {
        process.push("the sharded replicas recorded no reconcile".to_owned());
    }
    if let (Some(dir), Some(outcome)) = (&args.records, &leader) {
        outcome.save(dir)?;
    }
    let leader = leader.map(|outcome| {
        let (violations, checked) = leader_check::check(&leader_check::Inputs {
            records: &outcome.records,
            observed: &outcome.observed,
            calls: &outcome.calls,
            end: &outcome.end,
            deleted_holding: &outcome.deleted_holding,
        });
        findings.violations.extend(violations);
        for unsettled in leader_unsettled.iter().take(20) {
            findings.violations.push(Violation {
                rule: Rule::LevelTriggered,
                source: leader::LEASE.to_owned(),
                key: String::new(),
                detail: format!(
                    "not settled {} s after the load: {unsettled}",
                    args.settle_seconds
                ),
            });
        }
        process.extend(outcome.churn.unexpected.iter().cloned());
        LeaderReport {
            replicas: args.leader_replicas,
            lease_seconds: args.leader_lease_seconds,
            churn: outcome.churn,
            parent_writes: outcome.writes,
            checked,
        }
    });
    let had_storm = calendar.storm(0).is_some();
    let warm_restarts = warm_checks.map(|checks| {
        let (violations, summary) = warm::check(checks, had_storm);
        findings.violations.extend(violations);
        summary
    });
    for panic in watchdog::panics() {
        process.push(format!("panic: {panic}"));
    }
    for line in uncaused.snapshot() {
        process.push(format!("an error logged without its cause: {line}"));
    }
    for fault in faults.iter().filter(|f| f.error.is_some()) {
        process.push(format!(
            "the fault {:?} was not injected: {}",
            fault.kind,
            fault.error.as_deref().unwrap_or_default()
        ));
    }
    for detail in process {
        findings.violations.push(Violation {
            rule: Rule::Process,
            source: "process".into(),
            key: String::new(),
            detail,
        });
    }
    Ok(Report {
        seed,
        seconds: args.seconds,
        tuning: format!("{tuning:?}"),
        sharded_list_and_watch,
        churn,
        replica_reconciles,
        recreated_at_once,
        leader,
        warm_restarts,
        writes: recorded.writes(),
        unanswered_writes: recorded.unanswered(),
        worst_lag_after_fault_ms: worst_lag_after_faults(&history, &events, &faults, grace),
        slow_behind_fast_ms: slow_behind_fast(&events),
        redelivered: redelivered(&events),
        faults,
        late_handlers_added_during_relist: late_added.unwrap_or(false),
        settled_s,
        memory,
        findings,
    })
}

fn save_records(
    dir: &std::path::Path,
    history: &ServerHistory,
    events: &[EventRecord],
    reconciles: &[record::ReconcileRecord],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let states: Vec<_> = history.states.iter().collect();
    std::fs::write(dir.join("history.json"), serde_json::to_vec(&states)?)?;
    std::fs::write(dir.join("events.json"), serde_json::to_vec(events)?)?;
    std::fs::write(dir.join("reconciles.json"), serde_json::to_vec(reconciles)?)?;
    Ok(())
}

/// Namespaces (the writer's, the shard ring's, the leader-elected subject's), the custom
/// resources, ready to serve, and the leader-elected subject's fences.
async fn prepare(client: &Client, count: usize) -> anyhow::Result<Vec<String>> {
    let mut namespaces = Vec::new();
    let names = (0..count).map(|i| format!("soak-{i}"));
    for name in names.chain([
        sharded::RING_NAMESPACE.to_owned(),
        leader::NAMESPACE.to_owned(),
    ]) {
        let namespace: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name }
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await?;
        if name != sharded::RING_NAMESPACE && name != leader::NAMESPACE {
            namespaces.push(name);
        }
    }
    for (crd, resource) in [
        (writer::widget_crd(), writer::widget_resource()),
        (leader::parent_crd(), leader::parent_resource()),
    ] {
        let crd: CustomResourceDefinition = serde_json::from_value(crd)?;
        Api::<CustomResourceDefinition>::all(client.clone())
            .create(&PostParams::default(), &crd)
            .await?;
        let served = Api::<DynamicObject>::all_with(client.clone(), &resource);
        let deadline = Instant::now() + Duration::from_secs(60);
        while served.list(&ListParams::default().limit(1)).await.is_err() {
            if Instant::now() > deadline {
                bail!(
                    "the {}' CustomResourceDefinition was not served within 60 s",
                    resource.plural
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    parents::create_fences(client).await?;
    Ok(namespaces)
}

fn sample(elapsed: Duration, client_go: Option<&client_go::Subject>) -> MemorySample {
    MemorySample {
        at_s: elapsed.as_secs_f64(),
        driver_kib: watchdog::rss_kib("self"),
        client_go_kib: client_go.map_or(0, |c| watchdog::rss_kib(&c.pid().to_string())),
    }
}

/// Waits until every stream and controller holds the final state, or `bound` passes;
/// returns the seconds each stream took (`None`: not within the bound).
async fn settle_all(
    history: &ServerHistory,
    subject: &subject::Subject,
    client_go: Option<&client_go::Subject>,
    replicas: &tokio::sync::Mutex<sharded::ReplicaSet>,
    expect_sharded: bool,
    bound: Duration,
    quiet_ns: i64,
) -> anyhow::Result<BTreeMap<String, Option<f64>>> {
    let deadline = Instant::now() + bound;
    let mut settled: BTreeMap<String, Option<f64>> = BTreeMap::new();
    loop {
        let mut events = subject.events.snapshot();
        if let Some(client_go) = client_go {
            events.extend(client_go.events()?);
        }
        let streams = check::streams(&events);
        let now_s = (unix_nanos() - quiet_ns) as f64 / 1e9;
        for (stream, events) in &streams {
            let entry = settled.entry(stream.to_string()).or_insert(None);
            if entry.is_none() && check::converged(history, stream.resource, events) {
                *entry = Some(now_s);
            }
        }
        let (sharded, kills) = {
            let mut replicas = replicas.lock().await;
            (replicas.records()?, replicas.kills())
        };
        let reconciled = controllers_settled(history, subject, &sharded, &kills, expect_sharded);
        let all = streams.len() == settled.len() && settled.values().all(Option::is_some);
        if (all && reconciled) || Instant::now() > deadline {
            settled.insert("controllers".into(), reconciled.then_some(now_s));
            return Ok(settled);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn controllers_settled(
    history: &ServerHistory,
    subject: &subject::Subject,
    sharded: &[record::ReconcileRecord],
    kills: &check::Kills,
    expect_sharded: bool,
) -> bool {
    let reconciles = subject.reconciles.snapshot();
    let replicas: Vec<_> = sharded.iter().collect();
    subject::CONTROLLERS.iter().all(|controller| {
        let records: Vec<_> = reconciles
            .iter()
            .filter(|r| r.controller == *controller)
            .collect();
        check::unreconciled(history, &records, &check::Kills::new()).is_empty()
    }) && (!expect_sharded || check::unreconciled(history, &replicas, kills).is_empty())
}

/// Waits until the leader-elected subject's world matches the parents (each live one holds
/// the finalizer and has a child, none is left being deleted), or `deadline` passes;
/// returns the seconds since `quiet_ns` it took, and what was left unsettled.
async fn settle_leader(
    admin: &Client,
    deadline: Instant,
    quiet_ns: i64,
) -> (Option<f64>, Vec<String>) {
    loop {
        let unsettled = match parents::EndState::read(admin).await {
            Ok(end) => end.unsettled(),
            Err(error) => vec![format!("the parents could not be listed: {error}")],
        };
        if unsettled.is_empty() {
            return (Some((unix_nanos() - quiet_ns) as f64 / 1e9), unsettled);
        }
        if Instant::now() > deadline {
            return (None, unsettled);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Tasks of this runtime still alive beyond those running before the subjects started,
/// after giving them a few seconds to end.
async fn tasks_left(before: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        if alive <= before || Instant::now() > deadline {
            return alive.saturating_sub(before);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The worst delivery lag to each subject's fast handlers of a write made while a fault
/// was active or within its grace, per fault kind.
fn worst_lag_after_faults(
    history: &ServerHistory,
    events: &[EventRecord],
    faults: &[Injected],
    grace_ns: i64,
) -> BTreeMap<String, f64> {
    let mut first_seen: BTreeMap<(&str, Resource, &str, u64), i64> = BTreeMap::new();
    for event in events.iter().filter(|e| e.handler == "fast") {
        if let Some(marker) = event.marker() {
            first_seen
                .entry((&event.subject, event.resource, &event.key, marker))
                .or_insert(event.at_ns);
        }
    }
    let subjects: Vec<&str> = {
        let mut s: Vec<&str> = events.iter().map(|e| e.subject.as_str()).collect();
        s.sort_unstable();
        s.dedup();
        s
    };
    let mut worst: BTreeMap<String, f64> = BTreeMap::new();
    for fault in faults {
        for (id, states) in &history.states {
            for state in states.iter().filter(|s| s.answered) {
                let Some(marker) = state.marker else { continue };
                if state.known_at_ns < fault.applied_ns
                    || state.known_at_ns > fault.lifted_ns + grace_ns
                {
                    continue;
                }
                for subject in &subjects {
                    if let Some(&seen) =
                        first_seen.get(&(*subject, id.resource, id.key.as_str(), marker))
                    {
                        let lag = (seen - state.known_at_ns).max(0) as f64 / 1e6;
                        let entry = worst
                            .entry(format!("{:?} {subject}", fault.kind))
                            .or_insert(0.0);
                        *entry = entry.max(lag);
                    }
                }
            }
        }
    }
    worst
}

fn slow_behind_fast(events: &[EventRecord]) -> BTreeMap<String, f64> {
    // The n-th delivery of an event to the slow handler against the n-th to the fast
    // one: a relist may deliver one version several times.
    type Seen<'a> = (
        &'a str,
        Resource,
        &'a str,
        &'a str,
        &'a str,
        record::EventType,
    );
    let mut fast: BTreeMap<Seen<'_>, Vec<i64>> = BTreeMap::new();
    for e in events.iter().filter(|e| e.handler == "fast") {
        fast.entry((&e.subject, e.resource, &e.key, &e.rv, &e.marker, e.kind))
            .or_default()
            .push(e.at_ns);
    }
    let mut taken: BTreeMap<Seen<'_>, usize> = BTreeMap::new();
    let mut behind: BTreeMap<String, f64> = BTreeMap::new();
    for e in events.iter().filter(|e| e.handler == "slow") {
        let seen = (
            e.subject.as_str(),
            e.resource,
            e.key.as_str(),
            e.rv.as_str(),
            e.marker.as_str(),
            e.kind,
        );
        let nth = taken.entry(seen).or_default();
        if let Some(&at) = fast.get(&seen).and_then(|times| times.get(*nth)) {
            let entry = behind
                .entry(format!("{} {}", e.subject, e.resource.name()))
                .or_insert(0.0);
            *entry = entry.max((e.at_ns - at) as f64 / 1e6);
        }
        *nth += 1;
    }
    behind
}

fn redelivered(events: &[EventRecord]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for e in events.iter().filter(|e| e.resync) {
        *counts.entry(e.stream().to_string()).or_default() += 1;
    }
    counts
}

fn print_leader(leader: &LeaderReport) {
    let checked = &leader.checked;
    let writes = &leader.parent_writes;
    println!(
        "leader-elected controller ({} replicas, {} s Lease): {} killed and restarted; {} terms of the Lease ({} missed by the observer), {} led, {} lost; parents: {} created, {} annotated, {} deleted, {} writes failed",
        leader.replicas,
        leader.lease_seconds,
        leader.churn.killed.len(),
        checked.terms,
        checked.terms_missed,
        checked.terms_led,
        checked.terms_lost,
        writes.created,
        writes.annotated,
        writes.deleted,
        writes.failed
    );
    println!(
        "  fenced: {} reconciles; {} starts, ends, creates and cleanup calls held to their terms ({} unjudged)",
        checked.reconciles, checked.actions_checked, checked.actions_unjudged
    );
    println!(
        "  single child: {} children of {} parents checked; {} parents with two children ({} that no read could have prevented)",
        checked.children,
        checked.parents_with_children,
        checked.duplicates,
        checked.duplicates_unpromised
    );
    println!(
        "  cleanup once: {} deleted parents needed their cleanup; {} calls counted; {} cleaned up once, {} again by the same term (a removal failed), {} again by a later term",
        checked.cleanups_required,
        checked.cleanup_calls,
        checked.cleaned_once,
        checked.cleaned_again_same_term,
        checked.cleaned_again_later_term
    );
}

fn print_report(report: &Report) {
    println!(
        "{} s of load: {} writes ({} settled by reading back), {:?}",
        report.seconds, report.writes, report.unanswered_writes, report.tuning
    );
    println!(
        "sharded replicas (ShardedListAndWatch {}): {} killed and restarted, {} joined; reconciles per replica {:?}; a deleted and a new object of one name reconciled at once: {}",
        if report.sharded_list_and_watch {
            "on"
        } else {
            "off"
        },
        report.churn.killed.len(),
        report.churn.joined.len(),
        report.replica_reconciles,
        report.recreated_at_once
    );
    if let Some(leader) = &report.leader {
        print_leader(leader);
    }
    if let Some(warm) = &report.warm_restarts {
        let end = warm
            .checks
            .iter()
            .find(|c| c.when == "end")
            .map_or_else(|| "-".to_owned(), |c| format!("{:?}", c.outcome));
        println!(
            "warm restarts: {} restarts, {} compared equal to the server's list at their version ({} resumed from the snapshot, {} listed again, {} unverifiable); at the end: {end}",
            warm.restarts, warm.verified, warm.resumed, warm.relisted, warm.unverifiable
        );
    }
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for fault in &report.faults {
        *by_kind.entry(format!("{:?}", fault.kind)).or_default() += 1;
    }
    println!("faults injected: {by_kind:?}");
    println!(
        "late handlers added during a relist: {}",
        report.late_handlers_added_during_relist
    );
    println!(
        "stream                                   events   calm lag p50/p99/max ms   settled s"
    );
    for (stream, events) in &report.findings.events {
        let lag = report
            .findings
            .calm_lag_ms
            .get(stream)
            .copied()
            .unwrap_or_else(|| LagSummary::of(Vec::new()));
        let settled = report
            .settled_s
            .get(stream)
            .copied()
            .flatten()
            .map_or_else(|| "-".to_owned(), |s| format!("{s:.1}"));
        println!(
            "{stream:<40} {events:>7}   {:>6.0}/{:>6.0}/{:>6.0} ({:>5})   {settled}",
            lag.p50_ms, lag.p99_ms, lag.max_ms, lag.count
        );
    }
    for (controller, count) in &report.findings.reconciles {
        let unseen = report
            .findings
            .unseen_deletions
            .get(controller)
            .copied()
            .unwrap_or(0);
        println!(
            "controller {controller}: {count} reconciles; {unseen} deletions no live replica could see"
        );
    }
    println!(
        "worst lag of a write made during a fault (ms): {:?}",
        report.worst_lag_after_fault_ms
    );
    println!(
        "slow handlers' worst delay behind the fast ones (ms): {:?}",
        report.slow_behind_fast_ms
    );
    println!(
        "updates re-delivering a version already delivered: {:?}",
        report.redelivered
    );
    if let (Some(first), Some(peak)) = (
        report.memory.first(),
        report.memory.iter().max_by_key(|s| s.driver_kib),
    ) {
        let go_peak = report
            .memory
            .iter()
            .map(|s| s.client_go_kib)
            .max()
            .unwrap_or(0);
        println!(
            "memory: driver (kube-informer's subject, writer, records) {} → peak {} MiB; client-go's subject peak {} MiB",
            first.driver_kib / 1024,
            peak.driver_kib / 1024,
            go_peak / 1024
        );
    }
    for violation in report.findings.violations.iter().take(30) {
        println!(
            "VIOLATION {:?} {} {}: {}",
            violation.rule, violation.source, violation.key, violation.detail
        );
    }
}
