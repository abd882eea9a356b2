//! `restart-bench`: an informer's restart, warm (resumed from its snapshot) against cold (a
//! full list), beside client-go's cold start, in one run.
//!
//! It starts a local control plane with its defaults (the API server's watch cache on),
//! applies N Pods, then per run: starts kube-informer's subject with no snapshot (a cold
//! start, which writes the snapshot when it stops), changes some Pods while it is down for
//! `--down-seconds`, starts it again from the snapshot (warm), and again with an event
//! handler registered before the informer starts (as a controller's is; synced then means
//! the handler has had every initial add), one that reads each object and one that takes
//! keys. It then moves the API server's cache past the Pods' last change (a write
//! elsewhere and a consistent read) and starts it warm once more, starts it cold with each
//! handler, and starts client-go's subject (cold, as client-go always starts). Each subject reports the time from the start
//! of its `main` to synced; the driver reads the bytes its sockets received (the TLS stream
//! from the API server, from iproute2's `ss`) once it has synced.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use benches::{bytes_received, machine, median};
use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube_client::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use kube_testenv::TestEnv;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::{
    io::{AsyncBufReadExt, BufReader, Lines},
    process::{Child, ChildStdout, Command},
};
use tracing::info;

/// Times restarts, warm and cold, against client-go's cold start.
#[derive(Debug, Clone, Parser)]
#[command(name = "restart-bench")]
struct Args {
    /// Pod counts, one control plane each.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    pods: Vec<usize>,
    /// Runs of each subject per count.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// How long the informer is down between its cold and its warm start.
    #[arg(long, default_value_t = 10.0)]
    down_seconds: f64,
    /// Pods changed while it is down, per thousand.
    #[arg(long, default_value_t = 10)]
    changed_per_mille: usize,
    /// Concurrent applies while creating the Pods.
    #[arg(long, default_value_t = 64)]
    create_concurrency: usize,
    /// Where the per-start results go, as JSON.
    #[arg(long, default_value = "target/restart-bench.json")]
    json: PathBuf,
}

/// One start of one subject.
#[derive(Debug, Clone, Serialize)]
struct Start {
    pods: usize,
    run: usize,
    subject: &'static str,
    synced_ms: f64,
    objects: usize,
    read_mib: f64,
    /// kube-informer's full lists to sync (0: resumed); `None` for client-go.
    lists: Option<u64>,
    /// CPU time kube-apiserver used from the subject's start until it had synced.
    apiserver_cpu_ms: f64,
    /// The snapshot written when kube-informer's subject stopped.
    snapshot_mib: Option<f64>,
    stop_ms: Option<f64>,
    /// How a warm start's watch caught up: `version` or `bookmark`.
    caught_up_by: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SyncedLine {
    synced_ms: f64,
    #[serde(default)]
    objects: usize,
    #[serde(default)]
    cached: usize,
    lists: Option<u64>,
    #[serde(default)]
    caught_up_by: Option<String>,
}

#[derive(Debug, Deserialize)]
struct StoppedLine {
    stop_ms: f64,
    snapshot_bytes: u64,
}

/// A started subject: its process and its stdout's lines.
struct Subject {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Subject {
    fn start(mut command: Command) -> anyhow::Result<Self> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting a subject")?;
        let stdout = child.stdout.take().context("the subject's stdout")?;
        Ok(Self {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    async fn line(&mut self, what: &str) -> anyhow::Result<String> {
        match tokio::time::timeout(Duration::from_secs(600), self.lines.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => bail!("the subject exited before {what}"),
            Ok(Err(error)) => Err(error).context(what.to_owned()),
            Err(_) => bail!("no {what} within 10 minutes"),
        }
    }

    /// Closes stdin (the subjects stop then) and waits for the exit.
    async fn stop(mut self) -> anyhow::Result<Option<String>> {
        drop(self.child.stdin.take());
        let last = tokio::time::timeout(Duration::from_secs(120), self.lines.next_line())
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
        let _ = self.child.kill().await;
        Ok(last)
    }
}

fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::current_exe()?.with_file_name(name);
    if !path.exists() {
        bail!("{} is missing", path.display());
    }
    Ok(path)
}

/// Builds client-go's subject beside this executable.
fn build_go_subject() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let binary = exe.with_file_name("go-subject");
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("go-subject");
    let status = std::process::Command::new("go")
        .args(["build", "-trimpath", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(&module)
        .status()
        .context("running go build (is Go installed?)")?;
    if !status.success() {
        bail!("go build in {} failed: {status}", module.display());
    }
    Ok(binary)
}

/// Which run of which count a start belongs to.
#[derive(Clone, Copy)]
struct Slot {
    pods: usize,
    run: usize,
}

/// Starts `command` and waits until the subject has synced: the subject, its line, the
/// bytes it received, and the CPU time kube-apiserver spent meanwhile.
async fn start_synced(
    env: &TestEnv,
    command: Command,
) -> anyhow::Result<(Subject, SyncedLine, f64, f64)> {
    let server_cpu = apiserver_cpu(env)?;
    let mut subject = Subject::start(command)?;
    let synced: SyncedLine = serde_json::from_str(&subject.line("the synced line").await?)?;
    let server_cpu = apiserver_cpu(env)? - server_cpu;
    let pid = subject.child.id().context("the subject's pid")?;
    let read = bytes_received(pid)? as f64 / (1024.0 * 1024.0);
    Ok((subject, synced, read, server_cpu))
}

/// One start of kube-informer's subject, with `snapshot` kept.
async fn kube_informer(
    env: &TestEnv,
    namespace: &str,
    snapshot: &Path,
    slot: Slot,
    subject: &'static str,
) -> anyhow::Result<Start> {
    let mut command = Command::new(sibling("subject-restart")?);
    command
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .args(["--namespace", namespace])
        .arg("--snapshot")
        .arg(snapshot);
    if let Some(handler) = handler_of(subject) {
        command.args(["--handler", handler]);
    }
    let (started, synced, read, server_cpu) = start_synced(env, command).await?;
    let stopped = started
        .stop()
        .await?
        .context("the subject's stopped line")?;
    let stopped: StoppedLine = serde_json::from_str(&stopped)?;
    Ok(Start {
        pods: slot.pods,
        run: slot.run,
        subject,
        apiserver_cpu_ms: server_cpu,
        synced_ms: synced.synced_ms,
        objects: synced.objects,
        read_mib: read,
        lists: synced.lists,
        snapshot_mib: Some(stopped.snapshot_bytes as f64 / (1024.0 * 1024.0)),
        stop_ms: Some(stopped.stop_ms),
        caught_up_by: synced.caught_up_by,
    })
}

/// The starts, in the report's order, each with the cold start it is compared with. A
/// handler is registered before the informer starts, as a controller's is; those starts
/// are synced once it has every initial add.
const SUBJECTS: [(&str, &str); 8] = [
    ("kube-informer warm", "kube-informer cold"),
    ("kube-informer warm, the cache ahead", "kube-informer cold"),
    ("kube-informer cold", "kube-informer cold"),
    (
        "kube-informer warm, with an object handler",
        "kube-informer cold, with an object handler",
    ),
    (
        "kube-informer cold, with an object handler",
        "kube-informer cold, with an object handler",
    ),
    (
        "kube-informer warm, with a key handler",
        "kube-informer cold, with a key handler",
    ),
    (
        "kube-informer cold, with a key handler",
        "kube-informer cold, with a key handler",
    ),
    ("client-go cold", "kube-informer cold"),
];

/// The subject's `--handler` for a start: one that reads each object, or one that takes
/// keys (as a controller's primary source does).
fn handler_of(subject: &str) -> Option<&'static str> {
    if subject.ends_with("an object handler") {
        Some("objects")
    } else if subject.ends_with("a key handler") {
        Some("keys")
    } else {
        None
    }
}

/// kube-apiserver's CPU time so far, ms.
fn apiserver_cpu(env: &TestEnv) -> anyhow::Result<f64> {
    let pid = env.apiserver_pid().context("kube-apiserver's pid")?;
    benches::cpu_ms_of(pid).context("kube-apiserver's CPU time")
}

/// One cold start of client-go's subject.
async fn client_go(go: &Path, env: &TestEnv, namespace: &str, slot: Slot) -> anyhow::Result<Start> {
    let mut command = Command::new(go);
    command.arg("-kubeconfig").arg(env.kubeconfig_path()).args([
        "-namespace",
        namespace,
        "-expect",
        &slot.pods.to_string(),
    ]);
    let (started, synced, read, server_cpu) = start_synced(env, command).await?;
    started.stop().await?;
    Ok(Start {
        pods: slot.pods,
        run: slot.run,
        subject: "client-go cold",
        apiserver_cpu_ms: server_cpu,
        synced_ms: synced.synced_ms,
        objects: synced.cached,
        read_mib: read,
        lists: None,
        snapshot_mib: None,
        stop_ms: None,
        caught_up_by: None,
    })
}

/// Moves the API server's cache of Pods past their last change: a ConfigMap written, then
/// a consistent read of the Pods (which waits for the cache to reach etcd's version).
async fn advance_cache(
    client: &kube_client::Client,
    pods: &Api<Pod>,
    namespace: &str,
    run: usize,
) -> anyhow::Result<()> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let marker = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": format!("restart-bench-{run}") },
    });
    config_maps
        .patch(
            &format!("restart-bench-{run}"),
            &PatchParams::apply("restart-bench"),
            &Patch::Apply(&marker),
        )
        .await
        .context("writing a ConfigMap")?;
    pods.list_metadata(&ListParams::default().limit(1))
        .await
        .context("a consistent read of the Pods")?;
    Ok(())
}

/// Changes `count` Pods (a label), as a cluster does while a controller restarts.
async fn change_pods(pods: &Api<Pod>, n: usize, count: usize, run: usize) -> anyhow::Result<()> {
    use futures::{StreamExt, TryStreamExt};
    let step = (n / count.max(1)).max(1);
    futures::stream::iter((0..n).step_by(step).take(count))
        .map(|i| {
            let patch = json!({ "metadata": { "labels": { "bench-restart": run.to_string() } } });
            async move {
                pods.patch(
                    &benches::pod_name(i),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            }
        })
        .buffer_unordered(32)
        .try_for_each(|_| async { Ok(()) })
        .await
        .context("changing Pods while the subject is down")
}

async fn run_count(args: &Args, go: &Path, pods: usize) -> anyhow::Result<Vec<Start>> {
    let env = TestEnv::builder().start().await?;
    let client = env.client().await?;
    let namespace = env.create_namespace("restart").await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    info!(pods, "creating the Pods");
    benches::create_pods(&api, pods, args.create_concurrency, "restart-bench").await?;
    let dir = tempfile::tempdir()?;
    let snapshot = dir.path().join("pods.snapshot");
    let mut starts = Vec::new();
    for run in 0..args.runs {
        let slot = Slot { pods, run };
        // Cold: no snapshot yet; it writes one when it stops.
        let _ = std::fs::remove_file(&snapshot);
        starts.push(kube_informer(&env, &namespace, &snapshot, slot, SUBJECTS[2].0).await?);
        let down = Instant::now();
        change_pods(&api, pods, pods * args.changed_per_mille / 1000, run).await?;
        tokio::time::sleep(
            Duration::from_secs_f64(args.down_seconds).saturating_sub(down.elapsed()),
        )
        .await;
        // Both warm starts resume from the cold start's snapshot, with the same changes
        // to replay.
        let after_cold = dir.path().join("after-cold.snapshot");
        std::fs::copy(&snapshot, &after_cold)?;
        // Every warm start resumes from the cold start's snapshot, with the same changes to
        // replay; they run before anything reads the Pods consistently, so the Pods' own
        // changes are the last the API server's cache has seen of them.
        for (subject, _) in [SUBJECTS[0], SUBJECTS[3], SUBJECTS[5]] {
            std::fs::copy(&after_cold, &snapshot)?;
            starts.push(kube_informer(&env, &namespace, &snapshot, slot, subject).await?);
        }
        // The cache ahead of the Pods' last change, as on a cluster where other objects
        // change: a write elsewhere, then a consistent read of the Pods, which brings the
        // cache up to date with etcd. Only a bookmark tells the resumed watch it is there.
        advance_cache(&client, &api, &namespace, run).await?;
        std::fs::copy(&after_cold, &snapshot)?;
        starts.push(kube_informer(&env, &namespace, &snapshot, slot, SUBJECTS[1].0).await?);
        for (subject, _) in [SUBJECTS[4], SUBJECTS[6]] {
            std::fs::remove_file(&snapshot)?;
            starts.push(kube_informer(&env, &namespace, &snapshot, slot, subject).await?);
        }
        starts.push(client_go(go, &env, &namespace, slot).await?);
        info!(pods, run, "run done");
    }
    Ok(starts)
}

fn report(args: &Args, starts: &[Start]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "`restart-bench --pods {} --runs {} --down-seconds {} --changed-per-mille {}` on {}; medians over runs.\n",
        args.pods
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        args.runs,
        args.down_seconds,
        args.changed_per_mille,
        machine()
    );
    let _ = writeln!(
        out,
        "| Pods | start | restart to synced (ms) | received (MiB) | time / cold | received / cold | time / client-go | API server CPU (ms) | full lists | caught up at a bookmark | snapshot (MiB) | writing it at stop (ms) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &pods in &args.pods {
        let of = |subject: &str, f: fn(&Start) -> f64| {
            median(
                starts
                    .iter()
                    .filter(|s| s.pods == pods && s.subject == subject)
                    .map(f)
                    .collect(),
            )
        };
        let go_ms = of("client-go cold", |s| s.synced_ms);
        for (subject, cold) in SUBJECTS {
            let cold_ms = of(cold, |s| s.synced_ms);
            let cold_read = of(cold, |s| s.read_mib);
            let ms = of(subject, |s| s.synced_ms);
            let read = of(subject, |s| s.read_mib);
            let kube = subject.starts_with("kube-informer");
            // client-go's list may come over a connection it has closed by the time it
            // reports synced, which `ss` no longer shows: its bytes are not comparable.
            let received = if kube {
                format!("{read:.2}")
            } else {
                "–".to_owned()
            };
            let received_ratio = if kube {
                format!("{:.3}", read / cold_read)
            } else {
                "–".to_owned()
            };
            let optional = |value: f64, digits: usize| {
                if kube {
                    format!("{value:.digits$}")
                } else {
                    "–".to_owned()
                }
            };
            // Warm starts whose watch waited for its first bookmark, of all of them.
            let warm: Vec<&Start> = starts
                .iter()
                .filter(|s| s.pods == pods && s.subject == subject && s.caught_up_by.is_some())
                .collect();
            let at_bookmark = match warm.len() {
                0 => "–".to_owned(),
                n => {
                    let waited = warm
                        .iter()
                        .filter(|s| s.caught_up_by.as_deref() == Some("bookmark"))
                        .count();
                    format!("{waited} of {n}")
                }
            };
            let _ = writeln!(
                out,
                "| {pods} | {subject} | {ms:.0} | {received} | {:.2} | {received_ratio} | {:.2} | {:.0} | {} | {at_bookmark} | {} | {} |",
                ms / cold_ms,
                ms / go_ms,
                of(subject, |s| s.apiserver_cpu_ms),
                optional(of(subject, |s| s.lists.unwrap_or(0) as f64), 0),
                optional(of(subject, |s| s.snapshot_mib.unwrap_or(0.0)), 1),
                optional(of(subject, |s| s.stop_ms.unwrap_or(0.0)), 0),
            );
        }
    }
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    benches::init_tracing("info");
    let args = Args::parse();
    benches::build_rust_subjects(&["subject-restart"])?;
    let go = build_go_subject()?;
    let mut starts = Vec::new();
    for &pods in &args.pods {
        starts.extend(run_count(&args, &go, pods).await?);
        if let Some(dir) = args.json.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&args.json, serde_json::to_vec_pretty(&starts)?)?;
    }
    print!("{}", report(&args, &starts));
    Ok(())
}
