//! `shard-bench`: one informer's Pods split across 1, 2 and 3 replicas by Kubernetes'
//! sharded list and watch, beside the unsharded default, each replica its own process.
//!
//! It starts a local control plane (with the `ShardedListAndWatch` gate, unless
//! `--gate off`), applies the Pods, then for each layout starts its replicas
//! (`subject-shard`) at once and waits until every one has synced. Per replica it reports
//! the time to sync, the objects cached, the resident memory once synced (VmRSS), and the
//! bytes its sockets received (the TLS stream from the API server, from iproute2's `ss`).
//! The largest replica of each layout is what a user provisions for.
//!
//! Then the handover: three replicas of a sharded controller of the Pods
//! (`subject-ring`, a shard ring with the library's defaults) reconcile every Pod; one is
//! killed with SIGKILL, and the time is taken until the others hold its slots and until
//! they have reconciled every Pod it had (from each replica's record of its reconciles).

use std::{
    fmt::Write as _,
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use benches::{bytes_received, machine, median, memory_of};
use clap::{Parser, ValueEnum};
use std::collections::BTreeMap;

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Pod};
use kube_client::{Api, api::ListParams};
use kube_informer::sharding::RING_LABEL;
use kube_testenv::TestEnv;
use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};
use tracing::info;

/// Whether the API server applies shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
enum Gate {
    /// `--feature-gates=ShardedListAndWatch=true`: the server sends each replica its shard.
    On,
    /// The default server: each replica receives every Pod and keeps its shard.
    Off,
}

/// Splits one informer's Pods across replicas by sharded list and watch.
#[derive(Debug, Clone, Parser)]
#[command(name = "shard-bench")]
struct Args {
    /// Pods in the namespace.
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// Runs of each layout (0 runs the handover alone).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Replica counts to run, beside the unsharded default.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    replicas: Vec<usize>,
    /// Whether the API server applies the shards.
    #[arg(long, value_enum, default_value = "on")]
    gate: Gate,
    /// Concurrent applies while creating the Pods.
    #[arg(long, default_value_t = 64)]
    create_concurrency: usize,
    /// Where the per-replica results go, as JSON.
    #[arg(long, default_value = "target/shard-bench.json")]
    json: PathBuf,
    /// Runs of the handover after a SIGKILL (0 skips it).
    #[arg(long, default_value_t = 3)]
    handover_runs: usize,
    /// The ring's lease duration in the handover runs, in seconds (the library's default).
    #[arg(long, default_value_t = 15.0)]
    lease_seconds: f64,
}

/// One handover run: a replica of three killed.
#[derive(Debug, Clone, Serialize)]
struct Handover {
    run: usize,
    victim_pods: usize,
    /// From the kill until no slot was held by the killed replica and every slot was held.
    slots_moved_s: f64,
    /// From the kill until the last of the killed replica's Pods was reconciled elsewhere.
    reconciled_s: f64,
}

#[derive(Debug, Deserialize)]
struct SubjectLine {
    synced_ms: f64,
    objects: usize,
    shard_mode: Option<String>,
}

/// One replica of one run of one layout.
#[derive(Debug, Clone, Serialize)]
struct Replica {
    /// 0: the unsharded default.
    layout: usize,
    run: usize,
    index: usize,
    synced_ms: f64,
    objects: usize,
    shard_mode: Option<String>,
    rss_mib: f64,
    read_mib: f64,
}

fn subject_binary() -> anyhow::Result<PathBuf> {
    sibling_binary("subject-shard")
}

fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let path = me.with_file_name(name);
    if !path.exists() {
        bail!(
            "{} is missing: build it with `cargo build --release -p benches --bin {name}`",
            path.display()
        );
    }
    Ok(path)
}

async fn run_layout(
    env: &TestEnv,
    namespace: &str,
    layout: usize,
    run: usize,
) -> anyhow::Result<Vec<Replica>> {
    let binary = subject_binary()?;
    let replicas = layout.max(1);
    let mut children: Vec<Child> = Vec::new();
    for index in 0..replicas {
        let mut command = Command::new(&binary);
        command
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args(["--namespace", namespace]);
        if layout > 0 {
            command.args([
                "--shards",
                &layout.to_string(),
                "--index",
                &index.to_string(),
            ]);
        }
        let child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        children.push(child);
    }
    let mut results = Vec::new();
    for (index, child) in children.iter_mut().enumerate() {
        let stdout = child.stdout.take().context("the subject's stdout")?;
        let mut line = String::new();
        let read = tokio::time::timeout(
            Duration::from_secs(600),
            BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .context("a replica did not sync within 10 minutes")??;
        if read == 0 {
            bail!("replica {index} of layout {layout} exited before it synced");
        }
        let synced: SubjectLine = serde_json::from_str(line.trim())
            .with_context(|| format!("parsing the replica's line {line:?}"))?;
        results.push(synced);
    }
    // Every replica has synced; let the allocator settle before reading memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut replicas_out = Vec::new();
    for (index, (child, synced)) in children.iter().zip(results).enumerate() {
        let pid = child.id().context("the replica's pid")?;
        let (rss_kib, _) = memory_of(&pid.to_string());
        replicas_out.push(Replica {
            layout,
            run,
            index,
            synced_ms: synced.synced_ms,
            objects: synced.objects,
            shard_mode: synced.shard_mode,
            rss_mib: rss_kib as f64 / 1024.0,
            read_mib: bytes_received(pid)? as f64 / (1024.0 * 1024.0),
        });
    }
    for mut child in children {
        drop(child.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        let _ = child.kill().await;
    }
    Ok(replicas_out)
}

fn report(args: &Args, replicas: &[Replica], idle_rss: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "`shard-bench --pods {} --runs {} --gate {:?}` on {}; medians over runs of the largest replica of each layout.\n",
        args.pods,
        args.runs,
        args.gate,
        machine()
    );
    let _ = writeln!(
        out,
        "| layout | objects per replica (max) | sync (s, slowest) | RSS (MiB, largest) | received (MiB, largest) | RSS / unsharded | cache RSS / unsharded's | received / unsharded | shard applied by |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    let layouts: Vec<usize> = std::iter::once(0)
        .chain(args.replicas.iter().copied())
        .collect();
    let largest = |layout: usize, f: fn(&Replica) -> f64| {
        let per_run = (0..args.runs)
            .map(|run| {
                replicas
                    .iter()
                    .filter(|r| r.layout == layout && r.run == run)
                    .map(f)
                    .fold(0.0, f64::max)
            })
            .collect();
        median(per_run)
    };
    let base_rss = largest(0, |r| r.rss_mib);
    let base_read = largest(0, |r| r.read_mib);
    for layout in layouts {
        let name = match layout {
            0 => "unsharded".to_owned(),
            n => format!("{n} replica{}", if n == 1 { "" } else { "s" }),
        };
        let mode = replicas
            .iter()
            .find(|r| r.layout == layout)
            .and_then(|r| r.shard_mode.clone())
            .unwrap_or_else(|| "-".to_owned());
        let rss = largest(layout, |r| r.rss_mib);
        let read = largest(layout, |r| r.read_mib);
        let _ = writeln!(
            out,
            "| {name} | {:.0} | {:.2} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {mode} |",
            largest(layout, |r| r.objects as f64),
            largest(layout, |r| r.synced_ms / 1e3),
            rss,
            read,
            rss / base_rss,
            (rss - idle_rss) / (base_rss - idle_rss),
            read / base_read,
        );
    }
    out
}

/// A replica's record of its reconciles, read as it grows.
struct ReconcileLog {
    path: PathBuf,
    offset: usize,
    /// Each key with when its reconciles ended.
    ended: Vec<(String, i64)>,
}

#[derive(Deserialize)]
struct LogLine {
    key: String,
    ended_ns: i64,
}

impl ReconcileLog {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            offset: 0,
            ended: Vec::new(),
        }
    }

    /// Reads the complete lines written since the last read (only those bytes).
    fn read(&mut self) {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return;
        };
        let mut bytes = Vec::new();
        if file.seek(SeekFrom::Start(self.offset as u64)).is_err()
            || file.read_to_end(&mut bytes).is_err()
        {
            return;
        }
        let Some(last_newline) = bytes.iter().rposition(|b| *b == b'\n') else {
            return;
        };
        for line in bytes[..=last_newline].split(|b| *b == b'\n') {
            if let Ok(record) = serde_json::from_slice::<LogLine>(line) {
                self.ended.push((record.key, record.ended_ns));
            }
        }
        self.offset += last_newline + 1;
    }
}

/// Whether the ring's slot Leases are held by `live` alone, in equal shares (16 slots).
async fn ring_settled(leases: &Api<Lease>, ring: &str, live: &[String]) -> anyhow::Result<bool> {
    let list = leases
        .list(&ListParams::default().labels(&format!("{RING_LABEL}={ring}")))
        .await?;
    let mut held: BTreeMap<String, usize> = BTreeMap::new();
    for lease in &list.items {
        let name = lease.metadata.name.as_deref().unwrap_or_default();
        if !name.starts_with(&format!("{ring}-slot-")) {
            continue;
        }
        if let Some(holder) = lease.spec.as_ref().and_then(|s| s.holder_identity.clone()) {
            *held.entry(holder).or_default() += 1;
        }
    }
    let fair = 16 / live.len();
    Ok(held.keys().cloned().collect::<Vec<_>>() == live
        && held.values().all(|n| *n == fair || *n == fair + 1)
        && held.values().sum::<usize>() == 16)
}

async fn handover_run(
    env: &TestEnv,
    namespace: &str,
    pods: usize,
    run: usize,
    lease_seconds: f64,
) -> anyhow::Result<Handover> {
    let binary = sibling_binary("subject-ring")?;
    let dir =
        std::env::temp_dir().join(format!("shard-bench-handover-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ring = format!("handover-{run}");
    let identities: Vec<String> = (0..3).map(|i| format!("replica-{i}")).collect();
    let mut children = Vec::new();
    let mut logs = Vec::new();
    for identity in &identities {
        let log = dir.join(format!("{identity}.jsonl"));
        let stderr = std::fs::File::create(dir.join(format!("{identity}.err")))?;
        let child = Command::new(&binary)
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args([
                "--namespace",
                namespace,
                "--ring",
                &ring,
                "--identity",
                identity,
            ])
            .args(["--lease-seconds", &lease_seconds.to_string()])
            .arg("--reconcile-log")
            .arg(&log)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        children.push(child);
        logs.push(ReconcileLog::new(log));
    }
    let leases: Api<Lease> = Api::namespaced(env.client().await?, namespace);
    let patience = Instant::now();
    loop {
        let mut keys = std::collections::HashSet::new();
        for log in &mut logs {
            log.read();
            keys.extend(log.ended.iter().map(|(k, _)| k.clone()));
        }
        if keys.len() == pods && ring_settled(&leases, &ring, &identities).await? {
            break;
        }
        if patience.elapsed() > Duration::from_secs(600) {
            bail!(
                "the ring did not reconcile every Pod and settle within 10 minutes (logs in {})",
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let victim_keys: std::collections::HashSet<String> =
        logs[0].ended.iter().map(|(k, _)| k.clone()).collect();
    let mut victim = children.remove(0);
    victim.start_kill()?;
    let killed_ns = benches::unix_nanos();
    let killed = Instant::now();
    victim.wait().await?;
    info!(run, pods = victim_keys.len(), "killed a replica");
    let survivors = &identities[1..];
    let mut slots_moved = None;
    let mut reconciled = std::collections::HashMap::new();
    // How many of each survivor's records have been looked at.
    let mut looked = vec![0; logs.len()];
    loop {
        for (log, looked) in logs.iter_mut().zip(&mut looked).skip(1) {
            log.read();
            let new = &log.ended[*looked..];
            *looked = log.ended.len();
            for (key, ended) in new {
                if *ended > killed_ns && victim_keys.contains(key) {
                    let first = reconciled.entry(key.clone()).or_insert(*ended);
                    *first = (*first).min(*ended);
                }
            }
        }
        if slots_moved.is_none() && ring_settled(&leases, &ring, survivors).await? {
            slots_moved = Some(killed.elapsed());
        }
        if slots_moved.is_some() && reconciled.len() == victim_keys.len() {
            break;
        }
        if killed.elapsed() > Duration::from_secs(300) {
            bail!(
                "{} of the killed replica's {} Pods reconciled elsewhere after 5 minutes (logs in {})",
                reconciled.len(),
                victim_keys.len(),
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last = reconciled.values().copied().max().unwrap_or(killed_ns);
    for mut child in children {
        drop(child.stdin.take());
        let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
        let _ = child.kill().await;
    }
    info!(logs = %dir.display(), "handover run done");
    Ok(Handover {
        run,
        victim_pods: victim_keys.len(),
        slots_moved_s: slots_moved.unwrap_or_default().as_secs_f64(),
        reconciled_s: (last - killed_ns) as f64 / 1e9,
    })
}

fn handover_report(args: &Args, runs: &[Handover]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nHandover after a SIGKILL: 3 replicas of a sharded controller of the {} Pods (`subject-ring`), lease {} s (renew deadline {:.0} s, retry {:.0} s), {} runs.\n",
        args.pods,
        args.lease_seconds,
        args.lease_seconds * 2.0 / 3.0,
        args.lease_seconds * 2.0 / 15.0,
        runs.len()
    );
    let _ = writeln!(
        out,
        "| run | killed replica's Pods | slots held by the others (s after kill) | its Pods reconciled by the others (s after kill) | target (lease + 2 s) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    for h in runs {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.2} | {:.0} |",
            h.run,
            h.victim_pods,
            h.slots_moved_s,
            h.reconciled_s,
            args.lease_seconds + 2.0
        );
    }
    let _ = writeln!(
        out,
        "| median | | {:.2} | {:.2} | |",
        median(runs.iter().map(|h| h.slots_moved_s).collect()),
        median(runs.iter().map(|h| h.reconciled_s).collect())
    );
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    benches::init_tracing("info,kube_client=off");
    let args = Args::parse();
    if (args.runs == 0 && args.handover_runs == 0) || args.pods == 0 || args.replicas.contains(&0) {
        bail!(
            "--pods must be at least 1, and every replica count too; --runs 0 needs handover runs"
        );
    }
    subject_binary()?;
    if args.handover_runs > 0 {
        sibling_binary("subject-ring")?;
    }
    info!(gate = ?args.gate, "starting the control plane");
    let mut builder = TestEnv::builder();
    if args.gate == Gate::On {
        builder = builder.apiserver_arg("--feature-gates=ShardedListAndWatch=true");
    }
    let env = builder
        .start()
        .await
        .context("starting the control plane")?;
    let client = env.client().await?;
    let namespace = env.create_namespace("shard-bench").await?;
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let started = Instant::now();
    benches::create_pods(&pods, args.pods, args.create_concurrency, "shard-bench").await?;
    info!(
        pods = args.pods,
        elapsed_s = started.elapsed().as_secs(),
        "Pods created"
    );

    let mut replicas = Vec::new();
    for run in 0..args.runs {
        for layout in std::iter::once(0).chain(args.replicas.iter().copied()) {
            info!(run, layout, "starting replicas");
            let done = run_layout(&env, &namespace, layout, run).await?;
            let cached: usize = done.iter().map(|r| r.objects).sum();
            if cached != args.pods {
                bail!(
                    "layout {layout}: the replicas cached {cached} Pods, not {}",
                    args.pods
                );
            }
            replicas.extend(done);
        }
    }
    // The same subject over an empty namespace: what a replica costs before its cache.
    let mut idle = Vec::new();
    if args.runs > 0 {
        let empty = env.create_namespace("shard-bench-idle").await?;
        for run in 0..args.runs {
            let done = run_layout(&env, &empty, 0, run).await?;
            idle.extend(done.iter().map(|r| r.rss_mib));
        }
    }
    let idle_rss = median(idle);
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&replicas)?)?;
    if args.runs > 0 {
        print!("{}", report(&args, &replicas, idle_rss));
        println!(
            "\nAn idle replica (the same subject over an empty namespace): {idle_rss:.1} MiB RSS; \"cache RSS\" is a replica's RSS above it."
        );
    }
    if args.handover_runs > 0 {
        let mut handovers = Vec::new();
        for run in 0..args.handover_runs {
            info!(run, "handover run");
            handovers
                .push(handover_run(&env, &namespace, args.pods, run, args.lease_seconds).await?);
        }
        print!("{}", handover_report(&args, &handovers));
    }
    Ok(())
}
