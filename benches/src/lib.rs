//! Benchmarks of kube-informer; see `benches/` (criterion) and `src/bin` (the informer
//! benchmark: subjects and the `informer-bench` driver).
//!
//! This library holds what the subject processes share: their command line and the JSON
//! lines they print; the workqueue cases ([`workqueue_cases`]) and the driver's workqueue
//! comparison ([`workqueue_report`]); the lines the `recovery-bench` subjects print
//! ([`recovery`]); and the description of the machine and versions the
//! reports carry.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Instant,
};

use clap::Parser;
use serde::{Deserialize, Serialize};

pub mod faults;
pub mod floor;
pub mod recovery;
pub mod workqueue_cases;
pub mod workqueue_report;

/// The label whose value identifies one update of the update-latency scenario.
pub const UPDATE_LABEL: &str = "bench-update";

/// The command line every subject takes.
#[derive(Debug, Parser)]
pub struct SubjectArgs {
    /// The kubeconfig file of the control plane.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// The namespace whose Pods to cache.
    #[arg(long)]
    pub namespace: String,
    /// Report synced once this many Pods are cached.
    #[arg(long)]
    pub expect: usize,
    /// After sync, wait for this many update events carrying the `bench-update` label.
    #[arg(long, default_value_t = 0)]
    pub updates: usize,
}

/// The line a subject prints once synced.
#[derive(Debug, Serialize, Deserialize)]
pub struct SyncedLine {
    /// Which subject.
    pub subject: String,
    /// Milliseconds from the start of `main` to synced with `expect` objects cached.
    pub synced_ms: f64,
    /// VmRSS at that moment, KiB.
    pub rss_kb: u64,
    /// VmHWM (peak RSS) at that moment, KiB.
    pub hwm_kb: u64,
    /// Objects in the cache.
    pub cached: usize,
    /// Add events the handler had seen.
    pub adds: usize,
}

/// The line a subject prints once it has seen every update.
#[derive(Debug, Serialize, Deserialize)]
pub struct UpdatesLine {
    /// Which subject.
    pub subject: String,
    /// Distinct updates seen.
    pub updates: usize,
    /// For each update id (the `bench-update` label's value), when the handler saw it,
    /// Unix nanoseconds.
    pub received: HashMap<String, i64>,
}

/// `(VmRSS, VmHWM)` of this process in KiB, from `/proc/self/status`.
pub fn self_memory() -> (u64, u64) {
    memory_of("self")
}

/// `(VmRSS, VmHWM)` of a process in KiB (`pid` or `self`); zeros if unreadable.
pub fn memory_of(pid: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Now as Unix nanoseconds.
pub fn unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Collects update receipts for a subject and prints the protocol's lines.
#[derive(Debug)]
pub struct Recorder {
    subject: &'static str,
    expected_updates: usize,
    received: std::sync::Mutex<HashMap<String, i64>>,
    done: tokio::sync::Notify,
}

impl Recorder {
    /// A recorder for `subject` waiting for `expected_updates` updates.
    pub fn new(subject: &'static str, expected_updates: usize) -> Self {
        Self {
            subject,
            expected_updates,
            received: std::sync::Mutex::new(HashMap::with_capacity(expected_updates)),
            done: tokio::sync::Notify::new(),
        }
    }

    /// Records that the handler saw a Pod with these labels.
    pub fn saw(&self, labels: Option<&std::collections::BTreeMap<String, String>>) {
        let now = unix_nanos();
        let Some(id) = labels.and_then(|l| l.get(UPDATE_LABEL)) else {
            return;
        };
        if self.expected_updates == 0 {
            return;
        }
        let mut received = self.received.lock().unwrap_or_else(|p| p.into_inner());
        if !received.contains_key(id) {
            received.insert(id.clone(), now);
            if received.len() == self.expected_updates {
                self.done.notify_one();
            }
        }
    }

    /// Prints the synced line.
    pub fn print_synced(&self, started: Instant, cached: usize, adds: usize) {
        let (rss_kb, hwm_kb) = self_memory();
        let line = SyncedLine {
            subject: self.subject.to_owned(),
            synced_ms: started.elapsed().as_secs_f64() * 1000.0,
            rss_kb,
            hwm_kb,
            cached,
            adds,
        };
        println!("{}", serde_json::to_string(&line).expect("serialises"));
    }

    /// Waits for every expected update (if any), prints the updates line, then waits
    /// until stdin closes (the driver reads memory, then closes it or kills the process).
    pub async fn finish(&self) {
        if self.expected_updates > 0 {
            loop {
                let notified = self.done.notified();
                if self
                    .received
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .len()
                    >= self.expected_updates
                {
                    break;
                }
                notified.await;
            }
            let received = self
                .received
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let line = UpdatesLine {
                subject: self.subject.to_owned(),
                updates: received.len(),
                received,
            };
            println!("{}", serde_json::to_string(&line).expect("serialises"));
        }
        let mut sink = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
    }
}

/// Logs to stderr (stdout carries a subject's results) at `default_filter`, unless
/// `RUST_LOG` says otherwise.
pub fn init_tracing(default_filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Builds a kube client from a kubeconfig file.
///
/// # Errors
///
/// If the file cannot be read or turned into a client.
pub async fn client(path: &std::path::Path) -> anyhow::Result<kube_client::Client> {
    Ok(kube_client::Client::try_from(config(path).await?)?)
}

/// The client kube-informer recommends for `path`: HTTP/2 with keep-alive pings
/// ([`kube_informer::client`]).
///
/// # Errors
///
/// When the kubeconfig cannot be read or is unusable.
pub async fn informer_client(path: &std::path::Path) -> anyhow::Result<kube_client::Client> {
    Ok(kube_informer::client(config(path).await?)?)
}

async fn config(path: &std::path::Path) -> anyhow::Result<kube_client::Config> {
    use kube_client::config::{Config, KubeConfigOptions, Kubeconfig};
    let kubeconfig = Kubeconfig::read_from(path)?;
    Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
}

/// The median of `values`; NaN if there are none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The trimmed standard output of `program args`, or `unknown` if it cannot run.
pub fn command_output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The version of package `name` in the workspace's `Cargo.lock`, or `unknown`.
pub fn lock_version(name: &str) -> String {
    let lock = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock"))
        .unwrap_or_default();
    let needle = format!("name = \"{name}\"\nversion = \"");
    lock.find(&needle)
        .map(|i| {
            let rest = &lock[i + needle.len()..];
            rest[..rest.find('"').unwrap_or(0)].to_owned()
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The client-go version the Go subjects (`go-subject/go.mod`) require, or `unknown`.
pub fn client_go_version() -> String {
    let go_mod = Path::new(env!("CARGO_MANIFEST_DIR")).join("go-subject/go.mod");
    std::fs::read_to_string(go_mod)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.trim().strip_prefix("k8s.io/client-go "))
        .map_or_else(|| "unknown".to_owned(), |v| v.trim().to_owned())
}

/// The machine in one line: CPU model, CPUs, RAM and kernel.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    format!(
        "{model}, {cpus} CPUs, {mem_gib:.1} GiB RAM, Linux {}",
        command_output("uname", &["-r"])
    )
}

/// Builds the Rust subject binaries `bins` with this executable's profile: `cargo run --bin
/// informer-bench` builds only the driver, and a subject must never be stale or missing.
///
/// # Errors
///
/// When the build fails. Without cargo at hand the binaries are used as they are.
pub fn build_rust_subjects(bins: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command
        .args(["build", "-p", "benches"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    for bin in bins {
        command.args(["--bin", bin]);
    }
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    eprintln!("building {}", bins.join(", "));
    match command.status() {
        Ok(status) if !status.success() => {
            anyhow::bail!("cargo build of {} failed: {status}", bins.join(", "))
        }
        Ok(_) => {}
        Err(error) => eprintln!("cannot run cargo ({error}); using the subjects as they are"),
    }
    Ok(())
}
