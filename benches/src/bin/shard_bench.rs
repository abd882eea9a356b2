//! `shard-bench`: one informer's Pods split across 1, 2 and 3 replicas by Kubernetes'
//! sharded list and watch, beside the unsharded default, each replica its own process.
//!
//! It starts a local control plane (with the `ShardedListAndWatch` gate, unless
//! `--gate off`), applies the Pods, then for each layout starts its replicas
//! (`subject-shard`) at once and waits until every one has synced. Per replica it reports
//! the time to sync, the objects cached, the resident memory once synced (VmRSS), and the
//! bytes its sockets received (the TLS stream from the API server, from iproute2's `ss`).
//! The largest replica of each layout is what a user provisions for.

use std::{
    fmt::Write as _,
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use benches::{machine, median, memory_of};
use clap::{Parser, ValueEnum};
use k8s_openapi::api::core::v1::Pod;
use kube_client::Api;
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
    /// Runs of each layout.
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

/// Bytes the process's TCP sockets have received so far (`bytes_received` of each, from
/// iproute2's `ss`): the TLS stream from the API server.
fn bytes_received(pid: u32) -> anyhow::Result<u64> {
    let output = std::process::Command::new("ss")
        .args(["-tinpH"])
        .output()
        .context("running `ss` (iproute2)")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let owner = format!("pid={pid},");
    let mut ours = false;
    let mut total = 0;
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            ours = line.contains(&owner);
            continue;
        }
        if ours {
            total += line
                .split_whitespace()
                .find_map(|field| field.strip_prefix("bytes_received:"))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(total)
}

fn subject_binary() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let path = me.with_file_name("subject-shard");
    if !path.exists() {
        bail!(
            "{} is missing: build it with `cargo build --release -p benches --bin subject-shard`",
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

fn report(args: &Args, replicas: &[Replica]) -> String {
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
        "| layout | objects per replica (max) | sync (s, slowest) | RSS (MiB, largest) | received (MiB, largest) | RSS / unsharded | received / unsharded | shard applied by |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
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
            "| {name} | {:.0} | {:.2} | {:.1} | {:.1} | {:.2} | {:.2} | {mode} |",
            largest(layout, |r| r.objects as f64),
            largest(layout, |r| r.synced_ms / 1e3),
            rss,
            read,
            rss / base_rss,
            read / base_read,
        );
    }
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    benches::init_tracing("info,kube_client=off");
    let args = Args::parse();
    if args.runs == 0 || args.pods == 0 || args.replicas.contains(&0) {
        bail!("--runs and --pods must be at least 1, and every replica count too");
    }
    subject_binary()?;
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
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.json, serde_json::to_string_pretty(&replicas)?)?;
    print!("{}", report(&args, &replicas));
    Ok(())
}
