//! `recovery-bench`: how long kube-informer's and client-go's informers take to recover
//! from real network faults, side by side in one run.
//!
//! It starts one local control plane and two Toxiproxies in front of its API server, one
//! per subject, so a fault on one subject's path never slows the other's. Each scenario
//! starts both subjects (`subject-recovery`, kube-informer's `SharedInformer` with its
//! defaults, and `go-subject/recovery`, a client-go `SharedInformerFactory` informer with
//! its defaults) as separate processes at the same time, each with a kubeconfig that
//! points at its own proxy. Once both have synced, both proxies get the same fault, three
//! changes are made directly (one ConfigMap's label updated, one deleted, one created),
//! and the fault is lifted; the time to recover runs from the lift to the moment the
//! subject's handler has seen all three changes. The subjects print every event their
//! handler sees, so the driver also checks that each change arrived once and that no
//! object that did not change got an event. Results go to a JSON file and to the section
//! "Recovery under network faults" of `BENCHMARKS.md`.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use benches::{
    client_go_version, command_output, lock_version, machine, median,
    recovery::{EventLine, RecoveryLine},
    unix_nanos,
};
use clap::{Parser, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use kube_testenv::{FaultProxy, TestEnv};
use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Child,
    sync::watch,
};
use tracing::{info, warn};

/// Measures how long kube-informer and client-go informers take to recover from real
/// network faults (Toxiproxy), both at once, each through its own proxy.
#[derive(Debug, Clone, Parser)]
#[command(name = "recovery-bench")]
struct Args {
    /// Runs of every scenario.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Scenarios to run, comma-separated, in this order within each run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "reset,stall,cut-20s,cut-compacted,slow-list"
    )]
    scenarios: Vec<Scenario>,
    /// ConfigMaps in the namespace of each fault scenario.
    #[arg(long, default_value_t = 20)]
    objects: usize,
    /// ConfigMaps of the slow-list scenario (created once, before its first run).
    #[arg(long, default_value_t = 10_000)]
    slow_list_objects: usize,
    /// Latency the slow-list proxies add to every response, ms.
    #[arg(long, default_value_t = 100)]
    slow_list_latency_ms: u64,
    /// Bandwidth of the slow-list proxies, KB (1000 bytes) per second per connection.
    #[arg(long, default_value_t = 1000)]
    slow_list_bandwidth: u64,
    /// How long every connection is reset in the reset scenario before the toxic is
    /// lifted, s.
    #[arg(long, default_value_t = 5)]
    reset_s: u64,
    /// How long the API server is unreachable in the cut-20s scenario, s.
    #[arg(long, default_value_t = 20)]
    cut_s: u64,
    /// In cut-compacted, restart kube-apiserver while it is cut off, so that its watch
    /// cache starts past the informers' resourceVersion as etcd does after compaction
    /// (without it the watch cache still serves the old resourceVersion).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    compacted_restart: bool,
    /// Give up on a subject this long after the fault was lifted (for the stall: after
    /// the changes), s.
    #[arg(long, default_value_t = 400)]
    ceiling_s: u64,
    /// After both subjects recovered, keep reading their events this long, so late
    /// duplicate or spurious events are counted, ms.
    #[arg(long, default_value_t = 2000)]
    settle_ms: u64,
    /// How long a subject may take to sync, s.
    #[arg(long, default_value_t = 300)]
    sync_timeout_s: u64,
    /// Concurrent requests when creating the slow-list ConfigMaps.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// The markdown report; its section "Recovery under network faults" is replaced
    /// (or appended), everything else is kept byte for byte.
    #[arg(long, default_value = "BENCHMARKS.md")]
    out: PathBuf,
    /// The directory of the raw results (`results.json`), kubeconfigs and subject logs.
    #[arg(long, default_value = "target/recovery-bench")]
    dir: PathBuf,
    /// Write the report from an earlier run's `results.json` instead of measuring.
    #[arg(long)]
    from_json: Option<PathBuf>,
}

/// A fault and how it is lifted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Scenario {
    /// Every connection reset, the changes made, `--reset-s` later the toxic lifted.
    Reset,
    /// Every connection stalled (nothing passes, nothing closes); the changes made; the
    /// stall lifted for a subject once it has closed every connection it had when the
    /// stall began, i.e. once it noticed they were dead.
    Stall,
    /// The API server unreachable (connections closed and refused) for `--cut-s`.
    #[value(name = "cut-20s")]
    #[serde(rename = "cut-20s")]
    Cut20s,
    /// The API server unreachable while etcd is compacted past the informers'
    /// resourceVersion, so they must relist on return.
    CutCompacted,
    /// 10,000 ConfigMaps through proxies with latency and limited bandwidth from the
    /// start: time to synced, then the changes' delivery time.
    SlowList,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Reset => "reset",
            Scenario::Stall => "stall",
            Scenario::Cut20s => "cut-20s",
            Scenario::CutCompacted => "cut-compacted",
            Scenario::SlowList => "slow-list",
        }
    }
}

/// The two subjects, in the order they are reported.
const SUBJECTS: [SubjectKind; 2] = [SubjectKind::KubeInformer, SubjectKind::ClientGo];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SubjectKind {
    KubeInformer,
    ClientGo,
}

impl SubjectKind {
    fn name(self) -> &'static str {
        match self {
            SubjectKind::KubeInformer => "kube-informer",
            SubjectKind::ClientGo => "client-go",
        }
    }
}

/// The Rust subject's binary, built beside this one.
const RUST_BINARY: &str = "subject-recovery";
/// The Go subject's binary, built beside this one from `go-subject/recovery`.
const GO_BINARY: &str = "go-subject-recovery";
/// The label the update changes.
const CHANGE_LABEL: &str = "recovery-bench";
/// The section of `BENCHMARKS.md` this benchmark owns.
const SECTION: &str = "## Recovery under network faults";

/// What the three changes of a scenario were.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Changes {
    updated: String,
    updated_version: String,
    deleted: String,
    created: String,
    created_version: String,
    /// When the first change was sent and the last one answered, Unix ns.
    sent_ns: i64,
    done_ns: i64,
}

/// How one subject did in one run of one scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SubjectRun {
    subject: String,
    /// Reported by the subject: start of `main` to synced.
    synced_ms: f64,
    /// Measured by the driver: spawn to the synced line.
    spawn_to_synced_ms: f64,
    /// Objects cached when synced.
    cached: usize,
    /// From the fault's lift (stall: the changes' last response; slow-list: the same, no
    /// fault) to the last of the three changes reaching the handler; `None` if not all
    /// of them arrived within the ceiling.
    recovery_ms: Option<f64>,
    /// Stall only: from the changes to the moment the subject had closed every connection
    /// it had when the stall began (when its proxy's stall was lifted); `None` if it never
    /// did within the ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    noticed_ms: Option<f64>,
    /// Stall only: how many connections the subject had opened since (and which the
    /// stall had stalled too) when the lift closed them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lift_closed: Option<usize>,
    update_seen: bool,
    delete_seen: bool,
    add_seen: bool,
    /// Whether the delete came as a tombstone (noticed by a relist).
    tombstone: bool,
    /// Events after the fault began other than the first sighting of each change: events
    /// of objects that did not change, and repeats.
    extra_events: Vec<EventLine>,
    /// Watch errors the subject reported after the fault began.
    watch_errors: usize,
    /// Whether one of them was a 410 Gone.
    gone: bool,
    /// Every event after the fault began, as the subject printed it.
    events: Vec<EventLine>,
    /// Every watch error after the fault began.
    errors: Vec<String>,
}

/// One run of one scenario, both subjects.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ScenarioRun {
    scenario: Scenario,
    run: usize,
    /// The moment recovery is timed from, Unix ns.
    from_ns: i64,
    changes: Changes,
    subjects: Vec<SubjectRun>,
}

/// What `results.json` holds.
#[derive(Debug, Serialize, Deserialize)]
struct Results {
    command: String,
    machine: String,
    versions: String,
    settings: Settings,
    runs: Vec<ScenarioRun>,
}

/// The options the report describes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Settings {
    runs: usize,
    objects: usize,
    slow_list_objects: usize,
    slow_list_latency_ms: u64,
    slow_list_bandwidth: u64,
    reset_s: u64,
    cut_s: u64,
    compacted_restart: bool,
    ceiling_s: u64,
    settle_ms: u64,
}

impl From<&Args> for Settings {
    fn from(a: &Args) -> Self {
        Self {
            runs: a.runs,
            objects: a.objects,
            slow_list_objects: a.slow_list_objects,
            slow_list_latency_ms: a.slow_list_latency_ms,
            slow_list_bandwidth: a.slow_list_bandwidth,
            reset_s: a.reset_s,
            cut_s: a.cut_s,
            compacted_restart: a.compacted_restart,
            ceiling_s: a.ceiling_s,
            settle_ms: a.settle_ms,
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    benches::init_tracing("info,kube_client=off");
    let args = Args::parse();
    if let Some(path) = &args.from_json {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let results: Results = serde_json::from_str(&text)
            .with_context(|| format!("parsing results from {}", path.display()))?;
        return write_report(&args.out, path, &results);
    }
    if args.runs == 0 || args.scenarios.is_empty() {
        bail!("nothing to run: --runs and --scenarios must not be empty");
    }
    if args.objects < 4 {
        bail!("--objects must be at least 4 (two change, the rest must not)");
    }
    if args.scenarios.contains(&Scenario::SlowList) && args.slow_list_objects < 3 * args.runs + 1 {
        bail!(
            "--slow-list-objects must be at least {} for {} runs",
            3 * args.runs + 1,
            args.runs
        );
    }
    std::fs::create_dir_all(args.dir.join("logs"))
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let binaries = build_subjects()?;

    info!("starting the control plane");
    let env = TestEnv::builder()
        .start()
        .await
        .context("starting the control plane")?;
    let client = env.client().await?;
    let mut proxies = Vec::new();
    for kind in SUBJECTS {
        let proxy = FaultProxy::for_apiserver(&env)
            .await
            .with_context(|| format!("starting the fault proxy of {}", kind.name()))?;
        let kubeconfig = std::path::absolute(args.dir.join(format!("kubeconfig-{}", kind.name())))?;
        env.kubeconfig_via(&proxy, &kubeconfig)
            .with_context(|| format!("writing {}", kubeconfig.display()))?;
        proxies.push(Route {
            kind,
            proxy,
            kubeconfig,
        });
    }

    // As it is run from the repository; the executable's own path says nothing.
    let cargo_run = if cfg!(debug_assertions) {
        "cargo run -p benches --bin recovery-bench --"
    } else {
        "cargo run --release -p benches --bin recovery-bench --"
    };
    let command = std::iter::once(cargo_run.to_owned())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    let mut results = Results {
        command,
        machine: machine(),
        versions: versions(),
        settings: Settings::from(&args),
        runs: Vec::new(),
    };
    let json = args.dir.join("results.json");
    let mut slow_list_namespace: Option<String> = None;
    let total = args.runs * args.scenarios.len();
    for run in 0..args.runs {
        for &scenario in &args.scenarios {
            info!(
                scenario = scenario.name(),
                run = run + 1,
                of = args.runs,
                done = results.runs.len(),
                total,
                "scenario starts"
            );
            let namespace = match (scenario, &slow_list_namespace) {
                (Scenario::SlowList, Some(ns)) => ns.clone(),
                (Scenario::SlowList, None) => {
                    let ns = env.create_namespace("slow-list").await?;
                    let started = Instant::now();
                    create_config_maps(
                        &Api::namespaced(client.clone(), &ns),
                        args.slow_list_objects,
                        args.concurrency,
                    )
                    .await?;
                    info!(
                        objects = args.slow_list_objects,
                        namespace = %ns,
                        elapsed_s = started.elapsed().as_secs_f64(),
                        "slow-list ConfigMaps created"
                    );
                    slow_list_namespace = Some(ns.clone());
                    ns
                }
                _ => {
                    let ns = env.create_namespace(scenario.name()).await?;
                    create_config_maps(&Api::namespaced(client.clone(), &ns), args.objects, 8)
                        .await?;
                    ns
                }
            };
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
            let outcome = run_scenario(
                &args, &env, &api, &proxies, &binaries, scenario, run, &namespace,
            )
            .await;
            for path in &proxies {
                path.proxy
                    .reset()
                    .await
                    .context("resetting a fault proxy after the scenario")?;
                // Toxiproxy's log so far, beside the subjects' logs (its own goes with it).
                let copy = args
                    .dir
                    .join("logs")
                    .join(format!("toxiproxy-{}.log", path.kind.name()));
                if let Err(error) = std::fs::copy(path.proxy.log_path(), &copy) {
                    warn!(%error, copy = %copy.display(), "cannot copy Toxiproxy's log");
                }
            }
            if !env.apiserver_running() {
                env.start_apiserver().await?;
            }
            let outcome = outcome
                .with_context(|| format!("scenario {}, run {}", scenario.name(), run + 1))?;
            for s in &outcome.subjects {
                info!(
                    scenario = scenario.name(),
                    run = run + 1,
                    subject = %s.subject,
                    recovery_ms = ?s.recovery_ms,
                    noticed_ms = ?s.noticed_ms,
                    synced_ms = s.synced_ms,
                    extra_events = s.extra_events.len(),
                    gone = s.gone,
                    "result"
                );
            }
            results.runs.push(outcome);
            // Saved after every scenario, so a long run that breaks keeps what it measured.
            std::fs::write(&json, serde_json::to_string_pretty(&results)?)
                .with_context(|| format!("writing {}", json.display()))?;
        }
    }
    write_report(&args.out, &json, &results)
}

/// One subject's path to the API server: its own proxy and a kubeconfig through it.
struct Route {
    kind: SubjectKind,
    proxy: FaultProxy,
    kubeconfig: PathBuf,
}

/// The two subjects' binaries.
struct Binaries {
    rust: PathBuf,
    go: PathBuf,
}

impl Binaries {
    fn of(&self, kind: SubjectKind) -> &std::path::Path {
        match kind {
            SubjectKind::KubeInformer => &self.rust,
            SubjectKind::ClientGo => &self.go,
        }
    }
}

/// Builds the Rust subject with this executable's profile and the Go one with `go build`,
/// both beside this executable.
fn build_subjects() -> anyhow::Result<Binaries> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("the executable has a directory")?;
    benches::build_rust_subjects(&[RUST_BINARY])?;
    let go_module = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("go-subject");
    let go = dir.join(GO_BINARY);
    info!(module = %go_module.display(), "building the client-go subject");
    let status = std::process::Command::new("go")
        .args(["build", "-trimpath", "-o"])
        .arg(&go)
        .arg("./recovery")
        .current_dir(&go_module)
        .status()
        .context("running go build (is Go installed?)")?;
    if !status.success() {
        bail!(
            "go build of ./recovery in {} failed: {status}",
            go_module.display()
        );
    }
    let binaries = Binaries {
        rust: dir.join(RUST_BINARY),
        go,
    };
    for path in [&binaries.rust, &binaries.go] {
        if !path.is_file() {
            bail!("{} is missing; its build failed", path.display());
        }
    }
    Ok(binaries)
}

/// The versions the report names.
fn versions() -> String {
    format!(
        "kube-informer {} (kube-client {}, defaults), client-go {} \
         `SharedInformerFactory` (defaults, {}); {}; Toxiproxy v2.5.0",
        lock_version("kube-informer"),
        lock_version("kube-client"),
        client_go_version(),
        command_output("go", &["env", "GOVERSION"]),
        command_output("rustc", &["--version"]),
    )
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { CHANGE_LABEL: "initial" } },
        "data": { "v": "1" },
    }))
    .expect("a valid ConfigMap")
}

/// The name of the `i`th ConfigMap of a namespace.
fn object_name(i: usize) -> String {
    format!("cm-{i:05}")
}

/// Creates ConfigMaps `cm-00000`... with `concurrency` requests in flight.
async fn create_config_maps(
    api: &Api<ConfigMap>,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    let params = PostParams::default();
    futures::stream::iter(0..n)
        .map(|i| {
            let name = object_name(i);
            let params = &params;
            async move {
                api.create(params, &config_map(&name))
                    .await
                    .with_context(|| format!("creating ConfigMap {name}"))
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_for_each(|_| async { Ok(()) })
        .await
}

/// Updates the label of `cm-{3 slot}`, deletes `cm-{3 slot + 1}` and creates
/// `new-r{run}`, one after the other.
async fn make_changes(api: &Api<ConfigMap>, slot: usize, run: usize) -> anyhow::Result<Changes> {
    let updated = object_name(3 * slot);
    let deleted = object_name(3 * slot + 1);
    let created = format!("new-r{run}");
    let sent_ns = unix_nanos();
    let patch = serde_json::json!({ "metadata": { "labels": { CHANGE_LABEL: format!("changed-r{run}") } } });
    let after = api
        .patch(&updated, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("updating {updated}"))?;
    api.delete(&deleted, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting {deleted}"))?;
    let new = api
        .create(&PostParams::default(), &config_map(&created))
        .await
        .with_context(|| format!("creating {created}"))?;
    let done_ns = unix_nanos();
    let version = |o: &ConfigMap| o.metadata.resource_version.clone().unwrap_or_default();
    Ok(Changes {
        updated_version: version(&after),
        updated,
        deleted,
        created_version: version(&new),
        created,
        sent_ns,
        done_ns,
    })
}

/// What a subject has printed so far.
#[derive(Debug, Default, Clone)]
struct Printed {
    synced: Option<Synced>,
    events: Vec<EventLine>,
    /// `(gone, message, at_ns)`.
    errors: Vec<(bool, String, i64)>,
    /// The subject's stdout has ended (it exited).
    ended: bool,
}

#[derive(Debug, Clone)]
struct Synced {
    synced_ms: f64,
    spawn_to_synced_ms: f64,
    cached: usize,
}

/// A running subject process and what it printed.
struct Subject {
    kind: SubjectKind,
    child: Child,
    pid: u32,
    printed: watch::Receiver<Printed>,
}

impl Subject {
    async fn spawn(
        kind: SubjectKind,
        binary: &std::path::Path,
        kubeconfig: &std::path::Path,
        namespace: &str,
        log: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let stderr = std::fs::File::create(log)
            .with_context(|| format!("creating the subject log {}", log.display()))?;
        let spawned = Instant::now();
        let mut child = tokio::process::Command::new(binary)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", namespace])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let pid = child.id().context("the subject has a pid")?;
        let stdout = child.stdout.take().context("stdout is piped")?;
        let (tx, printed) = watch::channel(Printed::default());
        let name = kind.name();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<RecoveryLine>(&line) {
                    Ok(RecoveryLine::Synced {
                        synced_ms, cached, ..
                    }) => {
                        let spawn_to_synced_ms = spawned.elapsed().as_secs_f64() * 1000.0;
                        tx.send_modify(|p| {
                            p.synced = Some(Synced {
                                synced_ms,
                                spawn_to_synced_ms,
                                cached,
                            })
                        });
                    }
                    Ok(RecoveryLine::Event(event)) => tx.send_modify(|p| p.events.push(event)),
                    Ok(RecoveryLine::WatchError {
                        gone,
                        message,
                        at_ns,
                    }) => tx.send_modify(|p| p.errors.push((gone, message, at_ns))),
                    Err(error) => warn!(subject = name, %line, %error, "unreadable subject line"),
                }
            }
            tx.send_modify(|p| p.ended = true);
        });
        Ok(Self {
            kind,
            child,
            pid,
            printed,
        })
    }

    /// Waits until `condition` holds of what the subject printed, until `deadline`;
    /// returns whether it held. Fails if the subject exits first.
    async fn wait_until(
        &mut self,
        deadline: tokio::time::Instant,
        mut condition: impl FnMut(&Printed) -> bool,
    ) -> anyhow::Result<bool> {
        let name = self.kind.name();
        let waited =
            tokio::time::timeout_at(deadline, self.printed.wait_for(|p| p.ended || condition(p)))
                .await;
        match waited {
            Err(_) => Ok(false),
            Ok(Err(_)) => bail!("{name}'s output reader stopped"),
            Ok(Ok(printed)) if condition(&printed) => Ok(true),
            Ok(Ok(_)) => bail!("{name} exited; see its log"),
        }
    }

    fn printed(&self) -> Printed {
        self.printed.borrow().clone()
    }

    /// Closes stdin (the subject's signal to stop), then kills it if it lingers.
    async fn stop(mut self) {
        drop(self.child.stdin.take());
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// The socket inodes of `pid`'s TCP connections to `port` on loopback, from
/// `/proc/<pid>/fd` and `/proc/<pid>/net/tcp{,6}`.
fn connections_to(pid: u32, port: u16) -> anyhow::Result<BTreeSet<u64>> {
    let fd_dir = format!("/proc/{pid}/fd");
    let mut inodes = BTreeSet::new();
    for entry in std::fs::read_dir(&fd_dir).with_context(|| format!("reading {fd_dir}"))? {
        let Ok(entry) = entry else { continue };
        if let Ok(target) = std::fs::read_link(entry.path())
            && let Some(inode) = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok())
        {
            inodes.insert(inode);
        }
    }
    let mut to_port = BTreeSet::new();
    for table in ["tcp", "tcp6"] {
        let path = format!("/proc/{pid}/net/{table}");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(inode)) = (fields.get(2), fields.get(9)) else {
                continue;
            };
            let remote_port = remote
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if remote_port == Some(port)
                && let Ok(inode) = inode.parse::<u64>()
                && inodes.contains(&inode)
            {
                to_port.insert(inode);
            }
        }
    }
    Ok(to_port)
}

/// Which of the expected changes a subject's events show, and what else they show.
struct Verdict {
    update: Option<i64>,
    delete: Option<(i64, bool)>,
    add: Option<i64>,
    extra: Vec<EventLine>,
}

impl Verdict {
    fn of(events: &[EventLine], changes: &Changes) -> Self {
        let mut verdict = Verdict {
            update: None,
            delete: None,
            add: None,
            extra: Vec::new(),
        };
        for e in events {
            let first = match e.kind.as_str() {
                "update"
                    if verdict.update.is_none()
                        && e.name == changes.updated
                        && e.resource_version == changes.updated_version =>
                {
                    verdict.update = Some(e.at_ns);
                    true
                }
                "delete" if verdict.delete.is_none() && e.name == changes.deleted => {
                    verdict.delete = Some((e.at_ns, e.tombstone));
                    true
                }
                "add"
                    if verdict.add.is_none()
                        && e.name == changes.created
                        && e.resource_version == changes.created_version =>
                {
                    verdict.add = Some(e.at_ns);
                    true
                }
                _ => false,
            };
            if !first {
                verdict.extra.push(e.clone());
            }
        }
        verdict
    }

    /// When the last of the three changes arrived, if all did.
    fn complete_at(&self) -> Option<i64> {
        Some(self.update?.max(self.delete?.0).max(self.add?))
    }
}

/// Runs one scenario once with both subjects.
#[allow(clippy::too_many_arguments)]
async fn run_scenario(
    args: &Args,
    env: &TestEnv,
    api: &Api<ConfigMap>,
    paths: &[Route],
    binaries: &Binaries,
    scenario: Scenario,
    run: usize,
    namespace: &str,
) -> anyhow::Result<ScenarioRun> {
    if scenario == Scenario::SlowList {
        for path in paths {
            path.proxy
                .latency(
                    Duration::from_millis(args.slow_list_latency_ms),
                    Duration::ZERO,
                )
                .await?;
            path.proxy.bandwidth(args.slow_list_bandwidth).await?;
        }
    }
    // Each run deletes one object and creates one, so the count stays.
    let expected = if scenario == Scenario::SlowList {
        args.slow_list_objects
    } else {
        args.objects
    };
    // Both subjects start together, each through its own proxy.
    let mut subjects = Vec::new();
    for path in paths {
        let log = args.dir.join("logs").join(format!(
            "{}-r{}-{}.log",
            scenario.name(),
            run + 1,
            path.kind.name()
        ));
        subjects.push(
            Subject::spawn(
                path.kind,
                binaries.of(path.kind),
                &path.kubeconfig,
                namespace,
                &log,
            )
            .await?,
        );
    }
    let sync_deadline = tokio::time::Instant::now() + Duration::from_secs(args.sync_timeout_s);
    for subject in &mut subjects {
        if !subject
            .wait_until(sync_deadline, |p| p.synced.is_some())
            .await?
        {
            bail!(
                "{} did not sync within {} s",
                subject.kind.name(),
                args.sync_timeout_s
            );
        }
        let cached = subject.printed().synced.map_or(0, |s| s.cached);
        if cached != expected {
            bail!(
                "{} synced with {cached} objects cached, expected {expected}",
                subject.kind.name()
            );
        }
    }
    info!("both subjects synced");

    // Both watching: an update of a probe object must reach both before the fault.
    if scenario != Scenario::SlowList {
        let probe = object_name(args.objects - 1);
        let patch = serde_json::json!({ "metadata": { "labels": { CHANGE_LABEL: "probe" } } });
        let probed = api
            .patch(&probe, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .context("updating the probe object")?;
        let version = probed.metadata.resource_version.unwrap_or_default();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        for subject in &mut subjects {
            let seen = subject
                .wait_until(deadline, |p| {
                    p.events
                        .iter()
                        .any(|e| e.name == probe && e.resource_version == version)
                })
                .await?;
            if !seen {
                bail!(
                    "{} did not see the probe update within 60 s",
                    subject.kind.name()
                );
            }
        }
    }
    let from_event: Vec<usize> = subjects.iter().map(|s| s.printed().events.len()).collect();
    let from_error: Vec<usize> = subjects.iter().map(|s| s.printed().errors.len()).collect();

    let ceiling = Duration::from_secs(args.ceiling_s);
    let mut noticed: Vec<Option<(i64, usize)>> = vec![None; subjects.len()];
    let slot = if scenario == Scenario::SlowList {
        run
    } else {
        0
    };
    let (changes, from_ns) = match scenario {
        Scenario::Reset => {
            each(paths, |p| p.reset_connections()).await?;
            let changes = make_changes(api, slot, run).await?;
            tokio::time::sleep(Duration::from_secs(args.reset_s)).await;
            let from = unix_nanos();
            each(paths, |p| p.clear()).await?;
            (changes, from)
        }
        Scenario::Stall => {
            let mut before = Vec::new();
            for (subject, path) in subjects.iter().zip(paths) {
                let open = connections_to(subject.pid, path.proxy.listen_addr().port())?;
                if open.is_empty() {
                    bail!(
                        "{} has no connection to its proxy to stall",
                        subject.kind.name()
                    );
                }
                before.push(open);
            }
            each(paths, |p| p.stall()).await?;
            let changes = make_changes(api, slot, run).await?;
            let from = changes.done_ns;
            let deadline = Instant::now() + ceiling;
            // Each proxy's stall is lifted once its subject gave up every connection it had.
            let lifts = subjects.iter().zip(paths).zip(&before).map(
                |((subject, path), before)| async move {
                    let port = path.proxy.listen_addr().port();
                    loop {
                        let open = connections_to(subject.pid, port)?;
                        if open.is_disjoint(before) {
                            let at = unix_nanos();
                            path.proxy.clear().await?;
                            info!(
                                subject = subject.kind.name(),
                                noticed_s = (at - from) as f64 / 1e9,
                                new_connections_closed_by_the_lift = open.len(),
                                "closed its stalled connections; stall lifted"
                            );
                            return anyhow::Ok(Some((at, open.len())));
                        }
                        if Instant::now() >= deadline {
                            return Ok(None);
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            );
            noticed = futures::future::try_join_all(lifts).await?;
            (changes, from)
        }
        Scenario::Cut20s => {
            let cut_at = Instant::now();
            each(paths, |p| p.cut()).await?;
            let changes = make_changes(api, slot, run).await?;
            tokio::time::sleep_until((cut_at + Duration::from_secs(args.cut_s)).into()).await;
            let from = unix_nanos();
            each(paths, |p| p.restore()).await?;
            (changes, from)
        }
        Scenario::CutCompacted => {
            let proxies: Vec<&FaultProxy> = paths.iter().map(|p| &p.proxy).collect();
            benches::faults::cut_compacted(
                env,
                &proxies,
                args.compacted_restart,
                make_changes(api, slot, run),
            )
            .await?
        }
        Scenario::SlowList => {
            let changes = make_changes(api, slot, run).await?;
            let from = changes.done_ns;
            (changes, from)
        }
    };
    info!(
        scenario = scenario.name(),
        "changes made, fault lifted; waiting for the subjects"
    );

    // Stall: the subjects were waited for while noticing; the ceiling counts from the
    // changes for every scenario's lift moment.
    let deadline = tokio::time::Instant::now()
        + ceiling.saturating_sub(Duration::from_nanos(
            u64::try_from(unix_nanos() - from_ns).unwrap_or(0),
        ));
    for (i, subject) in subjects.iter_mut().enumerate() {
        let from = from_event[i];
        let changes = &changes;
        subject
            .wait_until(deadline, |p| {
                Verdict::of(&p.events[from.min(p.events.len())..], changes)
                    .complete_at()
                    .is_some()
            })
            .await?;
    }
    // A stall whose subject never noticed is still in force: lift it before settling.
    for path in paths {
        path.proxy.clear().await?;
    }
    tokio::time::sleep(Duration::from_millis(args.settle_ms)).await;

    let mut out = Vec::new();
    for (i, subject) in subjects.into_iter().enumerate() {
        let printed = subject.printed();
        subject.stop().await;
        let synced = printed.synced.clone().context("synced")?;
        let events = printed.events[from_event[i].min(printed.events.len())..].to_vec();
        let errors = &printed.errors[from_error[i].min(printed.errors.len())..];
        let verdict = Verdict::of(&events, &changes);
        let ms = |at: i64| (at - from_ns) as f64 / 1e6;
        let recovery_ms = verdict
            .complete_at()
            .filter(|&at| at - from_ns <= i64::try_from(ceiling.as_nanos()).unwrap_or(i64::MAX))
            .map(ms);
        out.push(SubjectRun {
            subject: SUBJECTS[i].name().to_owned(),
            synced_ms: synced.synced_ms,
            spawn_to_synced_ms: synced.spawn_to_synced_ms,
            cached: synced.cached,
            recovery_ms,
            noticed_ms: noticed[i].map(|(at, _)| ms(at)),
            lift_closed: noticed[i].map(|(_, n)| n),
            update_seen: verdict.update.is_some(),
            delete_seen: verdict.delete.is_some(),
            add_seen: verdict.add.is_some(),
            tombstone: verdict.delete.is_some_and(|(_, t)| t),
            extra_events: verdict.extra,
            watch_errors: errors.len(),
            gone: errors.iter().any(|(gone, _, _)| *gone),
            events,
            errors: errors.iter().map(|(_, m, _)| m.clone()).collect(),
        });
    }
    Ok(ScenarioRun {
        scenario,
        run,
        from_ns,
        changes,
        subjects: out,
    })
}

/// Applies `fault` to both proxies at once.
async fn each<'a, F, Fut>(paths: &'a [Route], fault: F) -> anyhow::Result<()>
where
    F: Fn(&'a FaultProxy) -> Fut,
    Fut: Future<Output = kube_testenv::Result<()>>,
{
    futures::future::try_join_all(paths.iter().map(|p| fault(&p.proxy))).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The report.

/// Writes the section into `out`, replacing the one there or appending it; every other
/// byte of the file stays as it was.
fn write_report(
    out: &std::path::Path,
    json: &std::path::Path,
    results: &Results,
) -> anyhow::Result<()> {
    let section = section(json, results);
    let old = std::fs::read_to_string(out).unwrap_or_default();
    let new = match old.find(&format!("\n{SECTION}\n")) {
        Some(start) => {
            let start = start + 1;
            let rest = &old[start + SECTION.len()..];
            // The section ends where the next level-2 heading begins (after the blank line
            // before it, which is kept), or at the end of the file.
            match rest.find("\n## ") {
                Some(i) => {
                    let next = start + SECTION.len() + i + 1;
                    format!("{}{section}\n{}", &old[..start], &old[next..])
                }
                None => format!("{}{section}", &old[..start]),
            }
        }
        None if old.is_empty() => section,
        None => {
            let sep = if old.ends_with("\n\n") {
                ""
            } else if old.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            format!("{old}{sep}{section}")
        }
    };
    std::fs::write(out, new).with_context(|| format!("writing {}", out.display()))?;
    info!(report = %out.display(), json = %json.display(), "report written");
    Ok(())
}

/// Summary of one figure over the runs.
struct Figure {
    /// The values of the runs that have one.
    values: Vec<f64>,
    runs: usize,
}

impl Figure {
    fn median(&self) -> Option<f64> {
        (!self.values.is_empty()).then(|| median(self.values.clone()))
    }

    fn cell(&self, ceiling_s: u64) -> String {
        let Some(m) = self.median() else {
            return format!("not recovered within {ceiling_s} s ({} runs)", self.runs);
        };
        let min = self.values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self
            .values
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let mut cell = format!("{} ({}–{})", secs(m), secs(min), secs(max));
        if self.values.len() < self.runs {
            let _ = write!(
                cell,
                "; {} of {} runs not within {ceiling_s} s",
                self.runs - self.values.len(),
                self.runs
            );
        }
        cell
    }
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn secs(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{:.0} ms", ms)
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

fn figure(
    results: &Results,
    scenario: Scenario,
    subject: &str,
    value: impl Fn(&SubjectRun) -> Option<f64>,
) -> Figure {
    let runs: Vec<&SubjectRun> = results
        .runs
        .iter()
        .filter(|r| r.scenario == scenario)
        .flat_map(|r| r.subjects.iter().filter(|s| s.subject == subject))
        .collect();
    Figure {
        values: runs.iter().filter_map(|s| value(s)).collect(),
        runs: runs.len(),
    }
}

/// kube-informer's median over client-go's when every run of both recovered; a lower
/// bound (the ceiling over client-go's median) when no kube-informer run did.
fn ratio(a: &Figure, b: &Figure, ceiling_s: u64) -> String {
    let complete = |f: &Figure| f.runs > 0 && f.values.len() == f.runs;
    match (a.median(), b.median()) {
        (Some(a_m), Some(b_m)) if complete(a) && complete(b) => {
            let r = a_m / b_m;
            if r < 0.095 {
                format!("{r:.3}×")
            } else if r >= 10.0 {
                format!("{r:.0}×")
            } else {
                format!("{r:.2}×")
            }
        }
        (None, Some(b_m)) if complete(b) => {
            format!("> {:.1}×", ceiling_s as f64 * 1000.0 / b_m)
        }
        _ => "—".to_owned(),
    }
}

/// The second stall row's note: in how many runs the lift closed a connection the subject
/// had opened since the stall began.
fn lift_closed(results: &Results, subject: &str) -> String {
    let runs: Vec<&SubjectRun> = results
        .runs
        .iter()
        .filter(|r| r.scenario == Scenario::Stall)
        .flat_map(|r| r.subjects.iter().filter(|s| s.subject == subject))
        .collect();
    let closed = runs
        .iter()
        .filter(|s| s.lift_closed.is_some_and(|n| n > 0))
        .count();
    format!(
        "the lift closed a connection opened meanwhile in {closed}/{} runs",
        runs.len()
    )
}

/// The correctness cell of one scenario and subject: how many runs delivered each change,
/// and the events that should not have come.
fn correctness(results: &Results, scenario: Scenario, subject: &str) -> String {
    let runs: Vec<&SubjectRun> = results
        .runs
        .iter()
        .filter(|r| r.scenario == scenario)
        .flat_map(|r| r.subjects.iter().filter(|s| s.subject == subject))
        .collect();
    let n = runs.len();
    let all = runs
        .iter()
        .filter(|s| s.update_seen && s.delete_seen && s.add_seen)
        .count();
    let mut cell = if all == n {
        format!("all 3 changes in {n}/{n} runs")
    } else {
        let count = |f: fn(&SubjectRun) -> bool| runs.iter().filter(|s| f(s)).count();
        format!(
            "**missing changes**: update {}/{n}, delete {}/{n}, add {}/{n} runs",
            count(|s| s.update_seen),
            count(|s| s.delete_seen),
            count(|s| s.add_seen)
        )
    };
    let tombstones = runs.iter().filter(|s| s.tombstone).count();
    if tombstones > 0 {
        let _ = write!(cell, "; delete as tombstone in {tombstones}");
    }
    let extra: Vec<&EventLine> = runs.iter().flat_map(|s| s.extra_events.iter()).collect();
    if extra.is_empty() {
        cell.push_str("; no other event");
    } else {
        let replays = extra
            .iter()
            .filter(|e| {
                e.kind == "update" && e.old_resource_version.as_ref() == Some(&e.resource_version)
            })
            .count();
        let _ = write!(
            cell,
            "; **{} events for unchanged objects or repeats** ({} of them updates with an \
             unchanged resourceVersion)",
            extra.len(),
            replays
        );
    }
    let gone = runs.iter().filter(|s| s.gone).count();
    if matches!(scenario, Scenario::CutCompacted) || gone > 0 {
        let _ = write!(cell, "; 410 Gone reported in {gone}/{n}");
    }
    cell
}

fn section(json: &std::path::Path, results: &Results) -> String {
    let s = &results.settings;
    let mut out = String::new();
    let _ = writeln!(out, "{SECTION}\n");
    let _ = writeln!(
        out,
        "Generated by `recovery-bench` (`benches/src/bin/recovery_bench.rs`); the raw \
         results, every event each subject printed included, are in `{}`. One control \
         plane, and one Toxiproxy per subject in front of its API server, so a fault on \
         one subject's path never slows the other's. In every run of every scenario both \
         subjects start as separate processes at the same time, each with a kubeconfig \
         that points at its own proxy, and cache the ConfigMaps of a fresh namespace: \
         kube-informer's `SharedInformer::builder(Api::<ConfigMap>::namespaced(client, \
         ns)).build()` with one handler (`benches/src/bin/subject_recovery.rs`) and a \
         client-go `SharedInformerFactory` informer with one handler \
         (`benches/go-subject/recovery`), both with their defaults (each also reports its \
         watch errors, without handling them). Once both have synced and both have seen \
         the update of a probe object (so both are watching), both proxies get the same \
         fault and three changes are made directly, not through the proxies: one \
         ConfigMap's label updated, one deleted, one created.\n",
        json.display()
    );
    let _ = writeln!(out, "- command: `{}`", results.command);
    let _ = writeln!(out, "- machine: {}", results.machine);
    let _ = writeln!(
        out,
        "- control plane: etcd + kube-apiserver {} (kube-testenv, watch cache on), on the \
         same machine",
        kube_testenv::KUBERNETES_VERSION
    );
    let _ = writeln!(out, "- subjects: {}\n", results.versions);
    let _ = writeln!(
        out,
        "**Time to recover** runs from the moment the fault is lifted until the subject's \
         handler has seen all three changes; for the stall and slow-list, from the last \
         change's response. Figures are medians over {} runs, (min–max); the ratio is \
         kube-informer's median over client-go's, so below 1 is faster. The scenarios:\n",
        s.runs
    );
    let _ = writeln!(
        out,
        "- **reset**: every connection reset (Toxiproxy `reset_peer`, both directions: an \
         open connection is closed when either side next sends, a new one is reset at its \
         TLS hello), the changes made, {} s later the toxics removed.",
        s.reset_s
    );
    let _ = writeln!(
        out,
        "- **stall**: every connection silently dead: the proxy passes no byte in either \
         direction and closes nothing (`FaultProxy::stall`, Toxiproxy's `timeout` toxic \
         with timeout 0; new connections are accepted and stall too). The changes are made \
         at once, and the stall stays until the subject has closed every connection it \
         had when the stall began, i.e. until it noticed on its own that they were dead \
         (its sockets, read from `/proc/<pid>/fd` and `/proc/<pid>/net/tcp` every 50 ms); \
         then its own proxy's stall is lifted. Why so: Toxiproxy applies a toxic to every \
         connection, new ones included, so it cannot stall the existing connections and \
         let new ones pass; and removing the `timeout` toxic closes every connection, so \
         lifting it after a fixed time would end the stall for both subjects at once and \
         measure nothing about either. (A `latency` toxic of a day would hold the bytes \
         instead and close nothing when removed, but in a trial Toxiproxy v2.5 did not \
         answer the removal within 10 s once the client had closed a held connection: \
         its latency toxic hands the held bytes on with a blocking send to a writer that \
         has stopped.) Lifting closes any connection the subject opened meanwhile, which it must then \
         open again (counted per run as `lift_closed` in the JSON, and in the table). \
         The time to recover runs from the changes; **noticed** is the \
         part until the subject had closed its stalled connections. Ceiling {} s.",
        s.ceiling_s
    );
    let _ = writeln!(
        out,
        "- **cut-20s**: the API server unreachable for {} s (Toxiproxy stops listening and \
         closes every connection, so new ones are refused), the changes made meanwhile.",
        s.cut_s
    );
    let _ = writeln!(
        out,
        "- **cut-compacted**: the API server unreachable while the changes are made and \
         etcd is compacted to its current revision, past the informers' \
         resourceVersion{}; then reachable again, where a watch from the old \
         resourceVersion gets 410 Gone and the informer must relist. kube-informer \
         reports the 410 to its watch-error hook; client-go's reflector handles a \
         watch's 410 inside its watch loop and never passes it to the watch-error \
         handler, so its column shows no 410 even when it relisted (a client-go relist \
         shows as an update event, old and new with the same resourceVersion, for every \
         object).",
        if s.compacted_restart {
            ", and kube-apiserver restarted meanwhile (without the restart its watch cache \
             still serves the old resourceVersion and nobody gets a 410; restarted, the \
             cache starts past it, as etcd does)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "- **slow-list**: {} ConfigMaps (small: one label, one data key) and both proxies \
         with {} ms latency on every response and {} KB/s per connection from the start: \
         **synced** is the subject's time from the start of `main` to synced, then the \
         changes are made and **delivered** is their time to reach the handler through the \
         slow proxy.\n",
        thousands(s.slow_list_objects),
        s.slow_list_latency_ms,
        s.slow_list_bandwidth
    );
    let _ = writeln!(
        out,
        "**Correctness**, from the events each subject printed after the fault began: \
         whether each change arrived (the update and the add with the resourceVersion the \
         API server answered), and every other event, i.e. for an object that did not \
         change or a change seen twice; these are listed in the JSON.\n"
    );
    let _ = writeln!(
        out,
        "| scenario | kube-informer | client-go | kube-informer / client-go | kube-informer correctness | client-go correctness |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    let present: Vec<Scenario> = [
        Scenario::Reset,
        Scenario::Stall,
        Scenario::Cut20s,
        Scenario::CutCompacted,
        Scenario::SlowList,
    ]
    .into_iter()
    .filter(|sc| results.runs.iter().any(|r| r.scenario == *sc))
    .collect();
    let [ki, cg] = SUBJECTS.map(SubjectKind::name);
    for scenario in present {
        type Value = fn(&SubjectRun) -> Option<f64>;
        let rows: Vec<(&str, Value)> = match scenario {
            Scenario::Stall => vec![
                ("stall: recovered", |r| r.recovery_ms),
                ("stall: noticed", |r| r.noticed_ms),
            ],
            Scenario::SlowList => vec![
                ("slow-list: synced", |r| Some(r.synced_ms)),
                ("slow-list: delivered", |r| r.recovery_ms),
            ],
            _ => vec![(scenario.name(), |r| r.recovery_ms)],
        };
        for (i, (label, value)) in rows.iter().enumerate() {
            let a = figure(results, scenario, ki, value);
            let b = figure(results, scenario, cg, value);
            let (ca, cb) = if i == 0 {
                (
                    correctness(results, scenario, ki),
                    correctness(results, scenario, cg),
                )
            } else if scenario == Scenario::Stall {
                (lift_closed(results, ki), lift_closed(results, cg))
            } else {
                ("〃".to_owned(), "〃".to_owned())
            };
            let _ = writeln!(
                out,
                "| {label} | {} | {} | {} | {ca} | {cb} |",
                a.cell(s.ceiling_s),
                b.cell(s.ceiling_s),
                ratio(&a, &b, s.ceiling_s),
            );
        }
    }
    out
}
