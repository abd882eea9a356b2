//! `fleet-bench`: kube-informer's `fleet` beside what a client-go user writes today, in one
//! run: memory per engaged cluster, the time from a cluster appearing to its first
//! reconcile, and fairness between clusters while one of them floods.
//!
//! Two setups, each run for both subjects, one after the other, alternating which goes
//! first:
//!
//! - `real`: `--members` control planes started by kube-testenv, given to the subjects as
//!   kubeconfig files in a directory (kube-informer: `KubeconfigDirectory`; client-go: the
//!   directory read every 2 s), plus one more control plane for the appearance samples;
//! - `namespaces`: `--namespace-clusters` namespaces of one control plane, each a cluster
//!   (kube-informer: `NamespaceClusters` with a label selector; client-go: an informer on
//!   the labelled Namespaces starting a namespaced factory for each).
//!
//! Every cluster holds `--objects` ConfigMaps (`cm-*`, about 400 bytes each) before the
//! subject starts. The subjects (`subject-fleet`, and `go-subject/fleet` built now with
//! `go build`) are separate processes; each prints JSON lines (`fleet_lines.rs`) as its
//! clusters are engaged and reconciled. Per subject and setup the driver measures:
//!
//! 1. **Memory per engaged cluster**: the subject starts with no cluster, and its VmRSS
//!    (`/proc/<pid>/status`, the median of five reads a second apart, after `--settle-s`)
//!    is the baseline; then every member is added (files written / namespaces labelled),
//!    and once each has reconciled all its initial objects, and `--settle-s` later, VmRSS
//!    is read the same way. (RSS − baseline) / clusters is the cost of one cluster. The
//!    subject's established TCP connections (iproute2's `ss`) are counted then too:
//!    kube-apiserver allows 100 concurrent HTTP/2 streams per connection, and each
//!    cluster's watch holds one.
//! 2. **Appearance**: with the members synced, one more cluster at a time (a new
//!    kubeconfig file, renamed into the directory; a namespace with its ConfigMaps,
//!    labelled); the time from just before the rename / label patch to the subject's
//!    first reconcile of one of its objects. The directory is read every 2 s by both
//!    subjects, so up to 2 s of a real cluster's figure is the poll's phase.
//! 3. **Fairness**: for each `--costs-ms` value C, `--flood-writers` writers create
//!    `--flood` ConfigMaps in the first member as fast as they can while the driver creates
//!    one ConfigMap in the second member every `--sample-every-ms` (`--samples` of them,
//!    from `--sample-delay-ms` after the flood starts). Flood and sample objects carry the
//!    annotation `fleet-bench/cost-ms: C`: each reconcile reads its object from the cache
//!    and sleeps C ms (a stand-in for a call to an API server; C = 0 is a reconcile that
//!    only reads the cache). A sample's latency runs from the driver's clock just before
//!    its create to the end of its reconcile in the subject (same machine, same clock).
//!
//! Results go to a JSON file (`--report`) and a Markdown report printed at the end.

use std::{
    collections::HashMap,
    ffi::OsString,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use benches::{
    client_go_version, command_output, lock_version, machine, median, percentile, process_memory,
    unix_nanos,
};
use clap::{Parser, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube_client::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use kube_testenv::TestEnv;
use serde::Serialize;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::mpsc,
};
use tracing::{info, warn};

#[path = "../fleet_lines.rs"]
mod fleet_lines;

use fleet_lines::{COST_ANNOTATION, FLOOD_PREFIX, INITIAL_PREFIX, Line, SAMPLE_PREFIX};

/// The label that makes a namespace a cluster in the `namespaces` setup.
const MEMBER_LABEL: &str = "fleet-bench/member";
/// The label on the flood and sample ConfigMaps, so that they can be deleted together.
const KIND_LABEL: &str = "fleet-bench/kind";
/// The namespace of the ConfigMaps in each real member.
const REAL_NAMESPACE: &str = "fleet-bench";
/// The Rust subject, beside this executable.
const RUST_BINARY: &str = "subject-fleet";
/// The Go subject, built beside this executable from `go-subject/fleet`.
const GO_BINARY: &str = "go-subject-fleet";

/// Where the clusters come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Setup {
    /// Real control planes as kubeconfig files in a directory.
    Real,
    /// Namespaces of one control plane, each a cluster.
    Namespaces,
}

impl Setup {
    fn name(self) -> &'static str {
        match self {
            Setup::Real => "real",
            Setup::Namespaces => "namespaces",
        }
    }
}

/// The two subjects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Subject {
    /// kube-informer's `Fleet` (`subject-fleet`).
    KubeInformer,
    /// client-go, a factory per cluster and one shared workqueue (`go-subject/fleet`).
    ClientGo,
}

impl Subject {
    fn name(self) -> &'static str {
        match self {
            Subject::KubeInformer => "kube-informer",
            Subject::ClientGo => "client-go",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Subject::KubeInformer => "ki",
            Subject::ClientGo => "cg",
        }
    }
}

/// Measures kube-informer's fleet beside client-go: memory per engaged cluster, time from
/// a cluster appearing to its first reconcile, and fairness while one cluster floods.
#[derive(Debug, Clone, Parser, Serialize)]
#[command(name = "fleet-bench")]
struct Args {
    /// Setups to run, comma-separated, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "real,namespaces"
    )]
    setup: Vec<Setup>,
    /// Subjects to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "kube-informer,client-go"
    )]
    subjects: Vec<Subject>,
    /// Runs of each setup; each run runs every subject once, the first one alternating.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Member control planes of the real setup (at least 2: one floods, one is timed).
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Member namespaces of the namespaces setup (at least 2).
    #[arg(long, default_value_t = 100)]
    namespace_clusters: usize,
    /// ConfigMaps each cluster holds before the subject starts.
    #[arg(long, default_value_t = 200)]
    objects: usize,
    /// Workers in total (kube-informer: `Fleet::workers`; client-go: goroutines on the
    /// shared queue).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Clusters added one at a time for the appearance samples, real setup (each a new
    /// kubeconfig file of one extra control plane).
    #[arg(long, default_value_t = 3)]
    real_appear_samples: usize,
    /// Clusters added one at a time for the appearance samples, namespaces setup.
    #[arg(long, default_value_t = 5)]
    namespace_appear_samples: usize,
    /// ConfigMaps created in the flooded cluster in each fairness phase.
    #[arg(long, default_value_t = 10_000)]
    flood: usize,
    /// Concurrent writers of the flood.
    #[arg(long, default_value_t = 8)]
    flood_writers: usize,
    /// Single changes timed in the other cluster in each fairness phase.
    #[arg(long, default_value_t = 50)]
    samples: usize,
    /// The pace of the single changes, ms.
    #[arg(long, default_value_t = 200)]
    sample_every_ms: u64,
    /// When the first single change is made, ms after the flood's first write.
    #[arg(long, default_value_t = 500)]
    sample_delay_ms: u64,
    /// The reconcile's work per flood and sample object in each fairness phase, ms (one
    /// phase per value; 0 is a reconcile that only reads the cache).
    #[arg(long, value_delimiter = ',', default_value = "0,20")]
    costs_ms: Vec<u64>,
    /// How long to let a subject settle before each memory reading, s.
    #[arg(long, default_value_t = 5)]
    settle_s: u64,
    /// How long any one wait for a subject may take, s.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Concurrent creates of the initial ConfigMaps.
    #[arg(long, default_value_t = 32)]
    create_concurrency: usize,
    /// The JSON report.
    #[arg(long, default_value = "target/fleet-bench/report.json")]
    report: PathBuf,
    /// Where the kubeconfig directories and the subjects' logs go.
    #[arg(long, default_value = "target/fleet-bench")]
    work_dir: PathBuf,
}

impl Args {
    fn check(&self) -> anyhow::Result<()> {
        if self.setup.is_empty() || self.subjects.is_empty() {
            bail!("--setup and --subjects need at least one value each");
        }
        if self.members < 2 || self.namespace_clusters < 2 {
            bail!(
                "--members and --namespace-clusters must be at least 2 (one floods, one is timed)"
            );
        }
        if self.objects == 0 || self.workers == 0 || self.runs == 0 {
            bail!("--objects, --workers and --runs must be at least 1");
        }
        if self.flood == 0 || self.flood_writers == 0 || self.samples == 0 {
            bail!("--flood, --flood-writers and --samples must be at least 1");
        }
        if self.flood >= 100_000 || self.samples >= 10_000 {
            bail!("--flood must be below 100,000 and --samples below 10,000 (object names)");
        }
        if self.sample_every_ms == 0 {
            bail!("--sample-every-ms must be at least 1");
        }
        Ok(())
    }
}

/// The name of the `i`th initial ConfigMap of a cluster.
fn initial_name(i: usize) -> String {
    format!("{INITIAL_PREFIX}{i:05}")
}

/// A ConfigMap of about 400 bytes as stored: a few labels and a 300-byte value.
fn config_map(name: &str, kind: Option<&str>, cost_ms: Option<u64>) -> ConfigMap {
    let payload: String = (0..300)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let mut labels = serde_json::json!({ "app": "fleet-bench", "tier": "config" });
    if let Some(kind) = kind {
        labels[KIND_LABEL] = kind.into();
    }
    let mut metadata = serde_json::json!({ "name": name, "labels": labels });
    if let Some(cost) = cost_ms {
        metadata["annotations"] = serde_json::json!({ COST_ANNOTATION: cost.to_string() });
    }
    serde_json::from_value(serde_json::json!({
        "metadata": metadata,
        "data": { "config.yaml": payload, "mode": "bench" },
    }))
    .unwrap_or_default()
}

/// Creates `cm` in `api`, retrying a failed create up to five times (an object already
/// there after a retry counts as created).
async fn create(api: &Api<ConfigMap>, cm: &ConfigMap) -> anyhow::Result<()> {
    let name = cm.metadata.name.as_deref().unwrap_or_default();
    let mut attempt = 0;
    loop {
        match api.create(&PostParams::default(), cm).await {
            Ok(_) => return Ok(()),
            Err(kube_client::Error::Api(status)) if status.code == 409 && attempt > 0 => {
                return Ok(());
            }
            Err(error) if attempt < 5 => {
                attempt += 1;
                warn!(name, %error, attempt, "a create failed; retrying");
                tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
            }
            Err(error) => return Err(error).with_context(|| format!("creating ConfigMap {name}")),
        }
    }
}

/// Creates the initial ConfigMaps of one cluster.
async fn create_initial(api: &Api<ConfigMap>, n: usize, concurrency: usize) -> anyhow::Result<()> {
    futures::stream::iter(0..n)
        .map(|i| async move { create(api, &config_map(&initial_name(i), None, None)).await })
        .buffer_unordered(concurrency.max(1))
        .try_for_each(|()| async { Ok(()) })
        .await
}

/// Creates namespace `name` if it is not there.
async fn ensure_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name } }))
            .context("a Namespace")?;
    match api.create(&PostParams::default(), &namespace).await {
        Ok(_) => Ok(()),
        Err(kube_client::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error).with_context(|| format!("creating namespace {name}")),
    }
}

/// Sets (`Some`) or removes (`None`) the member label of namespace `name`.
async fn label_namespace(client: &Client, name: &str, value: Option<&str>) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let patch = serde_json::json!({ "metadata": { "labels": { MEMBER_LABEL: value } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("labelling namespace {name}"))?;
    Ok(())
}

/// Deletes the flood and sample ConfigMaps of `api`'s namespace and waits until they are
/// gone.
async fn delete_written(api: &Api<ConfigMap>) -> anyhow::Result<()> {
    let selector = ListParams::default().labels(KIND_LABEL);
    let started = Instant::now();
    loop {
        let left = api
            .list_metadata(&selector.clone().limit(1))
            .await
            .context("listing the flood and sample ConfigMaps")?;
        if left.items.is_empty() {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("the flood and sample ConfigMaps were not deleted within 5 minutes");
        }
        if let Err(error) = api
            .delete_collection(&DeleteParams::default(), &selector)
            .await
        {
            warn!(%error, "deleting the flood and sample ConfigMaps failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Writes `kubeconfig`'s bytes to `dir/<name>.yaml` by a rename, so a reader never sees
/// half a file; returns the Unix ns just before the rename.
fn place_kubeconfig(kubeconfig: &Path, dir: &Path, name: &str) -> anyhow::Result<i64> {
    let text =
        std::fs::read(kubeconfig).with_context(|| format!("reading {}", kubeconfig.display()))?;
    let hidden = dir.join(format!(".{name}.tmp"));
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&hidden, text).with_context(|| format!("writing {}", hidden.display()))?;
    let at = unix_nanos();
    std::fs::rename(&hidden, &path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(at)
}

/// The clusters of one setup and how to add them.
#[expect(
    clippy::large_enum_variant,
    reason = "one value, held for the whole setup"
)]
enum Topology {
    Real {
        /// The members' control planes and their ConfigMaps (in [`REAL_NAMESPACE`]).
        members: Vec<(TestEnv, Api<ConfigMap>)>,
        /// The control plane of the appearance samples.
        extra: TestEnv,
    },
    Namespaces {
        env: TestEnv,
        client: Client,
        members: Vec<String>,
        extras: Vec<String>,
        /// Clients of their own for the flood and for the samples.
        flood: Api<ConfigMap>,
        quiet: Api<ConfigMap>,
    },
}

impl Topology {
    async fn set_up(args: &Args, setup: Setup) -> anyhow::Result<Self> {
        match setup {
            Setup::Real => {
                let mut members = Vec::new();
                for i in 0..=args.members {
                    let role = if i < args.members { "member" } else { "extra" };
                    info!(setup = "real", index = i, role, "starting a control plane");
                    let env = TestEnv::builder()
                        .start()
                        .await
                        .with_context(|| format!("starting control plane {i}"))?;
                    let client = env.client().await.context("a client")?;
                    ensure_namespace(&client, REAL_NAMESPACE).await?;
                    let api: Api<ConfigMap> = Api::namespaced(client, REAL_NAMESPACE);
                    create_initial(&api, args.objects, args.create_concurrency).await?;
                    info!(
                        setup = "real",
                        index = i,
                        objects = args.objects,
                        "ConfigMaps created"
                    );
                    members.push((env, api));
                }
                let (extra, _) = members.pop().context("the extra control plane")?;
                Ok(Topology::Real { members, extra })
            }
            Setup::Namespaces => {
                info!(setup = "namespaces", "starting the control plane");
                let env = TestEnv::builder()
                    .start()
                    .await
                    .context("starting the control plane")?;
                let client = env.client().await.context("a client")?;
                let members: Vec<String> = (0..args.namespace_clusters)
                    .map(|i| format!("fb-m-{i:03}"))
                    .collect();
                let extras: Vec<String> = (0..args.namespace_appear_samples)
                    .map(|i| format!("fb-x-{i:02}"))
                    .collect();
                let started = Instant::now();
                for (done, name) in members.iter().chain(&extras).enumerate() {
                    ensure_namespace(&client, name).await?;
                    let api: Api<ConfigMap> = Api::namespaced(client.clone(), name);
                    create_initial(&api, args.objects, args.create_concurrency).await?;
                    if (done + 1) % 10 == 0 {
                        info!(
                            namespaces = done + 1,
                            of = members.len() + extras.len(),
                            elapsed_s = started.elapsed().as_secs(),
                            "namespaces filled"
                        );
                    }
                }
                let flood = Api::namespaced(env.client().await?, &members[0]);
                let quiet = Api::namespaced(env.client().await?, &members[1]);
                Ok(Topology::Namespaces {
                    env,
                    client,
                    members,
                    extras,
                    flood,
                    quiet,
                })
            }
        }
    }

    /// The members' names as the subjects call them.
    fn members(&self) -> Vec<String> {
        match self {
            Topology::Real { members, .. } => {
                (0..members.len()).map(|i| format!("member-{i}")).collect()
            }
            Topology::Namespaces { members, .. } => members.clone(),
        }
    }

    fn appear_samples(&self, args: &Args) -> usize {
        match self {
            Topology::Real { .. } => args.real_appear_samples,
            Topology::Namespaces { extras, .. } => extras.len(),
        }
    }

    /// The subject's arguments for this setup; `dir` is the run's kubeconfig directory.
    fn subject_args(&self, dir: &Path) -> Vec<OsString> {
        match self {
            Topology::Real { .. } => {
                vec!["--setup".into(), "real".into(), "--dir".into(), dir.into()]
            }
            Topology::Namespaces { env, .. } => vec![
                "--setup".into(),
                "namespaces".into(),
                "--kubeconfig".into(),
                env.kubeconfig_path().into(),
                "--selector".into(),
                format!("{MEMBER_LABEL}=yes").into(),
            ],
        }
    }

    /// Adds every member: writes its file, or labels its namespace.
    async fn add_members(&self, dir: &Path) -> anyhow::Result<()> {
        match self {
            Topology::Real { members, .. } => {
                for (i, (env, _)) in members.iter().enumerate() {
                    place_kubeconfig(env.kubeconfig_path(), dir, &format!("member-{i}"))?;
                }
                Ok(())
            }
            Topology::Namespaces {
                client, members, ..
            } => {
                futures::stream::iter(members)
                    .map(|name| label_namespace(client, name, Some("yes")))
                    .buffer_unordered(16)
                    .try_for_each(|()| async { Ok(()) })
                    .await
            }
        }
    }

    /// Adds the `i`th extra cluster; returns its name and the Unix ns it was announced at
    /// (just before the rename or the label patch).
    async fn add_extra(&self, dir: &Path, i: usize) -> anyhow::Result<(String, i64)> {
        match self {
            Topology::Real { extra, .. } => {
                let name = format!("extra-{i}");
                let at = place_kubeconfig(extra.kubeconfig_path(), dir, &name)?;
                Ok((name, at))
            }
            Topology::Namespaces { client, extras, .. } => {
                let name = extras
                    .get(i)
                    .with_context(|| format!("no extra namespace {i}"))?
                    .clone();
                let at = unix_nanos();
                label_namespace(client, &name, Some("yes")).await?;
                Ok((name, at))
            }
        }
    }

    /// The flooded cluster's name and ConfigMaps.
    fn flood(&self) -> (String, Api<ConfigMap>) {
        match self {
            Topology::Real { members, .. } => ("member-0".to_owned(), members[0].1.clone()),
            Topology::Namespaces { members, flood, .. } => (members[0].clone(), flood.clone()),
        }
    }

    /// The timed cluster's name and ConfigMaps.
    fn quiet(&self) -> (String, Api<ConfigMap>) {
        match self {
            Topology::Real { members, .. } => ("member-1".to_owned(), members[1].1.clone()),
            Topology::Namespaces { members, quiet, .. } => (members[1].clone(), quiet.clone()),
        }
    }

    /// Back to the state before a subject: no flood or sample objects, no namespace
    /// labelled.
    async fn clean(&self) -> anyhow::Result<()> {
        delete_written(&self.flood().1).await?;
        delete_written(&self.quiet().1).await?;
        if let Topology::Namespaces {
            client,
            members,
            extras,
            ..
        } = self
        {
            futures::stream::iter(members.iter().chain(extras))
                .map(|name| label_namespace(client, name, None))
                .buffer_unordered(16)
                .try_for_each(|()| async { Ok(()) })
                .await?;
        }
        Ok(())
    }
}

/// What a subject has printed so far.
#[derive(Debug, Default)]
struct Seen {
    ready: Option<(String, String)>,
    engaged: HashMap<String, i64>,
    first: HashMap<String, i64>,
    synced: HashMap<String, i64>,
    samples: HashMap<String, i64>,
    /// By flood phase: the cluster and when it was drained.
    flood_done: HashMap<String, (String, i64)>,
}

impl Seen {
    fn take(&mut self, line: Line) {
        match line {
            Line::Ready {
                subject, workers, ..
            } => self.ready = Some((subject, workers)),
            Line::Engaged { cluster, at_ns } => {
                self.engaged.entry(cluster).or_insert(at_ns);
            }
            Line::First { cluster, at_ns, .. } => {
                self.first.entry(cluster).or_insert(at_ns);
            }
            Line::Synced { cluster, at_ns, .. } => {
                self.synced.entry(cluster).or_insert(at_ns);
            }
            Line::Sample { name, at_ns, .. } => {
                self.samples.entry(name).or_insert(at_ns);
            }
            Line::FloodDone {
                cluster,
                phase,
                at_ns,
                ..
            } => {
                self.flood_done.entry(phase).or_insert((cluster, at_ns));
            }
        }
    }
}

/// A running subject: its process, and the lines it printed.
struct Running {
    child: Child,
    pid: u32,
    lines: mpsc::UnboundedReceiver<Line>,
    seen: Seen,
    timeout: Duration,
    log: PathBuf,
}

impl Running {
    async fn spawn(
        binary: &Path,
        args: &[OsString],
        log: &Path,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let stderr =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = Command::new(binary)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let pid = child.id().context("the subject's pid")?;
        let stdout = child.stdout.take().context("the subject's stdout")?;
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(text)) = reader.next_line().await {
                match serde_json::from_str::<Line>(&text) {
                    Ok(line) => {
                        if tx.send(line).is_err() {
                            return;
                        }
                    }
                    Err(error) => {
                        warn!(%error, line = %text, "a line the subject printed is not one of the protocol's")
                    }
                }
            }
        });
        Ok(Self {
            child,
            pid,
            lines,
            seen: Seen::default(),
            timeout,
            log: log.to_owned(),
        })
    }

    /// Reads the subject's lines until `done` holds, logging `progress` every 10 s.
    async fn wait_for(
        &mut self,
        what: &str,
        done: impl Fn(&Seen) -> bool,
        progress: impl Fn(&Seen) -> String,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut report = tokio::time::interval(Duration::from_secs(10));
        report.tick().await;
        while !done(&self.seen) {
            tokio::select! {
                line = tokio::time::timeout_at(deadline, self.lines.recv()) => match line {
                    Ok(Some(line)) => self.seen.take(line),
                    Ok(None) => bail!(
                        "the subject exited while waiting for {what} ({}; its log: {})",
                        progress(&self.seen),
                        self.log.display()
                    ),
                    Err(_) => bail!(
                        "timed out after {:?} waiting for {what} ({}; the subject's log: {})",
                        self.timeout,
                        progress(&self.seen),
                        self.log.display()
                    ),
                },
                _ = report.tick() => info!(waiting_for = what, progress = %progress(&self.seen), "waiting"),
            }
        }
        Ok(())
    }

    /// VmRSS and RssAnon, KiB: the medians of five reads a second apart.
    async fn resident(&self) -> Resident {
        let (mut all, mut anonymous) = (Vec::new(), Vec::new());
        let pid = self.pid.to_string();
        for i in 0..5 {
            if i > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let memory = process_memory(&pid);
            all.push(memory.resident_kib as f64);
            anonymous.push(memory.anonymous_kib as f64);
        }
        Resident {
            all_kib: median(all) as u64,
            anonymous_kib: median(anonymous) as u64,
        }
    }

    /// Closes its stdin and waits (10 s at most) for it to exit, else kills it.
    async fn stop(mut self) {
        drop(self.child.stdin.take());
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            warn!(
                pid = self.pid,
                "the subject did not exit within 10 s; killing it"
            );
            let _ = self.child.kill().await;
        }
    }
}

/// One cluster added to a running subject.
#[derive(Debug, Clone, Serialize)]
struct Appearance {
    cluster: String,
    /// From the announcement (rename / label) to the subject starting the cluster's
    /// informer, s.
    engaged_s: f64,
    /// To the end of its first reconcile, s.
    first_reconcile_s: f64,
    /// To every initial object reconciled, s.
    synced_s: f64,
}

/// One timed single change.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    name: String,
    /// Just before the create, Unix ns.
    before_ns: i64,
    /// When the create returned, Unix ns.
    after_ns: i64,
    /// From `before_ns` to the end of its reconcile, ms.
    latency_ms: f64,
    /// Whether it was written before the flood's last write was answered.
    during_writes: bool,
    /// Whether it was written before the flooded cluster's last flood reconcile.
    during_flood: bool,
}

/// One fairness phase.
#[derive(Debug, Clone, Serialize)]
struct Fairness {
    cost_ms: u64,
    flood: usize,
    /// From the flood's first write to its last write's answer, s.
    flood_writes_s: f64,
    /// Creates per second of the flood.
    flood_writes_per_s: f64,
    /// From the flood's first write to the subject's last flood reconcile, s.
    flood_drained_s: f64,
    samples: Vec<Sample>,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// Median time the sample creates took, ms.
    write_p50_ms: f64,
    samples_during_writes: usize,
    samples_during_flood: usize,
}

/// Resident memory, KiB: all of it (VmRSS) and the anonymous part (RssAnon).
#[derive(Debug, Clone, Copy)]
struct Resident {
    all_kib: u64,
    anonymous_kib: u64,
}

/// One subject in one run of one setup.
#[derive(Debug, Clone, Serialize)]
struct SubjectRun {
    setup: Setup,
    run: usize,
    /// 0 if it ran first in its run.
    position: usize,
    subject: Subject,
    workers: String,
    clusters: usize,
    baseline_rss_kib: u64,
    synced_rss_kib: u64,
    per_cluster_kib: f64,
    /// RssAnon, without the executable's and libraries' pages, which the first cluster
    /// faults in once for all.
    baseline_anonymous_kib: u64,
    synced_anonymous_kib: u64,
    per_cluster_anonymous_kib: f64,
    /// Established TCP connections of the subject once every member had synced.
    connections: Option<usize>,
    /// From adding the members to the last of them synced, s.
    all_synced_s: f64,
    appearances: Vec<Appearance>,
    fairness: Vec<Fairness>,
    load_before: String,
    load_after: String,
    log: PathBuf,
}

/// The JSON report.
#[derive(Debug, Serialize)]
struct Report {
    command: String,
    date: String,
    machine: String,
    cpu_model: String,
    cpus: usize,
    versions: String,
    args: Args,
    runs: Vec<SubjectRun>,
}

/// The established TCP connections process `pid` holds (from iproute2's `ss`); `None`
/// when `ss` cannot be run.
fn tcp_connections(pid: u32) -> Option<usize> {
    let output = std::process::Command::new("ss")
        .args(["-tnpH", "state", "established"])
        .output()
        .ok()?;
    let owner = format!("pid={pid},");
    Some(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| line.contains(&owner))
            .count(),
    )
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The CPU model and the number of processors `/proc/cpuinfo` lists.
fn cpuinfo() -> (String, usize) {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = text
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let count = text.lines().filter(|l| l.starts_with("processor")).count();
    (model, count)
}

fn versions() -> String {
    format!(
        "kube-informer {} (kube-client {}), client-go {} ({}), {}",
        lock_version("kube-informer"),
        lock_version("kube-client"),
        client_go_version(),
        command_output("go", &["env", "GOVERSION"]),
        command_output("rustc", &["--version"]),
    )
}

/// The Rust subject beside this executable, and the Go one built there now.
fn binaries() -> anyhow::Result<(PathBuf, PathBuf)> {
    let exe = std::env::current_exe().context("this executable's path")?;
    let dir = exe.parent().context("this executable's directory")?;
    let rust = dir.join(RUST_BINARY);
    if !rust.is_file() {
        bail!(
            "{} is missing: build it beside this driver, e.g. `cargo build --release -p benches \
             --bin fleet-bench --bin {RUST_BINARY}`",
            rust.display()
        );
    }
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("go-subject");
    let go = dir.join(GO_BINARY);
    info!(module = %module.display(), "building the client-go subject");
    let status = std::process::Command::new("go")
        .args(["build", "-trimpath", "-o"])
        .arg(&go)
        .arg("./fleet")
        .current_dir(&module)
        .status()
        .context("running go build (is Go installed?)")?;
    if !status.success() || !go.is_file() {
        bail!(
            "go build of ./fleet in {} failed: {status}",
            module.display()
        );
    }
    Ok((rust, go))
}

/// The subject's executable.
fn binary_of(subject: Subject, binaries: &(PathBuf, PathBuf)) -> &Path {
    match subject {
        Subject::KubeInformer => &binaries.0,
        Subject::ClientGo => &binaries.1,
    }
}

/// Runs one fairness phase against a running subject.
async fn fairness(
    args: &Args,
    topology: &Topology,
    subject: &mut Running,
    phase: &str,
    cost_ms: u64,
) -> anyhow::Result<Fairness> {
    let (flood_cluster, flood_api) = topology.flood();
    let (quiet_cluster, quiet_api) = topology.quiet();
    info!(
        phase,
        cost_ms,
        flood = args.flood,
        flood_cluster,
        quiet_cluster,
        "fairness: flooding one cluster while timing single changes in another"
    );
    let next = Arc::new(AtomicUsize::new(0));
    let flood_started = unix_nanos();
    let clock = Instant::now();
    let mut writers = Vec::new();
    for _ in 0..args.flood_writers {
        let (next, api, phase, total) = (
            next.clone(),
            flood_api.clone(),
            phase.to_owned(),
            args.flood,
        );
        writers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, anyhow::Error>(());
                }
                let name = format!("{FLOOD_PREFIX}{phase}-{i:05}");
                create(&api, &config_map(&name, Some("flood"), Some(cost_ms))).await?;
            }
        }));
    }
    let sampler = {
        let (api, phase) = (quiet_api.clone(), phase.to_owned());
        let (count, every, delay) = (
            args.samples,
            Duration::from_millis(args.sample_every_ms),
            Duration::from_millis(args.sample_delay_ms),
        );
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut writes = Vec::new();
            for i in 0..count {
                tick.tick().await;
                let api = api.clone();
                let name = format!("{SAMPLE_PREFIX}{phase}-{i:04}");
                writes.push(tokio::spawn(async move {
                    let cm = config_map(&name, Some("sample"), Some(cost_ms));
                    let before = unix_nanos();
                    create(&api, &cm).await?;
                    Ok::<_, anyhow::Error>((name, before, unix_nanos()))
                }));
            }
            let mut done = Vec::new();
            for write in writes {
                done.push(write.await.context("a sample's writer")??);
            }
            Ok::<_, anyhow::Error>(done)
        })
    };
    // The subject's lines pile up in its channel meanwhile; `wait_for` reads them after.
    let mut written = std::pin::pin!(futures::future::try_join_all(writers));
    let mut progress = tokio::time::interval(Duration::from_secs(5));
    progress.tick().await;
    loop {
        tokio::select! {
            done = &mut written => {
                for writer in done.context("a flood writer")? {
                    writer?;
                }
                break;
            }
            _ = progress.tick() => info!(
                written = next.load(Ordering::Relaxed).min(args.flood),
                of = args.flood,
                "flooding"
            ),
        }
    }
    let flood_writes_s = clock.elapsed().as_secs_f64();
    let flood_written = unix_nanos();
    info!(
        phase,
        flood_writes_s,
        writes_per_s = args.flood as f64 / flood_writes_s,
        "the flood is written"
    );
    let writes = sampler.await.context("the sampler")??;
    let names: Vec<String> = writes.iter().map(|(name, _, _)| name.clone()).collect();
    let phase_key = phase.to_owned();
    subject
        .wait_for(
            &format!("the samples and the flood of {phase} to be reconciled"),
            |seen| {
                names.iter().all(|n| seen.samples.contains_key(n))
                    && seen.flood_done.contains_key(&phase_key)
            },
            |seen| {
                format!(
                    "{} of {} samples reconciled, flood drained: {}",
                    names
                        .iter()
                        .filter(|n| seen.samples.contains_key(*n))
                        .count(),
                    names.len(),
                    seen.flood_done.contains_key(&phase_key)
                )
            },
        )
        .await?;
    let (drained_cluster, drained_ns) = subject.seen.flood_done[phase].clone();
    if drained_cluster != flood_cluster {
        bail!("the flood of {phase} was reconciled in {drained_cluster}, not {flood_cluster}");
    }
    let samples: Vec<Sample> = writes
        .iter()
        .map(|(name, before, after)| {
            let at = subject.seen.samples[name];
            Sample {
                name: name.clone(),
                before_ns: *before,
                after_ns: *after,
                latency_ms: (at - before) as f64 / 1e6,
                during_writes: *before < flood_written,
                during_flood: *before < drained_ns,
            }
        })
        .collect();
    let mut latencies: Vec<f64> = samples.iter().map(|s| s.latency_ms).collect();
    latencies.sort_by(f64::total_cmp);
    let write_ms: Vec<f64> = samples
        .iter()
        .map(|s| (s.after_ns - s.before_ns) as f64 / 1e6)
        .collect();
    let result = Fairness {
        cost_ms,
        flood: args.flood,
        flood_writes_s,
        flood_writes_per_s: args.flood as f64 / flood_writes_s,
        flood_drained_s: (drained_ns - flood_started) as f64 / 1e9,
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(f64::NAN),
        write_p50_ms: median(write_ms),
        samples_during_writes: samples.iter().filter(|s| s.during_writes).count(),
        samples_during_flood: samples.iter().filter(|s| s.during_flood).count(),
        samples,
    };
    info!(
        phase,
        cost_ms,
        p50_ms = result.p50_ms,
        p99_ms = result.p99_ms,
        max_ms = result.max_ms,
        flood_drained_s = result.flood_drained_s,
        samples_during_flood = result.samples_during_flood,
        "fairness phase done"
    );
    Ok(result)
}

/// One subject through the three measurements.
async fn run_subject(
    args: &Args,
    topology: &Topology,
    setup: Setup,
    subject: Subject,
    run: usize,
    position: usize,
    binaries: &(PathBuf, PathBuf),
) -> anyhow::Result<SubjectRun> {
    let tag = format!("r{run}{}", subject.short());
    let run_dir = args.work_dir.join(format!("{}-{tag}", setup.name()));
    if run_dir.exists() {
        std::fs::remove_dir_all(&run_dir)
            .with_context(|| format!("removing {}", run_dir.display()))?;
    }
    let clusters_dir = run_dir.join("clusters");
    std::fs::create_dir_all(&clusters_dir)
        .with_context(|| format!("creating {}", clusters_dir.display()))?;
    let log = run_dir.join("subject.log");
    let mut subject_args = topology.subject_args(&clusters_dir);
    subject_args.extend(
        [
            "--workers".to_owned(),
            args.workers.to_string(),
            "--objects".to_owned(),
            args.objects.to_string(),
            "--flood".to_owned(),
            args.flood.to_string(),
        ]
        .map(OsString::from),
    );
    let load_before = load_average();
    info!(setup = setup.name(), subject = subject.name(), run, position, load = %load_before, "starting the subject with no cluster");
    let timeout = Duration::from_secs(args.timeout_s);
    let mut running =
        Running::spawn(binary_of(subject, binaries), &subject_args, &log, timeout).await?;
    running
        .wait_for(
            "the subject to be ready",
            |seen| seen.ready.is_some(),
            |_| "not ready".to_owned(),
        )
        .await?;
    let workers = running
        .seen
        .ready
        .as_ref()
        .map(|(_, workers)| workers.clone())
        .unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(args.settle_s)).await;
    let baseline = running.resident().await;
    let baseline_rss_kib = baseline.all_kib;
    info!(
        baseline_rss_mib = baseline_rss_kib as f64 / 1024.0,
        baseline_anonymous_mib = baseline.anonymous_kib as f64 / 1024.0,
        "the subject's memory with no cluster"
    );

    // 1. Memory: every member added, each synced.
    let members = topology.members();
    let added = unix_nanos();
    topology.add_members(&clusters_dir).await?;
    info!(clusters = members.len(), "members added");
    running
        .wait_for(
            "every member to reconcile all its initial objects",
            |seen| members.iter().all(|m| seen.synced.contains_key(m)),
            |seen| {
                format!(
                    "{} engaged, {} synced of {}",
                    seen.engaged.len(),
                    members
                        .iter()
                        .filter(|m| seen.synced.contains_key(*m))
                        .count(),
                    members.len()
                )
            },
        )
        .await?;
    let last_synced = members
        .iter()
        .filter_map(|m| running.seen.synced.get(m))
        .copied()
        .max()
        .unwrap_or(added);
    let all_synced_s = (last_synced - added) as f64 / 1e9;
    info!(
        all_synced_s,
        clusters = members.len(),
        "every member synced"
    );
    tokio::time::sleep(Duration::from_secs(args.settle_s)).await;
    let synced = running.resident().await;
    let synced_rss_kib = synced.all_kib;
    let connections = tcp_connections(running.pid);
    let per_cluster_kib = (synced_rss_kib as f64 - baseline_rss_kib as f64) / members.len() as f64;
    let per_cluster_anonymous_kib =
        (synced.anonymous_kib as f64 - baseline.anonymous_kib as f64) / members.len() as f64;
    info!(
        synced_rss_mib = synced_rss_kib as f64 / 1024.0,
        per_cluster_kib,
        per_cluster_anonymous_kib,
        connections,
        "the subject's memory with every member synced"
    );

    // 2. Appearance: one more cluster at a time.
    let mut appearances = Vec::new();
    for i in 0..topology.appear_samples(args) {
        if setup == Setup::Real {
            // The directory is read every 2 s, and this driver's pauses are whole seconds:
            // a random pause puts the new file at a random phase of the subject's poll.
            let jitter = Duration::from_millis((unix_nanos() / 1_000 % 2_000) as u64);
            info!(
                jitter_ms = jitter.as_millis(),
                "pausing before the next cluster, for a random phase of the directory poll"
            );
            tokio::time::sleep(jitter).await;
        }
        let (cluster, announced) = topology.add_extra(&clusters_dir, i).await?;
        let name = cluster.clone();
        running
            .wait_for(
                &format!("cluster {cluster} to be reconciled"),
                |seen| seen.first.contains_key(&name) && seen.synced.contains_key(&name),
                |seen| {
                    format!(
                        "engaged: {}, first reconcile: {}, synced: {}",
                        seen.engaged.contains_key(&name),
                        seen.first.contains_key(&name),
                        seen.synced.contains_key(&name)
                    )
                },
            )
            .await?;
        let since = |at: Option<&i64>| at.map_or(f64::NAN, |at| (at - announced) as f64 / 1e9);
        let appearance = Appearance {
            engaged_s: since(running.seen.engaged.get(&cluster)),
            first_reconcile_s: since(running.seen.first.get(&cluster)),
            synced_s: since(running.seen.synced.get(&cluster)),
            cluster,
        };
        info!(
            cluster = %appearance.cluster,
            engaged_s = appearance.engaged_s,
            first_reconcile_s = appearance.first_reconcile_s,
            synced_s = appearance.synced_s,
            "a cluster appeared"
        );
        appearances.push(appearance);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // 3. Fairness.
    let mut phases = Vec::new();
    for (i, cost) in args.costs_ms.iter().enumerate() {
        let phase = format!("{tag}p{i}");
        phases.push(fairness(args, topology, &mut running, &phase, *cost).await?);
        tokio::time::sleep(Duration::from_secs(args.settle_s)).await;
    }
    let load_after = load_average();
    running.stop().await;
    info!(
        setup = setup.name(),
        subject = subject.name(),
        "cleaning up"
    );
    topology.clean().await?;
    Ok(SubjectRun {
        setup,
        run,
        position,
        subject,
        workers,
        clusters: members.len(),
        baseline_rss_kib,
        synced_rss_kib,
        per_cluster_kib,
        baseline_anonymous_kib: baseline.anonymous_kib,
        synced_anonymous_kib: synced.anonymous_kib,
        per_cluster_anonymous_kib,
        connections,
        all_synced_s,
        appearances,
        fairness: phases,
        load_before,
        load_after,
        log,
    })
}

fn mib(kib: f64) -> f64 {
    kib / 1024.0
}

/// The Markdown report.
fn markdown(report: &Report) -> String {
    let args = &report.args;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Fleet: kube-informer's `Fleet` beside client-go\n\n`{}` on {} ({}).\n",
        report.command, report.date, report.machine
    );
    let _ = writeln!(
        out,
        "Machine: {} CPUs in /proc/cpuinfo, {}. Versions: {}.\n",
        report.cpus, report.cpu_model, report.versions
    );
    let mut seen_workers = Vec::new();
    for run in &report.runs {
        if !seen_workers.contains(&(run.subject, run.workers.clone())) {
            seen_workers.push((run.subject, run.workers.clone()));
        }
    }
    for (subject, workers) in &seen_workers {
        let _ = writeln!(out, "- {}: {workers}.", subject.name());
    }
    let loads: Vec<String> = report
        .runs
        .iter()
        .map(|r| {
            format!(
                "{}/{}: {} → {}",
                r.setup.name(),
                r.subject.name(),
                r.load_before,
                r.load_after
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "- Load average (1/5/15 min) before → after each subject: {}.\n",
        loads.join("; ")
    );
    for setup in &args.setup {
        let runs: Vec<&SubjectRun> = report.runs.iter().filter(|r| r.setup == *setup).collect();
        if runs.is_empty() {
            continue;
        }
        let clusters = runs[0].clusters;
        let _ = match setup {
            Setup::Real => writeln!(
                out,
                "### real: {clusters} control planes as kubeconfig files in a directory, {} ConfigMaps each (+ the API server's own)\n",
                args.objects
            ),
            Setup::Namespaces => writeln!(
                out,
                "### namespaces: {clusters} namespaces of one control plane, {} ConfigMaps each\n",
                args.objects
            ),
        };
        let _ = writeln!(
            out,
            "| subject | runs | memory per engaged cluster (MiB) | anonymous memory per engaged cluster (MiB) | RSS no cluster → all synced (MiB) | anonymous no cluster → all synced (MiB) | all members synced (s) | TCP connections (all synced) | appearance → engaged (s, median) | engaged → first reconcile (s, median) | appearance → first reconcile (s): median [min – max], n |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
        for subject in &args.subjects {
            let mine: Vec<&&SubjectRun> = runs.iter().filter(|r| r.subject == *subject).collect();
            if mine.is_empty() {
                continue;
            }
            let per_cluster = median(mine.iter().map(|r| mib(r.per_cluster_kib)).collect());
            let baseline = median(
                mine.iter()
                    .map(|r| mib(r.baseline_rss_kib as f64))
                    .collect(),
            );
            let synced = median(mine.iter().map(|r| mib(r.synced_rss_kib as f64)).collect());
            let per_cluster_anonymous = median(
                mine.iter()
                    .map(|r| mib(r.per_cluster_anonymous_kib))
                    .collect(),
            );
            let baseline_anonymous = median(
                mine.iter()
                    .map(|r| mib(r.baseline_anonymous_kib as f64))
                    .collect(),
            );
            let synced_anonymous = median(
                mine.iter()
                    .map(|r| mib(r.synced_anonymous_kib as f64))
                    .collect(),
            );
            let all_synced = median(mine.iter().map(|r| r.all_synced_s).collect());
            let connections = mine
                .iter()
                .map(|r| {
                    r.connections
                        .map_or_else(|| "?".to_owned(), |n| n.to_string())
                })
                .collect::<Vec<_>>()
                .join(", ");
            let appear: Vec<&Appearance> = mine.iter().flat_map(|r| &r.appearances).collect();
            let engaged = median(appear.iter().map(|a| a.engaged_s).collect());
            let engaged_to_first = median(
                appear
                    .iter()
                    .map(|a| a.first_reconcile_s - a.engaged_s)
                    .collect(),
            );
            let mut first: Vec<f64> = appear.iter().map(|a| a.first_reconcile_s).collect();
            first.sort_by(f64::total_cmp);
            let _ = writeln!(
                out,
                "| {} | {} | {:.3} | {:.3} | {:.1} → {:.1} | {:.1} → {:.1} | {:.2} | {} | {:.2} | {:.3} | {:.2} [{:.2} – {:.2}], {} |",
                subject.name(),
                mine.len(),
                per_cluster,
                per_cluster_anonymous,
                baseline,
                synced,
                baseline_anonymous,
                synced_anonymous,
                all_synced,
                connections,
                engaged,
                engaged_to_first,
                median(first.clone()),
                first.first().copied().unwrap_or(f64::NAN),
                first.last().copied().unwrap_or(f64::NAN),
                first.len()
            );
        }
        let _ = writeln!(
            out,
            "\nFairness: {} creates in one cluster by {} writers, while one create every {} ms in another is timed ({} samples per phase, from {} ms after the flood starts); latency from just before the create to the end of its reconcile. The reconcile reads the object from the cache; with work W > 0 ms it then sleeps W ms (a stand-in for a call to an API server), so that the flood outruns the {} workers and queues up. Target for kube-informer: p99 ≤ 1 s.\n",
            args.flood,
            args.flood_writers,
            args.sample_every_ms,
            args.samples,
            args.sample_delay_ms,
            args.workers
        );
        let _ = writeln!(
            out,
            "| subject | reconcile work (ms) | p50 (ms) | p99 (ms) | max (ms) | samples written while the flood was written / before it was all reconciled | sample create p50 (ms) | flood written in (s) | flood creates/s | flood all reconciled (s after its first write) |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
        for cost in &args.costs_ms {
            for subject in &args.subjects {
                let phases: Vec<&Fairness> = runs
                    .iter()
                    .filter(|r| r.subject == *subject)
                    .flat_map(|r| &r.fairness)
                    .filter(|f| f.cost_ms == *cost)
                    .collect();
                if phases.is_empty() {
                    continue;
                }
                let mut latencies: Vec<f64> = phases
                    .iter()
                    .flat_map(|f| f.samples.iter().map(|s| s.latency_ms))
                    .collect();
                latencies.sort_by(f64::total_cmp);
                let during: usize = phases.iter().map(|f| f.samples_during_flood).sum();
                let writing: usize = phases.iter().map(|f| f.samples_during_writes).sum();
                let total: usize = phases.iter().map(|f| f.samples.len()).sum();
                let _ = writeln!(
                    out,
                    "| {} | {} | {:.1} | {:.1} | {:.1} | {writing} / {during} of {total} | {:.1} | {:.1} | {:.0} | {:.1} |",
                    subject.name(),
                    cost,
                    percentile(&latencies, 0.50),
                    percentile(&latencies, 0.99),
                    latencies.last().copied().unwrap_or(f64::NAN),
                    median(phases.iter().map(|f| f.write_p50_ms).collect()),
                    median(phases.iter().map(|f| f.flood_writes_s).collect()),
                    median(phases.iter().map(|f| f.flood_writes_per_s).collect()),
                    median(phases.iter().map(|f| f.flood_drained_s).collect()),
                );
            }
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(
        out,
        "Memory is VmRSS (/proc/<pid>/status, median of 5 reads 1 s apart, {} s after the last change) with every member synced, minus the same process's VmRSS before any cluster was added, divided by the members; TCP connections are the subject's established ones then (each run's). Medians over runs; latency percentiles over every sample of every run (nearest rank). Real clusters are found by reading the directory every 2 s (both subjects), so up to 2 s of their appearance time is the poll's phase.",
        args.settle_s
    );
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    benches::init_tracing("info,kube_client=off");
    let args = Args::parse();
    args.check()?;
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    std::fs::create_dir_all(&args.work_dir)
        .with_context(|| format!("creating --work-dir {}", args.work_dir.display()))?;
    if let Some(dir) = args.report.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the directory of --report {}", dir.display()))?;
    }
    let binaries = binaries()?;
    let (cpu_model, cpus) = cpuinfo();
    let mut report = Report {
        command,
        date: command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        machine: machine(),
        cpu_model,
        cpus,
        versions: versions(),
        args: args.clone(),
        runs: Vec::new(),
    };
    info!(machine = %report.machine, load = %load_average(), "fleet-bench");
    let mut turn = 0;
    for setup in &args.setup {
        let topology = Topology::set_up(&args, *setup).await?;
        for run in 0..args.runs {
            let mut order = args.subjects.clone();
            if turn % 2 == 1 {
                order.reverse();
            }
            turn += 1;
            for (position, subject) in order.iter().enumerate() {
                let result =
                    run_subject(&args, &topology, *setup, *subject, run, position, &binaries)
                        .await
                        .with_context(|| {
                            format!(
                                "{} in the {} setup, run {run}",
                                subject.name(),
                                setup.name()
                            )
                        })?;
                report.runs.push(result);
                // Written after every subject, so a later failure loses nothing.
                std::fs::write(&args.report, serde_json::to_string_pretty(&report)?)
                    .with_context(|| format!("writing {}", args.report.display()))?;
                tokio::time::sleep(Duration::from_secs(args.settle_s)).await;
            }
        }
        info!(setup = setup.name(), "stopping the setup's control planes");
        drop(topology);
    }
    std::fs::write(&args.report, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", args.report.display()))?;
    info!(report = %args.report.display(), "done");
    print!("{}", markdown(&report));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_map_is_a_few_hundred_bytes() {
        let cm = config_map("cm-00001", Some("flood"), Some(20));
        let bytes = serde_json::to_vec(&cm).map(|v| v.len()).unwrap_or(0);
        assert!((300..700).contains(&bytes), "{bytes} bytes");
        assert_eq!(
            cm.metadata
                .annotations
                .and_then(|a| a.get(COST_ANNOTATION).cloned()),
            Some("20".to_owned())
        );
    }

    #[test]
    fn the_arguments_parse() {
        let args = Args::try_parse_from([
            "fleet-bench",
            "--setup",
            "real,namespaces",
            "--costs-ms",
            "0,5",
        ]);
        assert!(args.is_ok_and(|a| a.check().is_ok() && a.costs_ms == vec![0, 5]));
    }
}
