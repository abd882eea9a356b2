//! `informer-bench`: kube-informer's shared informer against client-go's
//! `SharedIndexInformer` and kube-runtime's `watcher` + `reflector`, each in its own
//! process, on one fresh local control plane.
//!
//! For each N it creates N of the tutorial's nginx Pods by server-side apply (so
//! managedFields are populated), then runs every subject `--runs` times, alternating the
//! order, and measures: time from process start to synced, RSS when synced, peak and
//! steady RSS after sync (from `/proc/<pid>/status`), and, for M label updates sent as
//! fast as the API server takes them, the time until the subject saw all of them and the
//! per-event latency from the update's response to the handler; then the same latency for
//! updates sent at a steady pace the API server keeps up with, where it is the watch
//! pipeline's (server and subject) rather than the server's queue. After the updates each
//! subject times reads of its cache (gets by key, full lists, by-index reads), and the
//! driver records kube-apiserver's peak RSS during each subject's sync. Then the reconcile
//! case: the driver changes a label of Pods drawn at random, and the subject reconciles each
//! change as a ReplicaSet controller reads its cache (the Pod by key, its group by label
//! selector), timing those reads. For each N it also
//! times the floor (the same list read bare by the default subject's client, unpaged and
//! streaming, and by kube-client's default for reference) and, as a scenario of its own,
//! each subject's peak RSS during a relist forced by a 410 (through Toxiproxy, etcd
//! compacted and kube-apiserver restarted while it is cut off). Results go to a JSON file
//! and to `BENCHMARKS.md`.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use benches::{
    CpuUse, GROUP_LABEL, RECONCILE_LABEL, RELIST_LABEL, ReadsLine, ReconcileLine, RelistLine,
    SyncedLine, UPDATE_LABEL, UpdatesLine, apiserver_gc, client_go_version, command_output,
    cpu_ms_of, cpu_ns_of, cpu_use_of, lock_version, machine, median, memory_of, percentile,
    pod_name, reset_peak, unix_nanos, workqueue_report,
};
use clap::{ArgAction, Parser};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube_client::{
    Api,
    api::{Patch, PatchParams},
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Benchmarks kube-informer, client-go and kube-runtime informers, each in its own
/// process, against a fresh local control plane.
#[derive(Debug, Parser)]
#[command(name = "informer-bench")]
struct Args {
    /// Pod counts to benchmark, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pods: Vec<usize>,
    /// Runs of each subject per Pod count (subjects alternate).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Runs of each subject for Pod counts of at least `--large-from` (`--runs` if not
    /// given), so that a run up to 100,000 Pods stays affordable.
    #[arg(long)]
    runs_large: Option<usize>,
    /// The smallest Pod count `--runs-large` applies to.
    #[arg(long, default_value_t = 100_000)]
    large_from: usize,
    /// Gets by random key each subject times after the updates (0 skips the reads).
    #[arg(long, default_value_t = 2000)]
    reads: usize,
    /// Label updates of the reconcile case, after the reads (0 skips the case). Once the CPUs
    /// are idle the driver sets the `bench-reconcile` label of Pods drawn at random across
    /// all groups (the same Pods in the same order for every subject), `--concurrency` in
    /// flight; the subject queues the key of each Pod whose label changed, and one worker
    /// reconciles each key as a ReplicaSet controller reads its cache: the Pod by key, then
    /// its group of 100 by label selector. Reported: reconciles per second of those reads'
    /// time (the worker's read capacity, whatever the API server's pace), their p50/p99,
    /// and the subject's RSS right after and once the CPUs are idle plus `--settle-ms`.
    #[arg(long, default_value_t = 2000)]
    reconciles: usize,
    /// The subjects of `--subjects` that run the reconcile case, comma-separated (the
    /// default configuration beside client-go and kube-runtime; a `--baseline` executable
    /// built before the case existed does not know it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kube-informer,kube-runtime,client-go"
    )]
    reconcile_subjects: Vec<String>,
    /// Runs of the relist scenario per subject per Pod count: the subject, through its own
    /// Toxiproxy, is cut off while a Pod changes, etcd is compacted and kube-apiserver
    /// restarted, so its watch gets 410 Gone and it relists; its peak RSS during the
    /// relist is recorded. 0 skips the scenario.
    #[arg(long, default_value_t = 1)]
    relist_runs: usize,
    /// Bare reads of the list per kind (unpaged, streaming) for the floor at each N, by the
    /// default subject's client, `kube_informer::client`, and the same by kube-client's
    /// default client (HTTP/1.1) for reference (0 skips the floor).
    #[arg(long, default_value_t = 5)]
    floor_runs: usize,
    /// Concurrent server-side applies when creating the Pods.
    #[arg(long, default_value_t = 128)]
    create_concurrency: usize,
    /// How long to wait for any one line of a subject (its sync, its updates, its reads,
    /// its reconciles, its relist), s.
    #[arg(long, default_value_t = 900)]
    timeout_s: u64,
    /// Label updates per run for the update-latency scenario (at most N; 0 skips it).
    #[arg(long, default_value_t = 1000)]
    updates: usize,
    /// Label updates per run sent at `--paced-rate` after the burst (at most N; 0 skips).
    #[arg(long, default_value_t = 500)]
    paced_updates: usize,
    /// Updates per second of the paced scenario.
    #[arg(long, default_value_t = 100)]
    paced_rate: u32,
    /// Subjects to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kube-informer,kube-informer-lazy,kube-informer-decoded,kube-informer-json-codec,kube-runtime,client-go"
    )]
    subjects: Vec<String>,
    /// kube-apiserver's `--watch-cache`.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    watch_cache: bool,
    /// Whether kube-apiserver collects its garbage just before each timed phase (a
    /// subject's sync, its burst of updates, its paced updates, the reconcile case's
    /// updates, each floor read), so that
    /// no subject meets the server's collection by chance (see `benches::apiserver_gc`).
    /// The collections during each phase are counted either way.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    collect_apiserver_garbage: bool,
    /// How long after sync, and after the reconcile case once the CPUs are idle, to wait
    /// before reading steady RSS, ms.
    #[arg(long, default_value_t = 2000)]
    settle_ms: u64,
    /// The markdown report (its part after `<!-- notes -->` is kept).
    #[arg(long, default_value = "BENCHMARKS.md")]
    out: PathBuf,
    /// The raw results.
    #[arg(long, default_value = "target/informer-bench/results.json")]
    json: PathBuf,
    /// The chart (PNG): median sync time and steady RSS against N.
    #[arg(long, default_value = "benches/informer-bench.png")]
    chart: PathBuf,
    /// `subject-kube-informer` built from another commit, run as the subject
    /// `kube-informer-baseline` (name it in `--subjects`): the figures before and after a
    /// change, side by side in one run.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// `subject-kube-informer` built with the benches' `opentelemetry` feature (so with the
    /// library's spans), in a target directory of its own: the subjects
    /// `kube-informer-controller-otel-off` and `kube-informer-controller-otel-on` (name
    /// them in `--subjects`), beside `kube-informer-controller` built without it, give
    /// the cost of tracing. See `docs/benchmarks.md`.
    #[arg(long)]
    traced: Option<PathBuf>,
    /// A command to run a subject under, `SUBJECT=COMMAND`, for profiling; `{pods}` and
    /// `{run}` in it are replaced. For example
    /// `--wrap 'kube-informer=perf record -g -o /tmp/kube-informer-{pods}-{run}.perf --'`.
    /// Its figures then carry the wrapper's cost: do not publish them.
    #[arg(long, value_parser = parse_wrap)]
    wrap: Vec<(String, String)>,
    /// Write the report and chart from an earlier run's JSON instead of measuring.
    #[arg(long)]
    from_json: Option<PathBuf>,
    /// Concurrent requests of the burst of updates.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Runs of each workqueue subject, kube-informer's and client-go's (they alternate);
    /// `--runs` if not given, 0 skips the workqueue comparison.
    #[arg(long)]
    workqueue_runs: Option<usize>,
    /// Minimum time per workqueue case per run, ms.
    #[arg(long, default_value_t = 1000)]
    workqueue_ms: u64,
    /// Run only the workqueue comparison (no control plane), keeping the informer results
    /// already in `--json` for the report.
    #[arg(long)]
    workqueue_only: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct UpdateResult {
    updates: usize,
    /// From the first update request to the last one seen by the handler.
    all_seen_ms: f64,
    /// From the first to the last update response (the driver's pace).
    driver_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// The reconcile case of one run (`--reconciles`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ReconcileResult {
    /// Label updates sent, M.
    updates: usize,
    /// Reconciles the subject ran: M, or fewer where its queue collapsed two changes of one
    /// Pod that waited together (client-go's and kube-informer's workqueues do).
    reconciles: usize,
    /// Reconciles per second of their reads' own time (get + list, summed): the worker's
    /// read capacity, independent of the API server's pace.
    per_second: f64,
    /// M per second from the subject's first event to the end of its last reconcile.
    wall_per_second: f64,
    /// Median of one reconcile's reads, µs.
    read_p50_us: f64,
    /// 99th percentile of the same, µs.
    read_p99_us: f64,
    /// VmRSS once the CPUs were idle again after the last reconcile and `--settle-ms`
    /// more, KiB: the memory the reads leave behind.
    rss_kb: u64,
    /// VmRSS right after the last reconcile, KiB.
    rss_during_kb: u64,
    /// VmHWM from the case's start to the last reconcile, KiB.
    hwm_kb: u64,
    /// kube-apiserver's garbage collections from before the updates to the subject's
    /// line (the driver's own collection before them not counted).
    apiserver_gcs: u64,
    /// kube-informer's cache: reads of one object its working set served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    working_set_hits: Option<u64>,
    /// kube-informer's cache: reads of one object that decoded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    working_set_misses: Option<u64>,
}

/// Latencies of updates sent at a steady pace.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PacedResult {
    updates: usize,
    /// Updates per second sent.
    rate: u32,
    p50_ms: f64,
    p99_ms: f64,
    /// The largest latency.
    max_ms: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RunResult {
    pods: usize,
    subject: String,
    run: usize,
    /// Reported by the subject: start of `main` to synced.
    synced_ms: f64,
    /// Measured by the driver: spawn to the synced line.
    spawn_to_synced_ms: f64,
    rss_synced_kb: u64,
    /// VmRSS `settle_ms` after sync.
    steady_rss_kb: u64,
    /// VmHWM `settle_ms` after sync (the peak so far, sync included).
    peak_rss_kb: u64,
    update: Option<UpdateResult>,
    /// Absent from results saved before the paced scenario existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    paced: Option<PacedResult>,
    /// The subject's reads of its cache after the updates; absent before they existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reads: Option<ReadsLine>,
    /// The reconcile case, after the reads; absent for a subject that does not run it, and
    /// before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reconcile: Option<ReconcileResult>,
    /// kube-apiserver's VmRSS just before the subject started, KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    apiserver_rss_before_kb: Option<u64>,
    /// kube-apiserver's VmHWM when the subject had synced, reset just before it started,
    /// KiB: its peak while serving the subject's initial list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    apiserver_peak_kb: Option<u64>,
    /// CPU time the subject used from its start to its sync, ms; absent before it was
    /// measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    subject_cpu_ms: Option<f64>,
    /// CPU time kube-apiserver used from the subject's start to its sync, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    apiserver_cpu_ms: Option<f64>,
    /// How the subject used the CPUs from its start to its sync; absent before it was
    /// recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    subject_cpu_use: Option<CpuUse>,
    /// The same of kube-apiserver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    apiserver_cpu_use: Option<CpuUse>,
    /// CPU time the subject's threads used from just before the first update of the burst
    /// to its line saying it saw every update, paced ones included, ms, to the nanosecond
    /// (`benches::cpu_ns_of`); absent before it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    subject_cpu_updates_ms: Option<f64>,
    /// CPU time etcd used from the subject's start to its sync, ms: above its idle use when
    /// kube-apiserver served the list from etcd rather than its watch cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    etcd_cpu_ms: Option<f64>,
    /// kube-apiserver's garbage collections from the subject's start to its sync; absent
    /// before they were counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    apiserver_gcs_sync: Option<u64>,
    /// Its collections during the burst and the paced updates, up to the end of the
    /// subject's reads (which do not involve the server); the driver's own collection
    /// before the paced updates is not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    apiserver_gcs_updates: Option<u64>,
}

/// What the driver measured once per Pod count.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PodsResult {
    pods: usize,
    /// Time to create the Pods, s.
    create_s: f64,
    /// VmRSS of etcd and kube-apiserver once the Pods exist, KiB.
    etcd_rss_kb: u64,
    apiserver_rss_kb: u64,
    /// The machine's MemAvailable then, KiB.
    mem_available_kb: u64,
    /// The floor: each bare protobuf list (unpaged) of the namespace's Pods, ms.
    list_ms: Vec<f64>,
    /// Its body, bytes.
    list_bytes: u64,
    /// Each bare streaming list (`sendInitialEvents=true`) up to the bookmark that ends
    /// the initial events, ms.
    streaming_ms: Vec<f64>,
    /// Bytes read of it.
    streaming_bytes: u64,
    /// kube-apiserver's garbage collections during the floor's reads (each read on its
    /// own, after the driver's collection if any); absent before they were counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    floor_apiserver_gcs: Option<u64>,
    /// The client that made the reads above.
    #[serde(default)]
    floor_client: FloorClient,
    /// The same unpaged lists read by kube-client's default client (HTTP/1.1), ms; empty
    /// when the floor itself was read by that client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    http1_list_ms: Vec<f64>,
    /// The same streaming lists read by kube-client's default client, ms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    http1_streaming_ms: Vec<f64>,
}

/// The client a floor was read by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum FloorClient {
    /// kube-client's default, `Client::try_from(config)`: HTTP/1.1 (the floors of runs
    /// before the default subject used `kube_informer::client`).
    #[default]
    KubeDefault,
    /// `kube_informer::client`, HTTP/2: the default subject's.
    Informer,
}

impl FloorClient {
    fn describe(self) -> &'static str {
        match self {
            Self::KubeDefault => "kube-client's default client (HTTP/1.1)",
            Self::Informer => "the default subject's client (`kube_informer::client`, HTTP/2)",
        }
    }
}

/// One subject's relist after a 410.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RelistResult {
    pods: usize,
    subject: String,
    run: usize,
    /// Whether the change came by a list (false: the watch resumed, nothing relisted).
    relisted: bool,
    cached: usize,
    /// VmRSS just before the peak was reset (before the cut), KiB.
    rss_before_kb: u64,
    /// VmHWM once the relist was done and the CPUs idle again: the peak from the cut on.
    peak_kb: u64,
    /// VmRSS then.
    rss_after_kb: u64,
    /// From the proxy's restore to the subject's relist line, ms.
    relist_ms: f64,
}

/// What the JSON file holds.
#[derive(Debug, Serialize, Deserialize)]
struct Results {
    command: String,
    results: Vec<RunResult>,
    /// The workqueue comparison; absent from results saved before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workqueue: Option<workqueue_report::WorkqueueResults>,
    /// Per Pod count: creation, the control plane's memory, the floor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pods: Vec<PodsResult>,
    /// The relist scenario.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    relists: Vec<RelistResult>,
    /// `--collect-apiserver-garbage`; absent from results saved before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    apiserver_garbage_collected: Option<bool>,
}

const NOTES_MARKER: &str = "<!-- notes -->";

/// The configuration the report singles out: kube-informer with its defaults.
const DEFAULT_SUBJECT: &str = "kube-informer";

/// The other configurations whose targets the report computes, with what each is.
const TARGET_SUBJECTS: &[(&str, &str)] = &[
    (
        "kube-informer-lazy",
        "the defaults caching `LazyObject<Pod>`s (the metadata decoded on arrival, the rest \
         when read: its `get` decodes the whole Pod)",
    ),
    (
        "kube-informer-lazy-decoded",
        "`LazyObject<Pod>`s kept as shared objects (`decoded()`: each holds the server's \
         bytes and its decoded metadata; its `get` decodes the whole Pod)",
    ),
];

/// The number of Pods the targets are set at.
const TARGETS_N: usize = 10_000;

/// The subjects: name, binary, and the options it runs with beyond the common ones.
/// `kube-informer` runs the library's defaults (a streaming list into a compact cache of
/// the server's bytes); `kube-informer-decoded` keeps decoded objects (the default before
/// the compact one), `kube-informer-json-codec` compact JSON the store encodes (the compact
/// cache before it kept the server's bytes), `kube-informer-paged` syncs by paged lists
/// instead of a streaming list, `kube-informer-http1` reads through kube-client's default
/// client (HTTP/1.1) instead of `kube_informer::client`, `kube-informer-lazy` caches
/// `LazyObject<Pod>`s (metadata decoded on arrival; its full reads decode the whole Pod),
/// `kube-informer-lazy-decoded` keeps those `LazyObject`s as shared objects (`decoded()`);
/// `kube-informer-no-working-set`, `kube-informer-working-set-1` and
/// `kube-informer-working-set-32` run the defaults with no decoded working set, and with
/// one of 1 MiB (the default since the reconcile case measured it) and of 32 MiB;
/// `kube-informer-baseline` runs the defaults of the `--baseline` executable;
/// `kube-informer-controller` sees the updates through a `Controller`'s reconcile instead
/// of the update handler, and `kube-informer-controller-otel-off` and `-otel-on` do the
/// same in the `--traced` executable (built with the library's spans), without a
/// subscriber and with them exported to a collector that is down (the cost of tracing,
/// [`tracing_table`]); `kube-informer-json` and `client-go-json` read
/// JSON instead of protobuf, which both prefer for built-in kinds (kube-runtime only reads
/// JSON). A kube-informer configuration is one more line here.
const SUBJECTS: &[(&str, Binary, &[&str])] = &[
    ("kube-informer", Binary::KubeInformer, &[]),
    (
        "kube-informer-decoded",
        Binary::KubeInformer,
        &["--cache", "decoded"],
    ),
    (
        "kube-informer-json-codec",
        Binary::KubeInformer,
        &["--cache", "json-codec"],
    ),
    (
        "kube-informer-paged",
        Binary::KubeInformer,
        &["--paged-list"],
    ),
    (
        "kube-informer-http1",
        Binary::KubeInformer,
        &["--client", "kube"],
    ),
    (
        "kube-informer-lazy",
        Binary::KubeInformer,
        &["--object", "lazy"],
    ),
    (
        "kube-informer-lazy-decoded",
        Binary::KubeInformer,
        &["--object", "lazy", "--cache", "decoded"],
    ),
    ("kube-informer-json", Binary::KubeInformer, &["--json"]),
    (
        "kube-informer-no-working-set",
        Binary::KubeInformer,
        &["--working-set-mib", "0"],
    ),
    (
        "kube-informer-working-set-1",
        Binary::KubeInformer,
        &["--working-set-mib", "1"],
    ),
    (
        "kube-informer-working-set-32",
        Binary::KubeInformer,
        &["--working-set-mib", "32"],
    ),
    ("kube-informer-baseline", Binary::Baseline, &[]),
    (
        "kube-informer-controller",
        Binary::KubeInformer,
        &["--controller"],
    ),
    (
        "kube-informer-controller-otel-off",
        Binary::Traced,
        &["--controller", "--tracing", "off"],
    ),
    (
        "kube-informer-controller-otel-on",
        Binary::Traced,
        &["--controller", "--tracing", "otlp-unreachable"],
    ),
    ("kube-runtime", Binary::KubeRuntime, &[]),
    ("client-go", Binary::ClientGo, &[]),
    ("client-go-json", Binary::ClientGo, &["-json"]),
];

/// The subjects' executables.
#[derive(Debug, Clone, Copy)]
enum Binary {
    KubeInformer,
    /// `--baseline`: kube-informer's subject built from another commit.
    Baseline,
    /// `--traced`: kube-informer's subject built with the library's spans.
    Traced,
    KubeRuntime,
    ClientGo,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    benches::init_tracing("info,kube_client=off");
    let args = Args::parse();
    if let Some(path) = &args.from_json {
        let text = std::fs::read_to_string(path)?;
        let results: Results = serde_json::from_str(&text)
            .with_context(|| format!("reading results from {}", path.display()))?;
        return write_outputs(&args, &results);
    }
    let workqueue_runs = args.workqueue_runs.unwrap_or(args.runs);
    if args.workqueue_only {
        // Keep the informer results of the last full run beside the new workqueue ones.
        let mut results = std::fs::read_to_string(&args.json)
            .ok()
            .and_then(|text| serde_json::from_str::<Results>(&text).ok())
            .unwrap_or(Results {
                command: String::new(),
                results: Vec::new(),
                workqueue: None,
                pods: Vec::new(),
                relists: Vec::new(),
                apiserver_garbage_collected: None,
            });
        results.workqueue =
            Some(workqueue_report::measure(workqueue_runs, args.workqueue_ms).await?);
        return save_and_write_outputs(&args, &results);
    }
    // As a user reruns it, whichever way this executable was started.
    let command =
        std::iter::once("cargo run --release -p benches --bin informer-bench --".to_owned())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" ");
    let binaries = subject_binaries(args.baseline.as_deref(), args.traced.as_deref())?;
    if let Some(missing) = args
        .subjects
        .iter()
        .find(|s| !binaries.contains_key(s.as_str()))
    {
        bail!(
            "no executable for subject {missing}; kube-informer-baseline needs --baseline, \
             kube-informer-controller-otel-* need --traced"
        );
    }
    for subject in &args.subjects {
        if !binaries.contains_key(subject.as_str()) {
            let known: Vec<&str> = SUBJECTS.iter().map(|(name, _, _)| *name).collect();
            bail!("unknown subject {subject}; known: {}", known.join(", "));
        }
    }
    // Before the control plane starts, so nothing else runs meanwhile.
    let workqueue_results = if workqueue_runs > 0 {
        Some(workqueue_report::measure(workqueue_runs, args.workqueue_ms).await?)
    } else {
        None
    };

    eprintln!(
        "starting the control plane (watch cache {})",
        args.watch_cache
    );
    let env = kube_testenv::TestEnv::builder()
        .apiserver_arg(format!("--watch-cache={}", args.watch_cache))
        .start()
        .await?;
    let client = env.client().await?;
    // The floor is read by the client the default subject uses; the same reads by
    // kube-client's default client (HTTP/1.1) are reported beside it.
    let floor_clients = FloorClients {
        informer: benches::informer_client(env.kubeconfig_path())
            .await
            .context("the floor's client")?,
        http1: benches::client(env.kubeconfig_path())
            .await
            .context("the HTTP/1.1 floor's client")?,
    };
    // The relist scenario's path to the API server, and a kubeconfig through it.
    let relist_route = if args.relist_runs > 0 {
        let proxy = kube_testenv::FaultProxy::for_apiserver(&env)
            .await
            .context("starting the relist scenario's fault proxy")?;
        let kubeconfig = env.dir().join("kubeconfig-relist");
        env.kubeconfig_via(&proxy, &kubeconfig)
            .with_context(|| format!("writing {}", kubeconfig.display()))?;
        Some((proxy, kubeconfig))
    } else {
        None
    };
    let mut results = Results {
        command,
        results: Vec::new(),
        workqueue: workqueue_results,
        pods: Vec::new(),
        relists: Vec::new(),
        apiserver_garbage_collected: Some(args.collect_apiserver_garbage),
    };
    for &n in &args.pods {
        let namespace = env.create_namespace(&format!("bench-{n}")).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let started = Instant::now();
        benches::create_pods(&pods, n, args.create_concurrency, "informer-bench").await?;
        let create_s = started.elapsed().as_secs_f64();
        eprintln!("created {n} Pods in {namespace} in {create_s:.1} s");
        wait_for_idle_cpus().await;
        let pods_result = measure_floor(&args, &env, &floor_clients, &namespace, n, create_s)
            .await
            .with_context(|| format!("the floor at {n} Pods"))?;
        eprintln!("{}", serde_json::to_string(&pods_result)?);
        results.pods.push(pods_result);
        let runs = if n >= args.large_from {
            args.runs_large.unwrap_or(args.runs)
        } else {
            args.runs
        };
        for run in 0..runs {
            let mut order = args.subjects.clone();
            let len = order.len().max(1);
            order.rotate_left(run % len);
            for subject in order {
                wait_for_idle_cpus().await;
                let result = run_subject(
                    &args,
                    &binaries[subject.as_str()],
                    &subject,
                    env.kubeconfig_path(),
                    &env,
                    &pods,
                    &namespace,
                    n,
                    run,
                )
                .await
                .with_context(|| format!("{subject}, {n} Pods, run {run}"))?;
                eprintln!("{}", serde_json::to_string(&result)?);
                results.results.push(result);
            }
        }
        if let Some((proxy, kubeconfig)) = &relist_route {
            for run in 0..args.relist_runs {
                for subject in &args.subjects {
                    wait_for_idle_cpus().await;
                    let outcome = run_relist(
                        &args,
                        &binaries[subject.as_str()],
                        subject,
                        kubeconfig,
                        &env,
                        proxy,
                        &pods,
                        &namespace,
                        n,
                        run,
                    )
                    .await;
                    // Whatever happened, the next subject finds the path and server up.
                    proxy.reset().await.context("resetting the relist proxy")?;
                    if !env.apiserver_running() {
                        env.start_apiserver().await?;
                    }
                    let result =
                        outcome.with_context(|| format!("relist of {subject}, {n} Pods"))?;
                    eprintln!("{}", serde_json::to_string(&result)?);
                    results.relists.push(result);
                }
            }
        }
        // Saved after every N, so a long run that breaks keeps what it measured.
        save_json(&args, &results)?;
    }
    save_and_write_outputs(&args, &results)
}

/// The clients the floor is read by.
struct FloorClients {
    /// The default subject's: the floor.
    informer: kube_client::Client,
    /// kube-client's default: the reference beside it.
    http1: kube_client::Client,
}

/// Creation time, the control plane's memory and the floor at `n` Pods.
async fn measure_floor(
    args: &Args,
    env: &kube_testenv::TestEnv,
    clients: &FloorClients,
    namespace: &str,
    n: usize,
    create_s: f64,
) -> anyhow::Result<PodsResult> {
    let (etcd_rss_kb, _) = memory_of(&env.etcd_pid().to_string());
    let apiserver_rss_kb = env
        .apiserver_pid()
        .map_or(0, |pid| memory_of(&pid.to_string()).0);
    let mut result = PodsResult {
        pods: n,
        create_s,
        etcd_rss_kb,
        apiserver_rss_kb,
        mem_available_kb: mem_available_kb(),
        list_ms: Vec::new(),
        list_bytes: 0,
        streaming_ms: Vec::new(),
        streaming_bytes: 0,
        floor_apiserver_gcs: None,
        floor_client: FloorClient::Informer,
        http1_list_ms: Vec::new(),
        http1_streaming_ms: Vec::new(),
    };
    let mut gcs = 0;
    // The reads alternate, back to back (the caller waited for idle CPUs once).
    for _ in 0..args.floor_runs {
        let (list, streaming, floor_gcs) = floor_reads(args, &clients.informer, namespace).await?;
        result.list_ms.push(list.0);
        result.list_bytes = list.1;
        result.streaming_ms.push(streaming.0);
        result.streaming_bytes = streaming.1;
        let (list, streaming, http1_gcs) = floor_reads(args, &clients.http1, namespace).await?;
        result.http1_list_ms.push(list.0);
        result.http1_streaming_ms.push(streaming.0);
        gcs += floor_gcs + http1_gcs;
    }
    result.floor_apiserver_gcs = Some(gcs);
    Ok(result)
}

/// One unpaged and one streaming bare read of the Pods of `namespace` by `client`, each a
/// timed phase: (ms, bytes) of each, and kube-apiserver's collections during both.
async fn floor_reads(
    args: &Args,
    client: &kube_client::Client,
    namespace: &str,
) -> anyhow::Result<((f64, u64), (f64, u64), u64)> {
    let (list, list_gcs) =
        timed_phase(args, client, benches::floor::list(client, namespace)).await?;
    let (streaming, streaming_gcs) = timed_phase(
        args,
        client,
        benches::floor::streaming_list(client, namespace),
    )
    .await?;
    Ok((list, streaming, list_gcs + streaming_gcs))
}

/// Readies kube-apiserver for a timed phase: collects its garbage if `args` say so, then
/// returns its collection count, to subtract from the count after the phase.
async fn before_timed_phase(args: &Args, client: &kube_client::Client) -> anyhow::Result<u64> {
    if args.collect_apiserver_garbage {
        apiserver_gc::collect(client).await?;
    }
    apiserver_gc::collections(client).await
}

/// Runs `phase` between [`before_timed_phase`] and a second count: its output and the
/// collections kube-apiserver made meanwhile.
async fn timed_phase<T>(
    args: &Args,
    client: &kube_client::Client,
    phase: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(T, u64)> {
    let before = before_timed_phase(args, client).await?;
    let output = phase.await?;
    Ok((output, apiserver_gc::collections(client).await? - before))
}

/// MemAvailable from `/proc/meminfo`, KiB; 0 if unreadable.
fn mem_available_kb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Saves the raw results to `--json`, then writes the report and chart.
fn save_and_write_outputs(args: &Args, results: &Results) -> anyhow::Result<()> {
    save_json(args, results)?;
    write_outputs(args, results)
}

/// Saves the raw results to `--json`.
fn save_json(args: &Args, results: &Results) -> anyhow::Result<()> {
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(results)?)
        .with_context(|| format!("writing {}", args.json.display()))
}

/// Writes the markdown report (keeping its notes) and the chart.
fn write_outputs(args: &Args, results: &Results) -> anyhow::Result<()> {
    let json = args.from_json.as_ref().unwrap_or(&args.json);
    let mut report = report(args, json, results);
    if let Some(workqueue) = &results.workqueue {
        report = format!("{report}\n{}", workqueue_report::markdown(workqueue));
    }
    let notes = std::fs::read_to_string(&args.out)
        .ok()
        .and_then(|old| old.find(NOTES_MARKER).map(|i| old[i..].to_owned()))
        .unwrap_or_else(|| format!("{NOTES_MARKER}\n"));
    std::fs::write(&args.out, format!("{report}\n{notes}"))?;
    eprintln!("wrote {} and {}", args.out.display(), json.display());
    // The reconcile tables on stdout too, the figures a change to the read path is after.
    let mut ns: Vec<usize> = results.results.iter().map(|r| r.pods).collect();
    ns.sort_unstable();
    ns.dedup();
    for n in ns {
        print!("{}", reconcile_table(args, results, n));
        print!("{}", tracing_table(results, n));
    }
    if !results.results.is_empty() {
        chart(&args.chart, &args.subjects, results)
            .with_context(|| format!("drawing {}", args.chart.display()))?;
        eprintln!("wrote {}", args.chart.display());
    }
    Ok(())
}

/// A `--wrap` value: the subject's name, `=`, the command.
fn parse_wrap(value: &str) -> Result<(String, String), String> {
    let (subject, command) = value
        .split_once('=')
        .ok_or_else(|| format!("expected SUBJECT=COMMAND, got {value:?}"))?;
    if !SUBJECTS.iter().any(|(name, _, _)| *name == subject) {
        return Err(format!("no subject is called {subject:?}"));
    }
    if command.trim().is_empty() {
        return Err(format!("the command for {subject} is empty"));
    }
    Ok((subject.to_owned(), command.to_owned()))
}

/// The subjects' executables: the Rust ones beside this one, the Go one built now, and the
/// baseline if one is given.
fn subject_binaries(
    baseline: Option<&Path>,
    traced: Option<&Path>,
) -> anyhow::Result<HashMap<&'static str, PathBuf>> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("the executable has a directory")?;
    let go_module = Path::new(env!("CARGO_MANIFEST_DIR")).join("go-subject");
    let go_binary = dir.join("go-subject");
    benches::build_rust_subjects(&["subject-kube-informer", "subject-kube-runtime"])?;
    eprintln!("building {}", go_module.display());
    let status = std::process::Command::new("go")
        .args(["build", "-trimpath", "-o"])
        .arg(&go_binary)
        .arg(".")
        .current_dir(&go_module)
        .status()
        .context("running go build (is Go installed?)")?;
    if !status.success() {
        bail!("go build in {} failed: {status}", go_module.display());
    }
    let binaries: HashMap<&'static str, PathBuf> = SUBJECTS
        .iter()
        .filter_map(|(name, binary, _)| {
            let path = match binary {
                Binary::KubeInformer => dir.join("subject-kube-informer"),
                Binary::Baseline => baseline?.to_owned(),
                Binary::Traced => traced?.to_owned(),
                Binary::KubeRuntime => dir.join("subject-kube-runtime"),
                Binary::ClientGo => go_binary.clone(),
            };
            Some((*name, path))
        })
        .collect();
    for path in binaries.values() {
        if !path.is_file() {
            bail!("{} is missing; its build failed", path.display());
        }
    }
    Ok(binaries)
}

/// The options `subject` runs with beyond the common ones (see [`SUBJECTS`]).
fn subject_options(subject: &str) -> &'static [&'static str] {
    SUBJECTS
        .iter()
        .find(|(name, _, _)| *name == subject)
        .map_or(&[], |(_, _, options)| options)
}

/// Waits (at most 20 s) until the CPUs have been at least 90 % idle for 300 ms, so that no
/// run starts while the control plane is still busy after the previous one (garbage
/// collection after a large list, the watch cache taking in the last run's updates): on
/// 2 CPUs that work would land on whichever subject runs next.
async fn wait_for_idle_cpus() {
    const WINDOW: Duration = Duration::from_millis(300);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut before = cpu_times();
    loop {
        tokio::time::sleep(WINDOW).await;
        let now = cpu_times();
        if let (Some((idle0, total0)), Some((idle1, total1))) = (before, now) {
            let total = total1.saturating_sub(total0).max(1);
            if idle1.saturating_sub(idle0) as f64 / total as f64 >= 0.9 {
                return;
            }
        }
        if Instant::now() > deadline {
            eprintln!("the CPUs did not become idle within 20 s; running anyway");
            return;
        }
        before = now;
    }
}

/// Idle (idle + iowait) and total jiffies of all CPUs, from `/proc/stat`.
fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some((idle, fields.iter().take(8).sum()))
}

/// The subject's pid under `wrapper`: the wrapper's own once it has executed `binary` (as
/// `env` or `nice` do), else its first child (`perf record` and `strace` fork the subject).
async fn wrapped_child(wrapper: u32, binary: &Path, timeout: Duration) -> anyhow::Result<u32> {
    let children = format!("/proc/{wrapper}/task/{wrapper}/children");
    let binary = binary.canonicalize()?;
    let deadline = Instant::now() + timeout;
    loop {
        if std::fs::read_link(format!("/proc/{wrapper}/exe")).is_ok_and(|exe| exe == binary) {
            return Ok(wrapper);
        }
        let text = std::fs::read_to_string(&children)
            .with_context(|| format!("reading {children}; did the wrapper exit?"))?;
        if let Some(child) = text.split_whitespace().next() {
            return Ok(child.parse()?);
        }
        if Instant::now() > deadline {
            bail!("the wrapper (pid {wrapper}) started no process");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A subject's process: its pid and the JSON lines it prints, one per phase.
struct Subject {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    pid: u32,
    timeout: Duration,
}

impl Subject {
    /// Starts `subject` (`binary` with the subject's options) on the `n` Pods of
    /// `namespace`, with `extra` arguments, under the `--wrap` command given for it, if any
    /// (then `pid` is the subject's own, the wrapper's child).
    #[allow(clippy::too_many_arguments)]
    async fn spawn(
        args: &Args,
        binary: &Path,
        subject: &str,
        kubeconfig: &Path,
        namespace: &str,
        n: usize,
        run: usize,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let wrapper: Vec<String> = args
            .wrap
            .iter()
            .filter(|(name, _)| name == subject)
            .flat_map(|(_, command)| command.split_whitespace())
            .map(|word| {
                word.replace("{pods}", &n.to_string())
                    .replace("{run}", &run.to_string())
            })
            .collect();
        let mut command = match wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut command = tokio::process::Command::new(program);
                command.args(wrapper_args).arg(binary);
                command
            }
            None => tokio::process::Command::new(binary),
        };
        let mut child = command
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", namespace])
            .args(["--expect", &n.to_string()])
            .args(extra)
            .args(subject_options(subject))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut pid = child.id().context("the subject has a pid")?;
        if !wrapper.is_empty() {
            pid = wrapped_child(pid, binary, Duration::from_secs(args.timeout_s))
                .await
                .with_context(|| format!("finding {subject}'s process under its wrapper"))?;
        }
        let lines = BufReader::new(child.stdout.take().context("stdout is piped")?).lines();
        Ok(Self {
            child,
            lines,
            pid,
            timeout: Duration::from_secs(args.timeout_s),
        })
    }

    /// The next line the subject prints, parsed; `what` names it in errors.
    async fn next<T: serde::de::DeserializeOwned>(&mut self, what: &str) -> anyhow::Result<T> {
        let line = tokio::time::timeout(self.timeout, self.lines.next_line())
            .await
            .context("timed out waiting for the subject")??
            .context("the subject exited early")?;
        serde_json::from_str(&line).with_context(|| format!("reading the {what} line"))
    }

    /// Tells the subject to go on to its next phase: a line on its stdin.
    async fn go_ahead(&mut self) -> anyhow::Result<()> {
        use tokio::io::AsyncWriteExt;
        let stdin = self
            .child
            .stdin
            .as_mut()
            .context("the subject's stdin is open")?;
        stdin
            .write_all(b"go\n")
            .await
            .context("writing the go-ahead to the subject's stdin")?;
        stdin
            .flush()
            .await
            .context("flushing the subject's stdin")?;
        Ok(())
    }

    /// Tells the subject to exit (its stdin closes) and kills it if it has not within 10 s.
    async fn stop(mut self) -> anyhow::Result<()> {
        drop(self.child.stdin.take());
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_subject(
    args: &Args,
    binary: &Path,
    subject: &str,
    kubeconfig: &Path,
    env: &kube_testenv::TestEnv,
    pods: &Api<Pod>,
    namespace: &str,
    n: usize,
    run: usize,
) -> anyhow::Result<RunResult> {
    let updates = args.updates.min(n);
    let paced_updates = args.paced_updates.min(n);
    let reconciles = if args.reconcile_subjects.iter().any(|s| s == subject) {
        args.reconciles
    } else {
        0
    };
    let client = pods.clone().into_client();
    let gcs_before_sync = before_timed_phase(args, &client).await?;
    // kube-apiserver's peak from here to the subject's sync is what serving its initial
    // list cost the server.
    let apiserver = env.apiserver_pid();
    let apiserver_rss_before_kb = apiserver.map(|pid| memory_of(&pid.to_string()).0);
    if let Some(pid) = apiserver {
        reset_peak(pid).context("resetting kube-apiserver's peak RSS")?;
    }
    let apiserver_cpu_before = apiserver.and_then(cpu_use_of);
    let etcd_cpu_before = cpu_ms_of(env.etcd_pid());
    let spawned = Instant::now();
    let (updates_arg, reads_arg, reconciles_arg) = (
        (updates + paced_updates).to_string(),
        args.reads.to_string(),
        reconciles.to_string(),
    );
    let mut extra = vec!["--updates", &updates_arg, "--reads", &reads_arg];
    // Only to a subject that runs the case: a baseline may not know the option.
    if reconciles > 0 {
        extra.extend(["--reconciles", &reconciles_arg]);
    }
    let mut subject_process =
        Subject::spawn(args, binary, subject, kubeconfig, namespace, n, run, &extra).await?;
    let pid = subject_process.pid.to_string();
    let synced: SyncedLine = subject_process.next("synced").await?;
    let spawn_to_synced_ms = spawned.elapsed().as_secs_f64() * 1000.0;
    let subject_cpu_use = cpu_use_of(subject_process.pid);
    let apiserver_cpu_use = apiserver
        .and_then(cpu_use_of)
        .zip(apiserver_cpu_before)
        .map(|(after, before)| after.since(before));
    let etcd_cpu_ms = cpu_ms_of(env.etcd_pid())
        .zip(etcd_cpu_before)
        .map(|(after, before)| after - before);
    let apiserver_peak_kb = apiserver.map(|pid| memory_of(&pid.to_string()).1);
    let apiserver_gcs_sync = apiserver_gc::collections(&client).await? - gcs_before_sync;
    if synced.cached != n {
        bail!("{subject} cached {} Pods, expected {n}", synced.cached);
    }
    tokio::time::sleep(Duration::from_millis(args.settle_ms)).await;
    let (steady_rss_kb, peak_rss_kb) = memory_of(&pid);

    let id = |phase: &str, i: usize| format!("r{run}-{subject}-{phase}{i}");
    let gcs_before_updates = before_timed_phase(args, &client).await?;
    let cpu_before_updates = cpu_ns_of(subject_process.pid);
    let first_sent = unix_nanos();
    let burst = burst_updates(pods, UPDATE_LABEL, 0..updates, args.concurrency, |i| {
        id("", i)
    })
    .await?;
    // The collections the updates needed, the burst's and then the paced ones'; the
    // driver's own collection before the paced updates is not among them.
    let mut gcs_during_updates = 0;
    let mut gcs_before_paced = gcs_before_updates;
    let paced = if paced_updates > 0 {
        // The burst's tail must not queue ahead of the paced updates.
        wait_for_idle_cpus().await;
        // Like the burst, they start on a freshly collected server: the burst's
        // collections leave its heap anywhere short of the next one.
        gcs_during_updates += apiserver_gc::collections(&client).await? - gcs_before_updates;
        gcs_before_paced = before_timed_phase(args, &client).await?;
        paced_updates_at(pods, paced_updates, args.paced_rate, |i| id("p", i)).await?
    } else {
        Vec::new()
    };
    let seen: Option<UpdatesLine> = if updates + paced_updates > 0 {
        Some(subject_process.next("updates").await?)
    } else {
        None
    };
    let subject_cpu_updates_ms = cpu_ns_of(subject_process.pid)
        .zip(cpu_before_updates)
        .map(|(after, before)| after.saturating_sub(before) as f64 / 1e6);
    let reads: Option<ReadsLine> = if args.reads > 0 {
        // The server may still be taking in the updates' work (its watch cache, a
        // collection); the subject reads on idle CPUs.
        wait_for_idle_cpus().await;
        subject_process.go_ahead().await?;
        Some(subject_process.next("reads").await?)
    } else {
        None
    };
    // Only now: reading /metrics costs kube-apiserver a burst of CPU, which the subject's
    // timed reads of its cache, right after its updates, would share.
    gcs_during_updates += apiserver_gc::collections(&client).await? - gcs_before_paced;
    let reconcile = if reconciles > 0 {
        Some(
            run_reconciles(args, &mut subject_process, pods, n, reconciles, |i| {
                id("c", i)
            })
            .await
            .context("the reconcile case")?,
        )
    } else {
        None
    };
    let received = seen.map(|s| s.received).unwrap_or_default();
    let update = (updates > 0).then(|| {
        let latencies = latencies(&burst, &received);
        let last_response = burst.iter().map(|(_, t)| *t).max().unwrap_or(first_sent);
        let last_seen = burst
            .iter()
            .filter_map(|(id, _)| received.get(id).copied())
            .max()
            .unwrap_or(first_sent);
        UpdateResult {
            updates,
            all_seen_ms: (last_seen - first_sent) as f64 / 1e6,
            driver_ms: (last_response - first_sent) as f64 / 1e6,
            p50_ms: percentile(&latencies, 0.50),
            p99_ms: percentile(&latencies, 0.99),
        }
    });
    let paced = (paced_updates > 0).then(|| {
        let latencies = latencies(&paced, &received);
        PacedResult {
            updates: paced_updates,
            rate: args.paced_rate,
            p50_ms: percentile(&latencies, 0.50),
            p99_ms: percentile(&latencies, 0.99),
            max_ms: latencies.last().copied().unwrap_or(f64::NAN),
        }
    });
    subject_process.stop().await?;
    Ok(RunResult {
        pods: n,
        subject: subject.to_owned(),
        run,
        synced_ms: synced.synced_ms,
        spawn_to_synced_ms,
        rss_synced_kb: synced.rss_kb,
        steady_rss_kb,
        peak_rss_kb,
        update,
        paced,
        reads,
        reconcile,
        apiserver_rss_before_kb,
        apiserver_peak_kb,
        subject_cpu_ms: subject_cpu_use.as_ref().map(CpuUse::cpu_ms),
        apiserver_cpu_ms: apiserver_cpu_use.as_ref().map(CpuUse::cpu_ms),
        subject_cpu_use,
        apiserver_cpu_use,
        subject_cpu_updates_ms,
        etcd_cpu_ms,
        apiserver_gcs_sync: Some(apiserver_gcs_sync),
        apiserver_gcs_updates: Some(gcs_during_updates),
    })
}

/// The reconcile case for a subject that has done its reads: once kube-apiserver has
/// collected its garbage (if `args` say so) and the CPUs are idle, the go-ahead, then `m`
/// changes of the reconcile label of [`benches::reconcile_pods`], `id(i)` the `i`th value
/// (unique: a value the Pod already has would make no event), sent as the burst of updates
/// is; then the subject's line, and its RSS once the CPUs are idle again and `--settle-ms`
/// passed, so the figure is what the reconciles left behind rather than their garbage.
async fn run_reconciles(
    args: &Args,
    subject: &mut Subject,
    pods: &Api<Pod>,
    n: usize,
    m: usize,
    id: impl Fn(usize) -> String,
) -> anyhow::Result<ReconcileResult> {
    let client = pods.clone().into_client();
    let gcs_before = before_timed_phase(args, &client).await?;
    wait_for_idle_cpus().await;
    subject.go_ahead().await?;
    let targets = benches::reconcile_pods(n, m);
    let started = Instant::now();
    burst_updates(pods, RECONCILE_LABEL, targets, args.concurrency, id).await?;
    tracing::info!(
        updates = m,
        ms = started.elapsed().as_secs_f64() * 1000.0,
        "reconcile case: label updates sent"
    );
    let line: ReconcileLine = subject.next("reconcile").await?;
    let apiserver_gcs = apiserver_gc::collections(&client).await? - gcs_before;
    if line.events != m || line.reconciles == 0 {
        bail!(
            "{} saw {} changes and ran {} reconciles, expected {m} changes",
            line.subject,
            line.events,
            line.reconciles
        );
    }
    wait_for_idle_cpus().await;
    tokio::time::sleep(Duration::from_millis(args.settle_ms)).await;
    let (rss_kb, _) = memory_of(&subject.pid.to_string());
    tracing::info!(
        subject = line.subject,
        reconciles = line.reconciles,
        per_second = line.per_second,
        read_p99_us = line.read_p99_us,
        rss_kb,
        working_set_hits = line.working_set_hits,
        working_set_misses = line.working_set_misses,
        "reconcile case done"
    );
    Ok(ReconcileResult {
        updates: m,
        reconciles: line.reconciles,
        per_second: line.per_second,
        wall_per_second: line.wall_per_second,
        read_p50_us: line.read_p50_us,
        read_p99_us: line.read_p99_us,
        rss_kb,
        rss_during_kb: line.rss_kb,
        hwm_kb: line.hwm_kb,
        apiserver_gcs,
        working_set_hits: line.working_set_hits,
        working_set_misses: line.working_set_misses,
    })
}

/// The relist scenario, once for one subject: it syncs through `proxy`, which is then cut
/// while the last Pod's relist label changes, etcd is compacted and kube-apiserver
/// restarted; once the proxy lets it through again its watch gets 410 Gone and it lists
/// anew. Its peak RSS is reset just before the cut and read once it reported the change
/// and the CPUs are idle again (its events dispatched, the old cache freed).
#[allow(clippy::too_many_arguments)]
async fn run_relist(
    args: &Args,
    binary: &Path,
    subject: &str,
    kubeconfig: &Path,
    env: &kube_testenv::TestEnv,
    proxy: &kube_testenv::FaultProxy,
    pods: &Api<Pod>,
    namespace: &str,
    n: usize,
    run: usize,
) -> anyhow::Result<RelistResult> {
    let marker = format!("r{run}-{subject}");
    let mut subject_process = Subject::spawn(
        args,
        binary,
        subject,
        kubeconfig,
        namespace,
        n,
        run,
        &["--relist", &marker],
    )
    .await?;
    let pid = subject_process.pid;
    let synced: SyncedLine = subject_process.next("synced").await?;
    if synced.cached != n {
        bail!("{subject} cached {} Pods, expected {n}", synced.cached);
    }
    wait_for_idle_cpus().await;
    let (rss_before_kb, _) = memory_of(&pid.to_string());
    reset_peak(pid).with_context(|| format!("resetting {subject}'s peak RSS"))?;
    let last = benches::last_pod_name(n);
    let change = async {
        let patch = serde_json::json!({"metadata": {"labels": {RELIST_LABEL: &marker}}});
        pods.patch(&last, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .with_context(|| format!("setting the relist label of {last}"))?;
        anyhow::Ok(())
    };
    eprintln!("{subject}: cutting it off, compacting etcd, restarting kube-apiserver");
    let ((), restored_ns) = benches::faults::cut_compacted(env, &[proxy], true, change).await?;
    let relist: RelistLine = subject_process.next("relist").await?;
    let relist_ms = (relist.at_ns - restored_ns) as f64 / 1e6;
    wait_for_idle_cpus().await;
    let (rss_after_kb, peak_kb) = memory_of(&pid.to_string());
    subject_process.stop().await?;
    Ok(RelistResult {
        pods: n,
        subject: subject.to_owned(),
        run,
        relisted: relist.relisted,
        cached: relist.cached,
        rss_before_kb,
        peak_kb,
        rss_after_kb,
        relist_ms,
    })
}

/// Sets `label` of each Pod of `targets` (indexes, in order; the `i`th) to `id(i)` with
/// `concurrency` requests in flight, as fast as the API server takes them; returns each id
/// with the Unix nanos of its response.
async fn burst_updates(
    pods: &Api<Pod>,
    label: &'static str,
    targets: impl IntoIterator<Item = usize>,
    concurrency: usize,
    id: impl Fn(usize) -> String,
) -> anyhow::Result<Vec<(String, i64)>> {
    futures::stream::iter(targets.into_iter().enumerate())
        .map(|(i, pod)| update_label(pods.clone(), label, pod, id(i)))
        .buffer_unordered(concurrency)
        .try_collect()
        .await
}

/// Like [`burst_updates`], but starting one update every `1 / rate` seconds, whether or
/// not the earlier ones have been answered.
async fn paced_updates_at(
    pods: &Api<Pod>,
    m: usize,
    rate: u32,
    id: impl Fn(usize) -> String,
) -> anyhow::Result<Vec<(String, i64)>> {
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight = tokio::task::JoinSet::new();
    for i in 0..m {
        ticks.tick().await;
        in_flight.spawn(update_label(pods.clone(), UPDATE_LABEL, i, id(i)));
    }
    let mut responses = Vec::with_capacity(m);
    while let Some(response) = in_flight.join_next().await {
        responses.push(response??);
    }
    Ok(responses)
}

/// Sets Pod `nginx-<i>`'s `label` to `id`; returns `id` and when the response came.
async fn update_label(
    pods: Api<Pod>,
    label: &'static str,
    i: usize,
    id: String,
) -> anyhow::Result<(String, i64)> {
    let patch = serde_json::json!({"metadata": {"labels": {label: id}}});
    let name = pod_name(i);
    pods.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .with_context(|| format!("updating Pod {name}"))?;
    Ok((id, unix_nanos()))
}

/// Sorted latencies, ms, from each update's response to the subject's handler seeing it
/// (an update never seen counts as infinitely late).
fn latencies(responses: &[(String, i64)], received: &HashMap<String, i64>) -> Vec<f64> {
    let mut latencies: Vec<f64> = responses
        .iter()
        .map(|(id, responded)| {
            received
                .get(id)
                .map_or(f64::INFINITY, |seen| (seen - responded) as f64 / 1e6)
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    latencies
}

fn report(args: &Args, json: &Path, all: &Results) -> String {
    use std::fmt::Write;
    let command = &all.command;
    let results = &all.results;
    let mut out = String::new();
    let _ = writeln!(out, "# Informer benchmark\n");
    if results.is_empty() {
        let _ = writeln!(
            out,
            "No informer results in `{}` yet: run `informer-bench` without \
             `--workqueue-only`.",
            json.display()
        );
        return out;
    }
    let _ = writeln!(
        out,
        "Generated by `informer-bench` (`benches/src/bin/informer_bench.rs`); the raw \
         results are in `{}`. Each subject is its own process caching the Pods of one \
         namespace and counting events; subjects alternate, {} runs each, each run \
         starting once the CPUs have been 90 % idle for 300 ms; figures are medians, \
         ratios are to client-go.{}\n",
        json.display(),
        results.iter().map(|r| r.run + 1).max().unwrap_or(0),
        match all.apiserver_garbage_collected {
            Some(true) => {
                " kube-apiserver collects its garbage just before each subject's sync, \
                 its burst of updates, its paced updates and each floor read \
                 (`benches/src/apiserver_gc.rs`), so that no subject meets the server's \
                 collection by chance."
            }
            Some(false) => {
                " kube-apiserver collects its garbage when its heap says so \
                 (`--collect-apiserver-garbage false`), whichever subject runs then."
            }
            None => "",
        }
    );
    let _ = writeln!(out, "- command: `{command}`");
    let _ = writeln!(out, "- machine: {}", machine());
    let _ = writeln!(
        out,
        "- control plane: etcd + kube-apiserver {} (kube-testenv), `--watch-cache={}`, on \
         the same machine",
        kube_testenv::KUBERNETES_VERSION,
        args.watch_cache
    );
    let _ = writeln!(
        out,
        "- subjects: kube-informer {} (kube-client {}) through the client the guides \
         recommend (`kube_informer::client`: HTTP/2 with keep-alive pings, as client-go \
         speaks), kube-runtime {} `watcher` + `reflector` through kube-client's default \
         (HTTP/1.1), client-go {} `SharedIndexInformer` ({}); {}",
        lock_version("kube-informer"),
        lock_version("kube-client"),
        lock_version("kube-runtime"),
        client_go_version(),
        command_output("go", &["env", "GOVERSION"]),
        command_output("rustc", &["--version"]),
    );
    let _ = writeln!(
        out,
        "- Pods: the client-go tutorial's nginx Pod (4 labels, one container with \
         requests/limits) plus a label `{GROUP_LABEL}: g<i / {}>` shared by {} Pods each, \
         created by server-side apply so `managedFields` are populated; no scheduler or \
         kubelet runs, so they stay Pending",
        benches::GROUP_SIZE,
        benches::GROUP_SIZE
    );
    let _ = writeln!(
        out,
        "- sync modes: kube-informer syncs by a streaming list (`sendInitialEvents`, \
         KEP-3157) by default, `kube-informer-paged` by paged lists; client-go {}'s \
         reflector streams too: its feature gate `WatchListClient` is Beta and on by \
         default since 1.35 (`k8s.io/client-go/features/known_features.go`, \
         `defaultVersionedKubernetesFeatureGates`), and `NewReflectorWithOptions` turns \
         `useWatchList` on from it (`tools/cache/reflector.go`) for the generated \
         informers' list-watch, which supports watch-list semantics; kube-runtime's \
         `watcher` lists by pages (`watcher::Config::default()`)\n",
        client_go_version()
    );
    let _ = writeln!(
        out,
        "Columns: **sync** = process start to synced with N Pods cached (reported by the \
         subject from the start of `main`; **spawn** is the same measured by the driver from \
         `spawn`, including exec and runtime start); **RSS synced** = VmRSS at that moment; \
         **peak** = VmHWM and **steady** = VmRSS {} ms after sync; **M updates** = from the \
         first of M label updates (merge patches, {} in flight) to the last one reaching the \
         handler; **driver** = from the first update request to the last response (the pace \
         the API server took them at); **p50/p99** = per-update latency from the PATCH response to the handler \
         (can be negative: the watch event may arrive before the response); **paced p50/p99** (µs) = \
         the same for {} updates started at {} per second once the CPUs are idle again, a \
         pace the API server keeps up with, so the latency is the watch pipeline's (server \
         and subject) rather than the server's backlog.\n",
        args.settle_ms, args.concurrency, args.paced_updates, args.paced_rate
    );
    let _ = writeln!(
        out,
        "Second table of each N, after the updates (so the reads change neither the steady \
         memory nor the latencies) and once the CPUs are idle again: **get** = one read \
         by a random key ({} keys, the same for every subject, after as many untimed gets \
         of other keys; client-go `GetByKey`), **list** = one list of all objects \
         (median of 7), **by_index** = the objects of one `{GROUP_LABEL}` value (median of \
         200; `–` for kube-runtime, whose store has no indexes); **labels only** = the same \
         gets, lists and by-index reads of the Pods' labels alone, a projection that \
         decodes nothing else (`Store::get_as`, `list_as`, `by_index_as`; for \
         the `kube-informer-lazy` subjects, whose full reads decode each `LazyObject` \
         whole, the cached `LazyObject`s' own metadata; `–` where a store has no such reads: its \
         reads return the shared objects, labels included); **API server peak +MiB** = \
         kube-apiserver's VmHWM when the subject had synced, reset (`5` to \
         `/proc/<pid>/clear_refs`) just before the subject started, minus its VmRSS then: \
         what serving the subject's initial list cost the server (the RSS it starts from depends \
         on where the server's garbage collector was, so single runs vary with it; the \
         absolute peak is in parentheses); **CPU to sync** = the CPU time (user + system, \
         `/proc/<pid>/stat`, 10 ms ticks) the subject used from its start to its sync, and \
         the CPU time kube-apiserver used meanwhile: the two share this machine's cores, so \
         their sum over the cores bounds the sync time from below; **relist peak** = the \
         subject's VmHWM during a relist after 410 Gone (below); **sync / floor** = the \
         subject's sync time over the bare read of the same list.\n",
        args.reads
    );
    if results.iter().any(|r| r.reconcile.is_some()) {
        let _ = writeln!(out, "{}\n", reconcile_description(args));
    }
    let _ = writeln!(
        out,
        "![median sync time and steady RSS against N]({})\n",
        args.chart.strip_prefix("benches/").map_or_else(
            |_| args.chart.display().to_string(),
            |p| format!("benches/{}", p.display())
        )
    );
    let mut by_key: BTreeMap<(usize, usize), Vec<&RunResult>> = BTreeMap::new();
    for r in results {
        let order = args
            .subjects
            .iter()
            .position(|s| *s == r.subject)
            .unwrap_or(0);
        by_key.entry((r.pods, order)).or_default().push(r);
    }
    let baseline = |n: usize, f: &dyn Fn(&RunResult) -> Option<f64>| {
        let values: Vec<f64> = results
            .iter()
            .filter(|r| r.pods == n && r.subject == "client-go")
            .filter_map(f)
            .collect();
        median_if_any(values)
    };
    type Metric = (&'static str, fn(&RunResult) -> Option<f64>, f64);
    let metrics: [Metric; 11] = [
        ("sync ms", |r| Some(r.synced_ms), 1.0),
        ("spawn ms", |r| Some(r.spawn_to_synced_ms), 1.0),
        ("RSS synced MiB", |r| Some(r.rss_synced_kb as f64), 1024.0),
        ("peak MiB", |r| Some(r.peak_rss_kb as f64), 1024.0),
        ("steady MiB", |r| Some(r.steady_rss_kb as f64), 1024.0),
        (
            "M updates ms",
            |r| r.update.as_ref().map(|u| u.all_seen_ms),
            1.0,
        ),
        ("driver ms", |r| r.update.as_ref().map(|u| u.driver_ms), 1.0),
        ("p50 ms", |r| r.update.as_ref().map(|u| u.p50_ms), 1.0),
        ("p99 ms", |r| r.update.as_ref().map(|u| u.p99_ms), 1.0),
        ("paced p50 µs", |r| r.paced.as_ref().map(|p| p.p50_ms), 1e-3),
        ("paced p99 µs", |r| r.paced.as_ref().map(|p| p.p99_ms), 1e-3),
    ];
    let mut last_n = None;
    for ((n, _), runs) in &by_key {
        if last_n != Some(*n) {
            last_n = Some(*n);
            let m = runs[0].update.as_ref().map_or(0, |u| u.updates);
            let paced = runs[0].paced.as_ref().map_or_else(String::new, |p| {
                format!(", then {} paced at {}/s", p.updates, p.rate)
            });
            let _ = writeln!(out, "\n## N = {n} Pods, M = {m} updates{paced}\n");
            let _ = write!(out, "| subject | runs |");
            for (name, _, _) in &metrics {
                let _ = write!(out, " {name} |");
            }
            let _ = write!(out, "\n|---|---|");
            for _ in &metrics {
                let _ = write!(out, "---|");
            }
            let _ = writeln!(out);
        }
        let _ = write!(out, "| {} | {} |", runs[0].subject, runs.len());
        for (_, f, scale) in &metrics {
            let values: Vec<f64> = runs.iter().filter_map(|r| f(r)).collect();
            if values.is_empty() {
                let _ = write!(out, " – |");
                continue;
            }
            let value = median(values);
            let ratio = match baseline(*n, f) {
                Some(base) if runs[0].subject != "client-go" && base > 0.0 && value > 0.0 => {
                    format!(" ({:.2}×)", value / base)
                }
                _ => String::new(),
            };
            let _ = write!(out, " {:.1}{ratio} |", value / scale);
        }
        let _ = writeln!(out);
        if runs_are_last_of(&by_key, *n, runs[0]) {
            out.push_str(&depth_table(args, all, *n));
            out.push_str(&reconcile_table(args, all, *n));
        }
    }
    out.push_str(&growth_section(args, all));
    out.push_str(&relist_section(args, all));
    out.push_str(&targets_section(all));
    out
}

/// Whether `runs` are the last subject's of N `n` in the report's order.
fn runs_are_last_of(
    by_key: &BTreeMap<(usize, usize), Vec<&RunResult>>,
    n: usize,
    runs: &RunResult,
) -> bool {
    by_key
        .range((n, 0)..=(n, usize::MAX))
        .next_back()
        .is_some_and(|(_, last)| std::ptr::eq(last[0], runs))
}

/// The median of `f` over the runs of `subject` at `n`, if any has a value.
fn median_of(
    results: &[RunResult],
    n: usize,
    subject: &str,
    f: impl Fn(&RunResult) -> Option<f64>,
) -> Option<f64> {
    let values: Vec<f64> = results
        .iter()
        .filter(|r| r.pods == n && r.subject == subject)
        .filter_map(f)
        .collect();
    median_if_any(values)
}

/// The median of `values`, if there are any.
fn median_if_any(values: Vec<f64>) -> Option<f64> {
    (!values.is_empty()).then(|| median(values))
}

fn cell(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.decimals$}"))
}

/// The floor's medians at `n`: (unpaged list ms, streaming list ms).
fn floor_of(all: &Results, n: usize) -> (Option<f64>, Option<f64>) {
    let Some(p) = all.pods.iter().find(|p| p.pods == n) else {
        return (None, None);
    };
    (
        median_if_any(p.list_ms.clone()),
        median_if_any(p.streaming_ms.clone()),
    )
}

/// Reads, the API server's peak, the relist peak and the floor of every subject at `n`.
fn depth_table(args: &Args, all: &Results, n: usize) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let (list_floor, stream_floor) = floor_of(all, n);
    if let Some(p) = all.pods.iter().find(|p| p.pods == n) {
        let http1 = if p.http1_list_ms.is_empty() {
            String::new()
        } else {
            format!(
                " The same reads by {}, which the kube-runtime subject uses: unpaged {} ms, \
                 streaming {} ms.",
                FloorClient::KubeDefault.describe(),
                cell(median_if_any(p.http1_list_ms.clone()), 1),
                cell(median_if_any(p.http1_streaming_ms.clone()), 1),
            )
        };
        let _ = writeln!(
            out,
            "\nFloor at {n} Pods (the same list read bare by {}, protobuf, body read and \
             discarded, request to last byte, median of {}): unpaged list **{} ms** \
             ({:.1} MiB), streaming list to the initial-events-end bookmark **{} ms** \
             ({:.1} MiB).{http1} Pods created in {:.1} s; then etcd {:.0} MiB, \
             kube-apiserver {:.0} MiB RSS, {:.1} GiB of RAM available.\n",
            p.floor_client.describe(),
            p.list_ms.len(),
            cell(list_floor, 1),
            p.list_bytes as f64 / 1048576.0,
            cell(stream_floor, 1),
            p.streaming_bytes as f64 / 1048576.0,
            p.create_s,
            p.etcd_rss_kb as f64 / 1024.0,
            p.apiserver_rss_kb as f64 / 1024.0,
            p.mem_available_kb as f64 / 1048576.0,
        );
    }
    let _ = writeln!(
        out,
        "| subject | get p50 µs | get p99 µs | list ms | by_index ({0}) µs | labels only: get p50 / p99 µs, list ms, by_index ({0}) µs | API server peak +MiB (peak MiB) | CPU to sync ms: subject + API server | relist peak MiB | sync / list floor | sync / streaming floor |",
        benches::GROUP_SIZE
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for subject in &args.subjects {
        let runs = |f: &dyn Fn(&RunResult) -> Option<f64>| median_of(&all.results, n, subject, f);
        if median_of(&all.results, n, subject, |r| Some(r.synced_ms)).is_none() {
            continue;
        }
        let sync = runs(&|r| Some(r.synced_ms));
        let relist: Vec<f64> = all
            .relists
            .iter()
            .filter(|r| r.pods == n && r.subject == *subject)
            .map(|r| r.peak_kb as f64 / 1024.0)
            .collect();
        let relisted_all = all
            .relists
            .iter()
            .filter(|r| r.pods == n && r.subject == *subject)
            .all(|r| r.relisted);
        let relist_cell = if relist.is_empty() {
            "–".to_owned()
        } else if relisted_all {
            format!("{:.1}", median(relist))
        } else {
            format!("{:.1} (**no relist seen**)", median(relist))
        };
        let ratio = |floor: Option<f64>| match (sync, floor) {
            (Some(s), Some(f)) if f > 0.0 => format!("{:.2}×", s / f),
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {subject} | {} | {} | {} | {} | {} | {} | {} | {relist_cell} | {} | {} |",
            cell(runs(&|r| r.reads.as_ref().map(|x| x.get_p50_ns / 1e3)), 2),
            cell(runs(&|r| r.reads.as_ref().map(|x| x.get_p99_ns / 1e3)), 2),
            cell(runs(&|r| r.reads.as_ref().map(|x| x.list_ms)), 2),
            cell(runs(&|r| r.reads.as_ref().and_then(|x| x.by_index_us)), 1),
            labels_cell(
                runs(&|r| r.reads.as_ref().and_then(|x| x.labels_p50_ns)),
                runs(&|r| r.reads.as_ref().and_then(|x| x.labels_p99_ns)),
                runs(&|r| r.reads.as_ref().and_then(|x| x.labels_list_ms)),
                runs(&|r| r.reads.as_ref().and_then(|x| x.labels_by_index_us)),
            ),
            match (
                runs(&|r| Some(
                    r.apiserver_peak_kb? as f64 / 1024.0
                        - r.apiserver_rss_before_kb? as f64 / 1024.0
                )),
                runs(&|r| Some(r.apiserver_peak_kb? as f64 / 1024.0)),
            ) {
                (Some(delta), Some(peak)) => format!("+{delta:.1} ({peak:.0})"),
                _ => "–".to_owned(),
            },
            match (runs(&|r| r.subject_cpu_ms), runs(&|r| r.apiserver_cpu_ms),) {
                (Some(own), Some(server)) => format!("{own:.0} + {server:.0}"),
                _ => "–".to_owned(),
            },
            ratio(list_floor),
            ratio(stream_floor),
        );
    }
    out
}

/// What the reconcile tables show, for the report's preamble.
fn reconcile_description(args: &Args) -> String {
    format!(
        "Third table of each N, the reconcile case, after the reads, for {}: once the CPUs \
         are idle the driver changes the `{RECONCILE_LABEL}` label of M Pods drawn at random \
         across all groups (the same Pods in the same order for every subject, {} in \
         flight); the subject's update handler queues the key of each Pod whose label \
         changed (kube-informer: `workqueue::Queue`; client-go: `workqueue.Typed`; \
         kube-runtime, whose queue is inside its `Controller`: a tokio channel), and one \
         worker reconciles each key with a ReplicaSet controller's reads of its cache: the \
         Pod by key, then its group of {} by label selector (kube-informer: \
         `Store::get_by_key` and `Lister::list_selector`; client-go: the generated \
         `PodLister`'s `Pods(ns).Get` and `List(labels.SelectorFromSet(…))`; kube-runtime: \
         `Store::get` and `state()` filtered by a kube-rs `Selector`), each list checked \
         whole. **reconciles/s** = reconciles over the sum of their reads' time (get + \
         list): the worker's read capacity, whatever the API server's pace; **÷ client-go** \
         = that over client-go's; **read p50/p99** = one reconcile's reads; **RSS during** = \
         VmRSS right after the last reconcile, **peak** = VmHWM from the case's start (reset \
         then) to it, **RSS after** = VmRSS once the CPUs are idle again plus {} ms; \
         **wall updates/s** = M over the time from the subject's first event to its last \
         reconcile's end, the API server's pace included; **reconciles** = how many ran, \
         fewer than M where a queue collapsed two changes of one Pod that waited together.",
        args.reconcile_subjects.join(", "),
        args.concurrency,
        benches::GROUP_SIZE,
        args.settle_ms,
    )
}

/// The reconcile case's table at `n`: a row per subject that ran it, medians over its runs;
/// empty if none did.
fn reconcile_table(args: &Args, all: &Results, n: usize) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let of = |subject: &str, f: fn(&ReconcileResult) -> f64| {
        median_of(&all.results, n, subject, |r| r.reconcile.as_ref().map(f))
    };
    let Some(m) = all
        .results
        .iter()
        .filter(|r| r.pods == n)
        .find_map(|r| r.reconcile.as_ref().map(|c| c.updates))
    else {
        return out;
    };
    let _ = writeln!(
        out,
        "\nReconcile case at {n} Pods, M = {m} label updates (medians):\n"
    );
    let _ = writeln!(
        out,
        "| subject | runs | reconciles/s | ÷ client-go | read p50 µs | read p99 µs | RSS during MiB | peak MiB | RSS after MiB | wall updates/s | reconciles |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    let client_go = of("client-go", |c| c.per_second);
    for subject in &args.subjects {
        let runs = all
            .results
            .iter()
            .filter(|r| r.pods == n && r.subject == *subject && r.reconcile.is_some())
            .count();
        let Some(per_second) = of(subject, |c| c.per_second) else {
            continue;
        };
        // Two significant digits however far below client-go a subject is.
        let ratio = match client_go {
            Some(base) if subject != "client-go" && base > 0.0 => {
                let ratio = per_second / base;
                let decimals = (1.0 - ratio.log10().floor()).clamp(2.0, 6.0) as usize;
                format!("{ratio:.decimals$}×")
            }
            _ => "–".to_owned(),
        };
        let mib = |f: fn(&ReconcileResult) -> f64| cell(of(subject, f).map(|kb| kb / 1024.0), 1);
        let _ = writeln!(
            out,
            "| {subject} | {runs} | {per_second:.0} | {ratio} | {} | {} | {} | {} | {} | {} | {} |",
            cell(of(subject, |c| c.read_p50_us), 1),
            cell(of(subject, |c| c.read_p99_us), 1),
            mib(|c| c.rss_during_kb as f64),
            mib(|c| c.hwm_kb as f64),
            mib(|c| c.rss_kb as f64),
            cell(of(subject, |c| c.wall_per_second), 0),
            cell(of(subject, |c| c.reconciles as f64), 0),
        );
    }
    out
}

/// The subjects [`tracing_table`] compares, in its order: the library without its spans, with
/// them and no subscriber, with them exported to a collector that is down.
const TRACING_SUBJECTS: [(&str, &str); 3] = [
    ("kube-informer-controller", "no `opentelemetry` feature"),
    ("kube-informer-controller-otel-off", "feature, tracing off"),
    (
        "kube-informer-controller-otel-on",
        "feature, OTLP on, no collector",
    ),
];

/// The cost of tracing at `n` (medians; empty unless a tracing subject ran): the burst's
/// and the paced updates' latencies to the controller's reconcile, and the subject's CPU
/// time per update over both, each against the build without the feature.
fn tracing_table(all: &Results, n: usize) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let ran = |subject: &str| {
        all.results
            .iter()
            .any(|r| r.pods == n && r.subject == subject)
    };
    if !TRACING_SUBJECTS
        .iter()
        .skip(1)
        .any(|(subject, _)| ran(subject))
    {
        return out;
    }
    /// A column: its header and its figure of one run.
    type Column = (&'static str, fn(&RunResult) -> Option<f64>);
    let columns: [Column; 6] = [
        ("M updates ms", |r| r.update.as_ref().map(|u| u.all_seen_ms)),
        ("p50 ms", |r| r.update.as_ref().map(|u| u.p50_ms)),
        ("p99 ms", |r| r.update.as_ref().map(|u| u.p99_ms)),
        ("paced p50 µs", |r| {
            r.paced.as_ref().map(|p| p.p50_ms * 1000.0)
        }),
        ("paced p99 µs", |r| {
            r.paced.as_ref().map(|p| p.p99_ms * 1000.0)
        }),
        ("CPU µs/update", |r| {
            let updates = r.update.as_ref().map_or(0, |u| u.updates)
                + r.paced.as_ref().map_or(0, |p| p.updates);
            r.subject_cpu_updates_ms
                .filter(|_| updates > 0)
                .map(|ms| ms * 1000.0 / updates as f64)
        }),
    ];
    let _ = writeln!(
        out,
        "\nThe cost of tracing at {n} Pods (medians; ratios to the build without the feature):\n"
    );
    let header: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
    let _ = writeln!(out, "| variant | runs | {} |", header.join(" | "));
    let _ = writeln!(out, "|---|---|{}", "---|".repeat(columns.len()));
    let (without, _) = TRACING_SUBJECTS[0];
    for (subject, variant) in TRACING_SUBJECTS {
        if !ran(subject) {
            continue;
        }
        let runs = all
            .results
            .iter()
            .filter(|r| r.pods == n && r.subject == subject)
            .count();
        let cells: Vec<String> = columns
            .iter()
            .map(|(_, f)| {
                let value = median_of(&all.results, n, subject, f);
                let base = median_of(&all.results, n, without, f);
                match (value, base) {
                    (Some(v), Some(b)) if subject != without && b > 0.0 => {
                        format!("{v:.1} ({:.2}×)", v / b)
                    }
                    _ => cell(value, 1),
                }
            })
            .collect();
        let _ = writeln!(out, "| {variant} | {runs} | {} |", cells.join(" | "));
    }
    out
}

/// The projected reads' cell: get p50 / p99 µs, list ms and by-index µs, each `–` where
/// the runs lack it (results from before the figure existed).
fn labels_cell(
    p50_ns: Option<f64>,
    p99_ns: Option<f64>,
    list_ms: Option<f64>,
    by_index_us: Option<f64>,
) -> String {
    if p50_ns.is_none() {
        return "–".to_owned();
    }
    format!(
        "{} / {}, {}, {}",
        cell(p50_ns.map(|ns| ns / 1e3), 2),
        cell(p99_ns.map(|ns| ns / 1e3), 2),
        cell(list_ms, 2),
        cell(by_index_us, 1),
    )
}

/// How sync time, steady memory and peak memory grow from the smallest N to the largest.
fn growth_section(args: &Args, all: &Results) -> String {
    use std::fmt::Write;
    let mut ns: Vec<usize> = all.results.iter().map(|r| r.pods).collect();
    ns.sort_unstable();
    ns.dedup();
    let mut out = String::new();
    if ns.len() < 2 {
        return out;
    }
    let _ = writeln!(
        out,
        "\n## Growth with N\n\nMedians per N; the last column is the largest N's value over \
         the smallest's (N grew {:.0}×), `–` where the smallest is below 1.\n",
        ns[ns.len() - 1] as f64 / ns[0] as f64
    );
    type Row<'a> = (&'a str, &'a dyn Fn(&RunResult) -> Option<f64>);
    let figures: [Row<'_>; 4] = [
        ("sync ms", &|r| Some(r.synced_ms)),
        ("steady MiB", &|r| Some(r.steady_rss_kb as f64 / 1024.0)),
        ("peak MiB", &|r| Some(r.peak_rss_kb as f64 / 1024.0)),
        ("API server peak +MiB", &|r| {
            Some((r.apiserver_peak_kb? as f64 - r.apiserver_rss_before_kb? as f64) / 1024.0)
        }),
    ];
    for (name, f) in figures {
        let _ = write!(out, "| {name} |");
        for n in &ns {
            let _ = write!(out, " N = {n} |");
        }
        let _ = writeln!(out, " growth |");
        let _ = write!(out, "|---|");
        for _ in 0..=ns.len() {
            let _ = write!(out, "---|");
        }
        let _ = writeln!(out);
        let mut rows: Vec<(String, Vec<Option<f64>>)> = args
            .subjects
            .iter()
            .map(|s| {
                let values = ns
                    .iter()
                    .map(|&n| median_of(&all.results, n, s, f))
                    .collect();
                (s.clone(), values)
            })
            .collect();
        if name == "sync ms" {
            rows.push((
                "floor: unpaged list".to_owned(),
                ns.iter().map(|&n| floor_of(all, n).0).collect(),
            ));
            rows.push((
                "floor: streaming list".to_owned(),
                ns.iter().map(|&n| floor_of(all, n).1).collect(),
            ));
        }
        for (label, values) in rows {
            if values.iter().all(Option::is_none) {
                continue;
            }
            let _ = write!(out, "| {label} |");
            for v in &values {
                let _ = write!(out, " {} |", cell(*v, 1));
            }
            // A ratio to a base below one unit (the API server's few extra KiB for a
            // small list) measures the noise of that base, not a growth.
            let growth = match (
                values.first().copied().flatten(),
                values.last().copied().flatten(),
            ) {
                (Some(a), Some(b)) if a >= 1.0 => format!("{:.1}×", b / a),
                _ => "–".to_owned(),
            };
            let _ = writeln!(out, " {growth} |");
        }
        let _ = writeln!(out);
    }
    out
}

/// The relist scenario's table.
fn relist_section(args: &Args, all: &Results) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if all.relists.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\n## Relist after 410 Gone\n\nA scenario of its own, {} run(s) per subject per N: \
         the subject syncs through its own Toxiproxy; once the CPUs are idle its peak RSS \
         is reset (`5` to `/proc/<pid>/clear_refs`); the proxy is cut, the last Pod's \
         `{RELIST_LABEL}` label set, etcd compacted and kube-apiserver restarted (so its \
         watch cache starts past the subject's resourceVersion); the proxy restored, the \
         subject's watch gets 410 Gone and it lists again. The subject reports when its \
         handler saw the change (that Pod comes last in a list, so the whole list has been \
         taken in by then; kube-informer checks that it listed a second time, client-go \
         that it replayed the cached objects, kube-runtime that its `InitDone` came); the \
         driver reads VmHWM once the CPUs are idle again. **relist** = from the proxy's \
         restore to that report, including the subject's reconnect backoff.\n",
        all.relists.iter().map(|r| r.run + 1).max().unwrap_or(0)
    );
    let _ = writeln!(
        out,
        "| N | subject | relisted | RSS before MiB | peak during relist MiB | peak / before | RSS after MiB | relist ms |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    let mut ns: Vec<usize> = all.relists.iter().map(|r| r.pods).collect();
    ns.sort_unstable();
    ns.dedup();
    for n in ns {
        for subject in &args.subjects {
            let runs: Vec<&RelistResult> = all
                .relists
                .iter()
                .filter(|r| r.pods == n && r.subject == *subject)
                .collect();
            if runs.is_empty() {
                continue;
            }
            let m = |f: fn(&RelistResult) -> f64| median(runs.iter().map(|r| f(r)).collect());
            let relisted = runs.iter().filter(|r| r.relisted).count();
            let _ = writeln!(
                out,
                "| {n} | {subject} | {relisted}/{} | {:.1} | {:.1} | {:.2}× | {:.1} | {:.0} |",
                runs.len(),
                m(|r| r.rss_before_kb as f64 / 1024.0),
                m(|r| r.peak_kb as f64 / 1024.0),
                m(|r| r.peak_kb as f64 / r.rss_before_kb.max(1) as f64),
                m(|r| r.rss_after_kb as f64 / 1024.0),
                m(|r| r.relist_ms),
            );
        }
    }
    out
}

/// The issue's targets at 10,000 Pods, each computed from the results: for the default
/// configuration, then for each of [`TARGET_SUBJECTS`] the run has.
fn targets_section(all: &Results) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n## Targets at N = {TARGETS_N}\n\nComputed from the JSON by the driver: medians \
         over the runs; `{DEFAULT_SUBJECT}` is the default configuration.\n"
    );
    if !all.results.iter().any(|r| r.pods == TARGETS_N) {
        let _ = writeln!(out, "No results at N = {TARGETS_N} in this run.");
        return out;
    }
    out.push_str(&targets_table(all, DEFAULT_SUBJECT));
    for (subject, what) in TARGET_SUBJECTS {
        if all
            .results
            .iter()
            .any(|r| r.pods == TARGETS_N && r.subject == *subject)
        {
            let _ = writeln!(out, "\nThe same targets for `{subject}`, {what}:\n");
            out.push_str(&targets_table(all, subject));
        }
    }
    let runs: Vec<&RunResult> = all.results.iter().filter(|r| r.pods == TARGETS_N).collect();
    // (phases with a collection, phases counted)
    let with_collections = |gcs: fn(&RunResult) -> Option<u64>| {
        let counted: Vec<u64> = runs.iter().filter_map(|r| gcs(r)).collect();
        (counted.iter().filter(|&&c| c > 0).count(), counted.len())
    };
    let (syncs_with, syncs) = with_collections(|r| r.apiserver_gcs_sync);
    let (bursts_with, bursts) = with_collections(|r| r.apiserver_gcs_updates);
    if syncs > 0 {
        let _ = writeln!(
            out,
            "\nkube-apiserver collected its garbage during {syncs_with} of the {syncs} \
             syncs and {bursts_with} of the {bursts} bursts and paced updates at N = {TARGETS_N} \
             (the updates allocate enough to need one or two collections of their own)."
        );
    }
    out
}

/// The targets' table for `subject`.
fn targets_table(all: &Results, subject: &str) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let m = |subject: &str, f: &dyn Fn(&RunResult) -> Option<f64>| {
        median_of(&all.results, TARGETS_N, subject, f)
    };
    let _ = writeln!(out, "| target | measured | met? |");
    let _ = writeln!(out, "|---|---|---|");
    let mut row = |target: &str, measured: Option<(String, bool)>| {
        let (text, met) = measured.map_or_else(
            || ("not measured (a subject missing)".to_owned(), "–"),
            |(text, met)| (text, if met { "**yes**" } else { "no" }),
        );
        let _ = writeln!(out, "| {target} | {text} | {met} |");
    };
    let ratio_target = |name: &str,
                        base: &str,
                        f: &dyn Fn(&RunResult) -> Option<f64>,
                        limit: f64,
                        unit: &str,
                        scale: f64| {
        let (a, b) = (m(name, f)?, m(base, f)?);
        let r = a / b;
        let spread = |subject: &str| {
            range_of(&all.results, TARGETS_N, subject, f).map_or_else(String::new, |(lo, hi)| {
                format!(" (runs {:.1}–{:.1})", lo / scale, hi / scale)
            })
        };
        Some((
            format!(
                "{name} {:.1} {unit}{} / {base} {:.1} {unit}{} = {r:.2}×",
                a / scale,
                spread(name),
                b / scale,
                spread(base)
            ),
            r <= limit,
        ))
    };
    let steady = |r: &RunResult| Some(r.steady_rss_kb as f64);
    row(
        "steady RSS ≤ 0.5× client-go",
        ratio_target(subject, "client-go", &steady, 0.5, "MiB", 1024.0),
    );
    row(
        "steady RSS ≤ 0.8× kube-runtime",
        ratio_target(subject, "kube-runtime", &steady, 0.8, "MiB", 1024.0),
    );
    row(
        "spawn-to-synced ≤ client-go",
        ratio_target(
            subject,
            "client-go",
            &|r| Some(r.spawn_to_synced_ms),
            1.0,
            "ms",
            1.0,
        ),
    );
    row(
        "paced p99 ≤ client-go",
        ratio_target(
            subject,
            "client-go",
            &|r| r.paced.as_ref().map(|p| p.p99_ms * 1000.0),
            1.0,
            "µs",
            1.0,
        ),
    );
    row(
        "burst p99 ≤ client-go",
        ratio_target(
            subject,
            "client-go",
            &|r| r.update.as_ref().map(|u| u.p99_ms),
            1.0,
            "ms",
            1.0,
        ),
    );
    row(
        "`get` of a whole Pod p99 < 10 µs",
        m(subject, &|r| r.reads.as_ref().map(|x| x.get_p99_ns / 1e3))
            .map(|p99| (format!("{subject} {p99:.2} µs"), p99 < 10.0)),
    );
    let (list_floor, stream_floor) = floor_of(all, TARGETS_N);
    row(
        "sync ≤ 1.5× the floor",
        m(subject, &|r| Some(r.synced_ms)).and_then(|sync| {
            let stream = stream_floor?;
            let list = list_floor.map_or_else(String::new, |l| {
                format!("; {:.2}× the unpaged list's {l:.1} ms", sync / l)
            });
            Some((
                format!(
                    "{sync:.1} ms = {:.2}× the streaming list's {stream:.1} ms (it syncs \
                     by one){list}",
                    sync / stream
                ),
                sync / stream <= 1.5,
            ))
        }),
    );
    out
}

/// The smallest and largest of `f` over the runs of `subject` at `n`.
fn range_of(
    results: &[RunResult],
    n: usize,
    subject: &str,
    f: impl Fn(&RunResult) -> Option<f64>,
) -> Option<(f64, f64)> {
    results
        .iter()
        .filter(|r| r.pods == n && r.subject == subject)
        .filter_map(f)
        .fold(None, |range, v| match range {
            None => Some((v, v)),
            Some((lo, hi)) => Some((f64::min(lo, v), f64::max(hi, v))),
        })
}

/// Medians of `metric` per subject, as `(N, value)` points in N order.
fn series(
    subjects: &[String],
    results: &[RunResult],
    metric: fn(&RunResult) -> f64,
) -> Vec<(String, Vec<(f64, f64)>)> {
    subjects
        .iter()
        .map(|subject| {
            let mut by_n: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
            for r in results.iter().filter(|r| r.subject == *subject) {
                by_n.entry(r.pods).or_default().push(metric(r));
            }
            let points = by_n
                .into_iter()
                .map(|(n, values)| (n as f64, median(values)))
                .collect();
            (subject.clone(), points)
        })
        .collect()
}

/// Round tick values for a log axis over `lo..hi`: the powers of ten inside, with 2 and 5
/// times them when fewer than three powers fall inside.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (from, to) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let decades: Vec<f64> = (from..=to).map(|e| 10f64.powi(e)).collect();
    let inside = decades.iter().filter(|v| (lo..=hi).contains(*v)).count();
    let steps: &[f64] = if inside >= 3 {
        &[1.0]
    } else {
        &[1.0, 2.0, 5.0]
    };
    decades
        .iter()
        .flat_map(|d| steps.iter().map(move |s| d * s))
        .filter(|v| (lo..=hi).contains(v))
        .collect()
}

/// An N tick's label: 1k, 10k, 100k, 1M for large values, plain digits below.
fn n_label(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{}k", v / 1e3)
    } else {
        format!("{v}")
    }
}

/// Two panels, sync time and steady RSS against N, one line per subject, on log-log axes
/// with round ticks; the default configuration drawn thick, the floor (the streaming and
/// the unpaged list read bare) as black lines on the sync panel. Text is drawn with an
/// embedded 8×8 bitmap font, so no system font is needed.
fn chart(path: &Path, subjects: &[String], all: &Results) -> anyhow::Result<()> {
    use plotters::{coord::combinators::IntoLogRange, prelude::*};
    const COLORS: [RGBColor; 7] = [
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x8c, 0x56, 0x4b),
        RGBColor(0x17, 0xbe, 0xcf),
    ];
    let results = &all.results;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let (width, height) = (1200u32, 600u32);
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    type Panel = (&'static str, fn(&RunResult) -> f64);
    let panels: [Panel; 2] = [
        ("sync time, ms (median, log)", |r| r.synced_ms),
        ("steady RSS, MiB (median, log)", |r| {
            r.steady_rss_kb as f64 / 1024.0
        }),
    ];
    let halves = root.split_evenly((1, 2));
    for (panel, ((title, metric), area)) in panels.into_iter().zip(&halves).enumerate() {
        let mut data: Vec<(String, Vec<(f64, f64)>)> = series(subjects, results, metric);
        if panel == 0 {
            let floor = |pick: fn(&PodsResult) -> &Vec<f64>| -> Vec<(f64, f64)> {
                let mut points: Vec<(f64, f64)> = all
                    .pods
                    .iter()
                    .filter(|p| !pick(p).is_empty())
                    .map(|p| (p.pods as f64, median(pick(p).clone())))
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                points
            };
            data.push((
                "floor: streaming list".to_owned(),
                floor(|p| &p.streaming_ms),
            ));
            data.push(("floor: unpaged list".to_owned(), floor(|p| &p.list_ms)));
        }
        let points = || data.iter().flat_map(|(_, p)| p.iter().copied());
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let (min_x, max_x) = points()
            .map(|(x, _)| x)
            .filter(|x| positive(*x))
            .fold((f64::INFINITY, 0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
        let (min_y, max_y) = points()
            .map(|(_, y)| y)
            .filter(|y| positive(*y))
            .fold((f64::INFINITY, 0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
        if !min_x.is_finite() || !min_y.is_finite() {
            continue;
        }
        let (x_lo, x_hi) = (min_x / 1.4, max_x * 1.4);
        let (y_lo, y_hi) = (min_y / 1.6, max_y * 1.6);
        let mut chart = ChartBuilder::on(area)
            .margin_left(104)
            .margin_right(30)
            .margin_top(50)
            .margin_bottom(170)
            .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())?;
        let x0 = panel as i32 * (width as i32 / 2);
        let grey = RGBColor(0xdd, 0xdd, 0xdd);
        for y in log_ticks(y_lo, y_hi) {
            chart.draw_series(LineSeries::new([(x_lo, y), (x_hi, y)], grey))?;
            let (px, py) = chart.backend_coord(&(x_lo, y));
            let label = format!("{y}");
            bitmap_text(
                &root,
                &label,
                (px - 10 - 16 * label.len() as i32, py - 8),
                2,
                &BLACK,
            );
        }
        for x in log_ticks(x_lo, x_hi) {
            chart.draw_series(LineSeries::new([(x, y_lo), (x, y_hi)], grey))?;
            let (px, py) = chart.backend_coord(&(x, y_lo));
            let label = n_label(x);
            bitmap_text(
                &root,
                &label,
                (px - 8 * label.len() as i32, py + 8),
                2,
                &BLACK,
            );
        }
        chart.draw_series(LineSeries::new(
            [(x_lo, y_hi), (x_lo, y_lo), (x_hi, y_lo)],
            BLACK,
        ))?;
        for (i, (subject, points)) in data.iter().enumerate() {
            let is_floor = subject.starts_with("floor");
            let is_default = subject == DEFAULT_SUBJECT;
            let color = if is_floor {
                BLACK
            } else {
                COLORS[i % COLORS.len()]
            };
            let points: Vec<(f64, f64)> = points
                .iter()
                .copied()
                .filter(|(x, y)| positive(*x) && positive(*y))
                .collect();
            if is_floor {
                let dash = if subject.contains("streaming") { 12 } else { 4 };
                chart.draw_series(DashedLineSeries::new(
                    points.iter().copied(),
                    dash,
                    6,
                    color.stroke_width(2),
                ))?;
                chart.draw_series(
                    points
                        .iter()
                        .map(|p| Rectangle::new([*p, *p], color.stroke_width(8))),
                )?;
            } else {
                let stroke = if is_default { 7 } else { 2 };
                chart.draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(stroke),
                ))?;
                let radius = if is_default { 8 } else { 4 };
                chart.draw_series(
                    points
                        .iter()
                        .map(|p| Circle::new(*p, radius, color.filled())),
                )?;
                if is_default {
                    chart.draw_series(points.iter().map(|p| Circle::new(*p, radius, BLACK)))?;
                }
            }
            // One legend for both panels, three entries a row across the whole width.
            if panel > 0 {
                continue;
            }
            let legend_y = height as i32 - 80 + 22 * (i as i32 / 3);
            let legend_x = 20 + 390 * (i as i32 % 3);
            let swatch = if is_default { 14 } else { 6 };
            root.draw(&Rectangle::new(
                [
                    (legend_x, legend_y + 6 - swatch / 2),
                    (legend_x + 24, legend_y + 6 + swatch / 2),
                ],
                color.filled(),
            ))?;
            let label = if is_default {
                format!("{subject}, default")
            } else {
                subject.clone()
            };
            bitmap_text(&root, &label, (legend_x + 32, legend_y - 2), 2, &BLACK);
        }
        bitmap_text(&root, title, (x0 + 90, 14), 2, &BLACK);
        bitmap_text(
            &root,
            "N Pods (log)",
            (x0 + 230, height as i32 - 130),
            2,
            &BLACK,
        );
    }
    root.present()?;
    Ok(())
}

/// Draws `text` with the embedded 8×8 font, `scale` pixels per font pixel.
fn bitmap_text<DB: plotters::prelude::DrawingBackend>(
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    text: &str,
    (x, y): (i32, i32),
    scale: i32,
    color: &plotters::prelude::RGBColor,
) {
    use font8x8::UnicodeFonts;
    for (i, c) in text.chars().enumerate() {
        let Some(glyph) = font8x8::BASIC_FONTS.get(c) else {
            continue;
        };
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..8 {
                if bits & (1 << col) == 0 {
                    continue;
                }
                for dx in 0..scale {
                    for dy in 0..scale {
                        let _ = area.draw_pixel(
                            (
                                x + (i as i32 * 8 + col) * scale + dx,
                                y + row as i32 * scale + dy,
                            ),
                            color,
                        );
                    }
                }
            }
        }
    }
}
