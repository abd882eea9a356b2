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
//! pipeline's (server and subject) rather than the server's queue. Results go to a JSON
//! file and to `BENCHMARKS.md`.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use benches::{
    SyncedLine, UPDATE_LABEL, UpdatesLine, client_go_version, command_output, lock_version,
    machine, median, memory_of, unix_nanos, workqueue_report,
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
        default_value = "kube-informer,kube-informer-decoded,kube-informer-json-codec,kube-runtime,client-go"
    )]
    subjects: Vec<String>,
    /// kube-apiserver's `--watch-cache`.
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    watch_cache: bool,
    /// How long after sync to wait before reading steady RSS, ms.
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
    /// Write the report and chart from an earlier run's JSON instead of measuring.
    #[arg(long)]
    from_json: Option<PathBuf>,
    /// Concurrent requests when creating and updating Pods.
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
}

/// What the JSON file holds.
#[derive(Debug, Serialize, Deserialize)]
struct Results {
    command: String,
    results: Vec<RunResult>,
    /// The workqueue comparison; absent from results saved before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workqueue: Option<workqueue_report::WorkqueueResults>,
}

const NOTES_MARKER: &str = "<!-- notes -->";
const TIMEOUT: Duration = Duration::from_secs(600);

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
            });
        results.workqueue =
            Some(workqueue_report::measure(workqueue_runs, args.workqueue_ms).await?);
        return save_and_write_outputs(&args, &results);
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let binaries = subject_binaries()?;
    for subject in &args.subjects {
        if !binaries.contains_key(subject.as_str()) {
            bail!(
                "unknown subject {subject}; known: kube-informer, kube-informer-decoded, kube-informer-json-codec, \
                 kube-informer-json, kube-runtime, client-go, client-go-json"
            );
        }
    }
    // Before the control plane starts, so nothing else runs meanwhile.
    let workqueue = if workqueue_runs > 0 {
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
    let mut results = Vec::new();
    for &n in &args.pods {
        let namespace = env.create_namespace(&format!("bench-{n}")).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let started = Instant::now();
        create_pods(&pods, n, args.concurrency).await?;
        eprintln!(
            "created {n} Pods in {namespace} in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        for run in 0..args.runs {
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
                    &pods,
                    &namespace,
                    n,
                    run,
                )
                .await
                .with_context(|| format!("{subject}, {n} Pods, run {run}"))?;
                eprintln!("{}", serde_json::to_string(&result)?);
                results.push(result);
            }
        }
    }

    let results = Results {
        command,
        results,
        workqueue,
    };
    save_and_write_outputs(&args, &results)
}

/// Saves the raw results to `--json`, then writes the report and chart.
fn save_and_write_outputs(args: &Args, results: &Results) -> anyhow::Result<()> {
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(results)?)?;
    write_outputs(args, results)
}

/// Writes the markdown report (keeping its notes) and the chart.
fn write_outputs(args: &Args, results: &Results) -> anyhow::Result<()> {
    let json = args.from_json.as_ref().unwrap_or(&args.json);
    let mut report = report(args, json, &results.command, &results.results);
    if let Some(workqueue) = &results.workqueue {
        report = format!("{report}\n{}", workqueue_report::markdown(workqueue));
    }
    let notes = std::fs::read_to_string(&args.out)
        .ok()
        .and_then(|old| old.find(NOTES_MARKER).map(|i| old[i..].to_owned()))
        .unwrap_or_else(|| format!("{NOTES_MARKER}\n"));
    std::fs::write(&args.out, format!("{report}\n{notes}"))?;
    eprintln!("wrote {} and {}", args.out.display(), json.display());
    if !results.results.is_empty() {
        chart(&args.chart, &args.subjects, &results.results)
            .with_context(|| format!("drawing {}", args.chart.display()))?;
        eprintln!("wrote {}", args.chart.display());
    }
    Ok(())
}

/// The subjects' executables: the Rust ones beside this one, the Go one built now.
fn subject_binaries() -> anyhow::Result<HashMap<&'static str, PathBuf>> {
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
    let mut binaries = HashMap::new();
    binaries.insert("kube-informer", dir.join("subject-kube-informer"));
    binaries.insert("kube-runtime", dir.join("subject-kube-runtime"));
    binaries.insert("kube-informer-decoded", dir.join("subject-kube-informer"));
    binaries.insert(
        "kube-informer-json-codec",
        dir.join("subject-kube-informer"),
    );
    binaries.insert("kube-informer-json", dir.join("subject-kube-informer"));
    binaries.insert("client-go-json", go_binary.clone());
    binaries.insert("client-go", go_binary);
    for path in binaries.values() {
        if !path.is_file() {
            bail!("{} is missing; its build failed", path.display());
        }
    }
    Ok(binaries)
}

/// The options a subject runs with beyond the common ones. `kube-informer` runs the
/// library's defaults (a streaming list into a compact cache of the server's bytes);
/// `kube-informer-decoded` keeps decoded objects (the default before the compact one) and
/// `kube-informer-json-codec` compact JSON the store encodes (the compact cache before it
/// kept the server's bytes); `kube-informer-json` and `client-go-json` read JSON instead of
/// protobuf, which both prefer for built-in kinds (kube-runtime only reads JSON).
fn subject_options(subject: &str) -> &'static [&'static str] {
    match subject {
        "kube-informer-decoded" => &["--cache", "decoded"],
        "kube-informer-json-codec" => &["--cache", "json-codec"],
        "kube-informer-json" => &["--json"],
        "client-go-json" => &["-json"],
        _ => &[],
    }
}

/// The client-go tutorial's nginx Pod.
fn nginx_pod(name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {
                "app": "nginx-app",
                "type": "front-end",
                "language": "c",
                "business-service-type": "web",
            },
        },
        "spec": {
            "containers": [{
                "name": "nginx-container",
                "image": "nginx:latest",
                "resources": {
                    "limits": {"cpu": "500m", "memory": "128Mi"},
                    "requests": {"cpu": "100m", "memory": "64Mi"},
                },
            }],
        },
    })
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

async fn create_pods(pods: &Api<Pod>, n: usize, concurrency: usize) -> anyhow::Result<()> {
    let params = PatchParams::apply("informer-bench").force();
    futures::stream::iter(0..n)
        .map(|i| {
            let name = format!("nginx-{i:05}");
            let params = &params;
            async move {
                pods.patch(&name, params, &Patch::Apply(nginx_pod(&name)))
                    .await
                    .with_context(|| format!("applying Pod {name}"))
            }
        })
        .buffer_unordered(concurrency)
        .try_for_each(|_| async { Ok(()) })
        .await
}

#[allow(clippy::too_many_arguments)]
async fn run_subject(
    args: &Args,
    binary: &Path,
    subject: &str,
    kubeconfig: &Path,
    pods: &Api<Pod>,
    namespace: &str,
    n: usize,
    run: usize,
) -> anyhow::Result<RunResult> {
    let updates = args.updates.min(n);
    let paced_updates = args.paced_updates.min(n);
    let spawned = Instant::now();
    let mut child = tokio::process::Command::new(binary)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--namespace", namespace])
        .args(["--expect", &n.to_string()])
        .args(["--updates", &(updates + paced_updates).to_string()])
        .args(subject_options(subject))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let pid = child.id().context("the subject has a pid")?.to_string();
    let mut lines = BufReader::new(child.stdout.take().context("stdout is piped")?).lines();
    let mut next_line = async || -> anyhow::Result<String> {
        tokio::time::timeout(TIMEOUT, lines.next_line())
            .await
            .context("timed out waiting for the subject")??
            .context("the subject exited early")
    };
    let synced: SyncedLine = serde_json::from_str(&next_line().await?)?;
    let spawn_to_synced_ms = spawned.elapsed().as_secs_f64() * 1000.0;
    if synced.cached != n {
        bail!("{subject} cached {} Pods, expected {n}", synced.cached);
    }
    tokio::time::sleep(Duration::from_millis(args.settle_ms)).await;
    let (steady_rss_kb, peak_rss_kb) = memory_of(&pid);

    let id = |phase: &str, i: usize| format!("r{run}-{subject}-{phase}{i}");
    let first_sent = unix_nanos();
    let burst = burst_updates(pods, updates, args.concurrency, |i| id("", i)).await?;
    let paced = if paced_updates > 0 {
        // The burst's tail must not queue ahead of the paced updates.
        wait_for_idle_cpus().await;
        paced_updates_at(pods, paced_updates, args.paced_rate, |i| id("p", i)).await?
    } else {
        Vec::new()
    };
    let seen: Option<UpdatesLine> = if updates + paced_updates > 0 {
        Some(serde_json::from_str(&next_line().await?)?)
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
    drop(child.stdin.take());
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        child.kill().await?;
    }
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
    })
}

/// Sets the update label of the first `m` Pods to `id(i)` with `concurrency` requests in
/// flight, as fast as the API server takes them; returns each id with the Unix nanos of
/// its response.
async fn burst_updates(
    pods: &Api<Pod>,
    m: usize,
    concurrency: usize,
    id: impl Fn(usize) -> String,
) -> anyhow::Result<Vec<(String, i64)>> {
    futures::stream::iter(0..m)
        .map(|i| update_label(pods.clone(), i, id(i)))
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
        in_flight.spawn(update_label(pods.clone(), i, id(i)));
    }
    let mut responses = Vec::with_capacity(m);
    while let Some(response) = in_flight.join_next().await {
        responses.push(response??);
    }
    Ok(responses)
}

/// Sets Pod `nginx-<i>`'s update label to `id`; returns `id` and when the response came.
async fn update_label(pods: Api<Pod>, i: usize, id: String) -> anyhow::Result<(String, i64)> {
    let patch = serde_json::json!({"metadata": {"labels": {UPDATE_LABEL: id}}});
    pods.patch(
        &format!("nginx-{i:05}"),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await
    .with_context(|| format!("updating Pod nginx-{i:05}"))?;
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

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(args: &Args, json: &Path, command: &str, results: &[RunResult]) -> String {
    use std::fmt::Write;
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
         ratios are to client-go.\n",
        json.display(),
        results.iter().map(|r| r.run + 1).max().unwrap_or(0)
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
        "- subjects: kube-informer {} (kube-client {}), kube-runtime {} `watcher` + \
         `reflector`, client-go {} `SharedIndexInformer` ({}); {}",
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
         requests/limits), created by server-side apply so `managedFields` are populated; \
         no scheduler or kubelet runs, so they stay Pending\n"
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
        (!values.is_empty()).then(|| median(values))
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
    }
    out
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

/// Two panels, sync time and steady RSS against N, one line per subject. Text is drawn
/// with an embedded 8×8 bitmap font, so no system font is needed.
fn chart(path: &Path, subjects: &[String], results: &[RunResult]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    const COLORS: [RGBColor; 6] = [
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x8c, 0x56, 0x4b),
    ];
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let (width, height) = (1200u32, 550u32);
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    type Panel = (&'static str, fn(&RunResult) -> f64);
    let panels: [Panel; 2] = [
        ("sync time, ms (median)", |r| r.synced_ms),
        ("steady RSS, MiB (median)", |r| {
            r.steady_rss_kb as f64 / 1024.0
        }),
    ];
    let halves = root.split_evenly((1, 2));
    for (panel, ((title, metric), area)) in panels.into_iter().zip(&halves).enumerate() {
        let data = series(subjects, results, metric);
        let max_x = data
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(x, _)| *x))
            .fold(1.0, f64::max);
        let max_y = data
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
            .fold(1.0, f64::max);
        let mut chart = ChartBuilder::on(area)
            .margin_left(90)
            .margin_right(30)
            .margin_top(50)
            .margin_bottom(140)
            .build_cartesian_2d(0.0..max_x * 1.05, 0.0..max_y * 1.1)?;
        let x0 = panel as i32 * (width as i32 / 2);
        let grey = RGBColor(0xdd, 0xdd, 0xdd);
        for i in 0..=5 {
            let y = max_y * 1.1 * f64::from(i) / 5.0;
            chart.draw_series(LineSeries::new([(0.0, y), (max_x * 1.05, y)], grey))?;
            let (px, py) = chart.backend_coord(&(0.0, y));
            let label = if max_y >= 50.0 {
                format!("{y:.0}")
            } else {
                format!("{y:.1}")
            };
            bitmap_text(
                &root,
                &label,
                (px - 10 - 16 * label.len() as i32, py - 8),
                2,
                &BLACK,
            );
        }
        let mut ns: Vec<f64> = data
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(x, _)| *x))
            .collect();
        ns.sort_by(f64::total_cmp);
        ns.dedup();
        for n in ns {
            chart.draw_series(LineSeries::new([(n, 0.0), (n, max_y * 1.1)], grey))?;
            let (px, py) = chart.backend_coord(&(n, 0.0));
            let label = format!("{n:.0}");
            bitmap_text(
                &root,
                &label,
                (px - 8 * label.len() as i32, py + 8),
                2,
                &BLACK,
            );
        }
        chart.draw_series(LineSeries::new(
            [(0.0, max_y * 1.1), (0.0, 0.0), (max_x * 1.05, 0.0)],
            BLACK,
        ))?;
        for (i, (subject, points)) in data.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart.draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(3),
            ))?;
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 5, color.filled())))?;
            // One legend for both panels, three entries a row across the whole width.
            if panel > 0 {
                continue;
            }
            let legend_y = height as i32 - 50 + 20 * (i as i32 / 3);
            let legend_x = 20 + 400 * (i as i32 % 3);
            root.draw(&Rectangle::new(
                [(legend_x, legend_y), (legend_x + 24, legend_y + 12)],
                color.filled(),
            ))?;
            bitmap_text(&root, subject, (legend_x + 32, legend_y - 2), 2, &BLACK);
        }
        bitmap_text(&root, title, (x0 + 90, 14), 2, &BLACK);
        bitmap_text(&root, "N Pods", (x0 + 260, height as i32 - 80), 2, &BLACK);
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
