//! Benchmarks of kube-informer; see `benches/` (criterion) and `src/bin` (the informer
//! benchmark: subjects and the `informer-bench` driver).
//!
//! This library holds what the subject processes share: their command line and the JSON
//! lines they print, and what the reconcile case shares ([`ReconcileLine`],
//! [`reconcile_pods`], [`check_group`]); the workqueue cases ([`workqueue_cases`]) and the
//! driver's workqueue comparison ([`workqueue_report`]); the lines the `recovery-bench`
//! subjects print ([`recovery`]); and the description of the machine and versions the
//! reports carry.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use clap::Parser;
use serde::{Deserialize, Serialize};

pub mod apiserver_gc;
pub mod faults;
pub mod floor;
pub mod recovery;
pub mod workqueue_cases;
pub mod workqueue_report;

/// The label whose value identifies one update of the update-latency scenario.
pub const UPDATE_LABEL: &str = "bench-update";

/// The label every Pod carries with the value `g<i / GROUP_SIZE>`, and the name of the
/// index on it that every subject with indexes registers.
pub const GROUP_LABEL: &str = "bench-group";

/// How many Pods share one value of [`GROUP_LABEL`].
pub const GROUP_SIZE: usize = 100;

/// The label the relist scenario sets on one Pod while the subject is cut off; the
/// subject reports its relist once it has seen that change.
pub const RELIST_LABEL: &str = "bench-relist";

/// The label the reconcile case sets, one Pod at a time; a subject reconciles a Pod each
/// time an update changes it.
pub const RECONCILE_LABEL: &str = "bench-reconcile";

/// The name of the benchmark's `i`th Pod.
pub fn pod_name(i: usize) -> String {
    format!("nginx-{i:05}")
}

/// The [`GROUP_LABEL`] value of the `i`th Pod.
pub fn pod_group(i: usize) -> String {
    format!("g{}", i / GROUP_SIZE)
}

/// The client-go tutorial's nginx Pod, the `i`th of the benchmark, with its group label
/// (shared by [`GROUP_SIZE`] Pods, for the by-index reads).
pub fn nginx_pod(i: usize) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(i),
            "labels": {
                "app": "nginx-app",
                "type": "front-end",
                "language": "c",
                "business-service-type": "web",
                GROUP_LABEL: pod_group(i),
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

/// Applies the benchmark's first `n` Pods ([`nginx_pod`]) server-side as `manager`,
/// `concurrency` at a time, and says how far it got every 10,000.
///
/// # Errors
///
/// The first apply that fails.
pub async fn create_pods(
    pods: &kube_client::Api<k8s_openapi::api::core::v1::Pod>,
    n: usize,
    concurrency: usize,
    manager: &str,
) -> anyhow::Result<()> {
    use anyhow::Context;
    use futures::{StreamExt, TryStreamExt};
    use kube_client::api::{Patch, PatchParams};
    let params = PatchParams::apply(manager).force();
    futures::stream::iter(0..n)
        .map(|i| {
            let name = pod_name(i);
            let params = &params;
            async move {
                pods.patch(&name, params, &Patch::Apply(nginx_pod(i)))
                    .await
                    .with_context(|| format!("applying Pod {name}"))
            }
        })
        .buffer_unordered(concurrency.max(1))
        .enumerate()
        .map(|(done, applied)| {
            if (done + 1) % 10_000 == 0 {
                eprintln!("  {} of {n} Pods created", done + 1);
            }
            applied
        })
        .try_for_each(|_| async { Ok(()) })
        .await
}

/// The Pod whose name sorts last of `n` (lists return objects in key order, so its change
/// is the last one a relist delivers).
pub fn last_pod_name(n: usize) -> String {
    (0..n).map(pod_name).max().unwrap_or_else(|| pod_name(0))
}

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
    /// After the updates and the driver's go-ahead ([`wait_for_go_ahead`]), time this many
    /// gets by random key, full lists and by-index reads of the cache, and print a
    /// [`ReadsLine`] (0 skips).
    #[arg(long, default_value_t = 0)]
    pub reads: usize,
    /// Then the reconcile case: after the driver's next go-ahead it changes the
    /// `bench-reconcile` label this many times ([`reconcile_pods`]); the handler queues the
    /// key of each Pod whose label changed and one worker reconciles each key as a
    /// ReplicaSet controller reads its cache (the Pod by key, then its group by label
    /// selector); once every change was seen and reconciled, print a [`ReconcileLine`]
    /// (0 skips).
    #[arg(long, default_value_t = 0)]
    pub reconciles: usize,
    /// Then wait for a relist: print a [`RelistLine`] once the handler has seen a Pod's
    /// `bench-relist` label set to this value (the driver sets it while the subject is cut
    /// off, on the Pod a list delivers last).
    #[arg(long)]
    pub relist: Option<String>,
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

/// The line a subject prints after timing reads of its cache (`--reads`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReadsLine {
    /// Which subject.
    pub subject: String,
    /// Gets by key timed.
    pub get_samples: usize,
    /// Median of one get by a random key, ns.
    pub get_p50_ns: f64,
    /// 99th percentile of one get by a random key, ns.
    pub get_p99_ns: f64,
    /// Median of one read of a Pod's labels alone ([`PodLabels`]) by the same keys, ns;
    /// `None` for a subject without projected reads (and in results from before them).
    #[serde(default)]
    pub labels_p50_ns: Option<f64>,
    /// 99th percentile of the same, ns.
    #[serde(default)]
    pub labels_p99_ns: Option<f64>,
    /// Median time of one read of every object's labels alone, ms; `None` as for
    /// `labels_p50_ns`.
    #[serde(default)]
    pub labels_list_ms: Option<f64>,
    /// Median time of one read of the labels alone of [`GROUP_SIZE`] objects by index, µs;
    /// `None` as for `labels_p50_ns`.
    #[serde(default)]
    pub labels_by_index_us: Option<f64>,
    /// Median time of one list of every object, ms.
    pub list_ms: f64,
    /// Median time of one by-index read of [`GROUP_SIZE`] objects, µs; `None` for a store
    /// without indexes.
    pub by_index_us: Option<f64>,
    /// Objects the by-index reads returned (each), to check the index.
    pub by_index_len: Option<usize>,
}

/// The line a subject prints once its cache has been filled again by a relist
/// (`--relist`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RelistLine {
    /// Which subject.
    pub subject: String,
    /// Whether the change arrived by a list (and not by a watch that resumed).
    pub relisted: bool,
    /// Objects in the cache then.
    pub cached: usize,
    /// When the change was seen, Unix ns.
    pub at_ns: i64,
}

/// The line a subject prints once it has reconciled every change of the reconcile case
/// (`--reconciles`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReconcileLine {
    /// Which subject.
    pub subject: String,
    /// Update events that changed a Pod's `bench-reconcile` label, each of which queued its
    /// key: the driver's M.
    pub events: usize,
    /// Reconciles the worker ran: fewer than `events` when a queue that collapses
    /// duplicates (client-go's and kube-informer's) held one Pod's key for two changes.
    pub reconciles: usize,
    /// Reconciles per second of the reconciles' own read time (get + list, summed): the
    /// worker's read capacity, whatever pace the API server delivered the events at.
    pub per_second: f64,
    /// `events` per second from the first event to the end of the last reconcile: the pace
    /// of the whole path, API server included.
    pub wall_per_second: f64,
    /// Median of one reconcile's reads (get + list), µs.
    pub read_p50_us: f64,
    /// 99th percentile of the same, µs.
    pub read_p99_us: f64,
    /// VmRSS right after the last reconcile, KiB.
    pub rss_kb: u64,
    /// VmHWM from the go-ahead (the subject resets it then) to the last reconcile, KiB.
    pub hwm_kb: u64,
    /// kube-informer's cache: reads of one object its working set served during the case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_hits: Option<u64>,
    /// kube-informer's cache: reads of one object that decoded it during the case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_misses: Option<u64>,
}

impl ReconcileLine {
    /// The line of `subject` after `events` events and one reconcile per entry of `read_ns`
    /// (each one's read time, ns) in `wall` from the first event to the last reconcile's
    /// end, with this process's memory now: call it right after the last reconcile.
    pub fn now(subject: &str, events: usize, mut read_ns: Vec<f64>, wall: Duration) -> Self {
        let (rss_kb, hwm_kb) = self_memory();
        read_ns.sort_by(f64::total_cmp);
        let read_s = read_ns.iter().sum::<f64>() / 1e9;
        let reconciles = read_ns.len();
        Self {
            subject: subject.to_owned(),
            events,
            reconciles,
            per_second: reconciles as f64 / read_s,
            wall_per_second: events as f64 / wall.as_secs_f64(),
            read_p50_us: percentile(&read_ns, 0.50) / 1e3,
            read_p99_us: percentile(&read_ns, 0.99) / 1e3,
            rss_kb,
            hwm_kb,
            working_set_hits: None,
            working_set_misses: None,
        }
    }

    /// Prints the line.
    pub fn print(&self) {
        println!("{}", serde_json::to_string(self).expect("serialises"));
    }
}

/// The Pods the reconcile case changes, by index, in order: `m` drawn at random (with
/// repeats) from all `n`, so across every group, and the same for every subject.
pub fn reconcile_pods(n: usize, m: usize) -> Vec<usize> {
    let mut random = XorShift(0x853c_49e6_748f_ea9b);
    (0..m).map(|_| random.below(n)).collect()
}

/// How many of `n` benchmark Pods carry the [`GROUP_LABEL`] value `group`
/// ([`GROUP_SIZE`], fewer in a last group cut short by `n`); `None` for a value no Pod has.
pub fn group_len(n: usize, group: &str) -> Option<usize> {
    let first = group.strip_prefix('g')?.parse::<usize>().ok()? * GROUP_SIZE;
    (first < n).then(|| GROUP_SIZE.min(n - first))
}

/// Checks that a list of the group `group` of `n` Pods by label selector returned `len`
/// Pods, [`group_len`]: a reconcile that read a wrong list must not count as a fast one.
///
/// # Errors
///
/// When it did not.
pub fn check_group(subject: &str, n: usize, group: &str, len: usize) -> anyhow::Result<()> {
    match group_len(n, group) {
        Some(expected) if expected == len => Ok(()),
        expected => anyhow::bail!(
            "{subject}: listing {GROUP_LABEL}={group} returned {len} Pods, expected {expected:?}"
        ),
    }
}

impl ReadsLine {
    /// Prints the line.
    pub fn print(&self) {
        println!("{}", serde_json::to_string(self).expect("serialises"));
    }
}

impl RelistLine {
    /// Prints the line.
    pub fn print(subject: &str, relisted: bool, cached: usize) {
        let line = Self {
            subject: subject.to_owned(),
            relisted,
            cached,
            at_ns: unix_nanos(),
        };
        println!("{}", serde_json::to_string(&line).expect("serialises"));
    }
}

/// What a controller that logs a Pod's labels reads of it (the object-tutorials
/// controller): the read a projection (`Store::get_as`) makes of a cached Pod.
#[derive(Debug, Deserialize)]
pub struct PodLabels {
    /// The Pod's metadata, of which only the labels.
    pub metadata: LabelsOnly,
}

/// The labels of an object's metadata.
#[derive(Debug, Deserialize)]
pub struct LabelsOnly {
    /// The labels; empty when the object has none.
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
}

/// The reads of Pods' labels alone that [`time_reads`] times beside the full reads. Each
/// returns how many objects it read labels of (at least one label each), or why it could
/// not read them.
pub struct LabelsReads<'a, Q> {
    /// One key's Pod.
    pub get: &'a dyn Fn(&Q) -> anyhow::Result<usize>,
    /// Every Pod.
    pub list: &'a dyn Fn() -> anyhow::Result<usize>,
    /// The Pods of one value of the `bench-group` index.
    pub by_index: &'a dyn Fn(&str) -> anyhow::Result<usize>,
}

/// Times reads of a cache of `n` benchmark Pods and returns the line to print: `samples`
/// gets by random key, after as many untimed gets of other keys (`key` makes the store's
/// key of a Pod name beforehand, `get` returns whether it found the object), 7 full lists
/// (`list` returns how many objects), and 200 by-index reads of a random group
/// (`by_index` returns how many objects; `None` for a store without indexes). `labels`,
/// for a store with projected reads, reads the same keys, lists and groups again as the
/// Pods' labels alone.
///
/// # Errors
///
/// When a get finds nothing, a labels read fails or finds an object without labels, or a
/// list has not `n` objects.
#[allow(clippy::too_many_arguments)]
pub fn time_reads<Q>(
    subject: &str,
    n: usize,
    samples: usize,
    key: impl Fn(&str) -> Q,
    get: impl Fn(&Q) -> bool,
    labels: Option<&LabelsReads<'_, Q>>,
    list: impl Fn() -> usize,
    by_index: Option<&dyn Fn(&str) -> usize>,
) -> anyhow::Result<ReadsLine> {
    use anyhow::Context;
    let mut random = XorShift(0x9e37_79b9_7f4a_7c15);
    let names: Vec<String> = (0..samples)
        .map(|_| pod_name(random.below(n.max(1))))
        .collect();
    let keys: Vec<Q> = names.iter().map(|name| key(name)).collect();
    // Untimed gets of other random keys first, as many: the timed ones then meet warm code
    // and caches rather than a process just woken from idle.
    let mut warm = XorShift(0x2545_f491_4f6c_dd1d);
    for _ in 0..samples {
        get(&key(&pod_name(warm.below(n.max(1)))));
    }
    let gets = time_keys(
        &names,
        &keys,
        |key| Ok(usize::from(get(key))),
        |name| format!("{subject}: get {name}"),
    )?;
    let labels_gets = match labels {
        Some(labels) => Some(time_keys(&names, &keys, labels.get, |name| {
            format!("{subject}: the labels of {name}")
        })?),
        None => None,
    };
    let list_ms = time_lists(subject, n, || Ok(list()))?;
    let labels_list_ms = match labels {
        Some(labels) => Some(
            time_lists(subject, n, labels.list)
                .with_context(|| format!("{subject}: the labels of every Pod"))?,
        ),
        None => None,
    };
    // Whole groups only, so every read returns GROUP_SIZE objects.
    let groups: Vec<String> = (0..200)
        .map(|_| pod_group(random.below((n / GROUP_SIZE).max(1)) * GROUP_SIZE))
        .collect();
    let (by_index_us, by_index_len) = match by_index {
        Some(read) => {
            let (us, len) = time_groups(&groups, |group| Ok(read(group)))?;
            (Some(us), Some(len))
        }
        None => (None, None),
    };
    let labels_by_index_us = match labels {
        Some(labels) => {
            let (us, len) = time_groups(&groups, labels.by_index)
                .with_context(|| format!("{subject}: the labels of a group's Pods"))?;
            if Some(len) != by_index_len {
                anyhow::bail!(
                    "{subject}: a group's labels read {len} Pods, its objects {by_index_len:?}"
                );
            }
            Some(us)
        }
        None => None,
    };
    Ok(ReadsLine {
        subject: subject.to_owned(),
        get_samples: samples,
        get_p50_ns: percentile(&gets, 0.50),
        get_p99_ns: percentile(&gets, 0.99),
        labels_p50_ns: labels_gets.as_ref().map(|t| percentile(t, 0.50)),
        labels_p99_ns: labels_gets.as_ref().map(|t| percentile(t, 0.99)),
        labels_list_ms,
        labels_by_index_us,
        list_ms,
        by_index_us,
        by_index_len,
    })
}

/// One timed `read` of each of `keys` (of the Pods `names`), ns, sorted. `read` returns
/// how many things it found; an error, or finding none, fails with `what` of the Pod.
fn time_keys<Q>(
    names: &[String],
    keys: &[Q],
    read: impl Fn(&Q) -> anyhow::Result<usize>,
    what: impl Fn(&str) -> String,
) -> anyhow::Result<Vec<f64>> {
    use anyhow::Context;
    let mut times = Vec::with_capacity(keys.len());
    for (name, key) in names.iter().zip(keys) {
        let started = Instant::now();
        let found = read(key);
        times.push(started.elapsed().as_nanos() as f64);
        if found.with_context(|| what(name))? == 0 {
            anyhow::bail!("{} found nothing", what(name));
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// The median of 7 reads of every object by `list` (which returns how many it read), ms.
fn time_lists(
    subject: &str,
    n: usize,
    list: impl Fn() -> anyhow::Result<usize>,
) -> anyhow::Result<f64> {
    let mut times = Vec::new();
    for _ in 0..7 {
        let started = Instant::now();
        let len = list()?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        if len != n {
            anyhow::bail!("{subject}: a list returned {len} objects, expected {n}");
        }
    }
    Ok(median(times))
}

/// The median of one read of each of `groups` by `read` (which returns how many objects
/// it read), µs, and how many objects the last read returned.
fn time_groups(
    groups: &[String],
    read: impl Fn(&str) -> anyhow::Result<usize>,
) -> anyhow::Result<(f64, usize)> {
    let mut times = Vec::new();
    let mut len = 0;
    for group in groups {
        let started = Instant::now();
        len = read(group)?;
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    Ok((median(times), len))
}

/// A small deterministic generator for the random keys (the same keys for every subject)
/// and the reconcile case's Pods.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// Resets the peak RSS (VmHWM) of process `pid` to its current RSS, by writing `5` to
/// `/proc/<pid>/clear_refs`.
///
/// # Errors
///
/// When the file cannot be written (the process is gone, or not ours).
pub fn reset_peak(pid: u32) -> anyhow::Result<()> {
    use anyhow::Context;
    let path = format!("/proc/{pid}/clear_refs");
    std::fs::write(&path, "5").with_context(|| format!("writing 5 to {path}"))
}

/// `(VmRSS, VmHWM)` of this process in KiB, from `/proc/self/status`.
pub fn self_memory() -> (u64, u64) {
    memory_of("self")
}

/// `(VmRSS, VmHWM)` of a process in KiB (`pid` or `self`); zeros if unreadable.
pub fn memory_of(pid: &str) -> (u64, u64) {
    let memory = process_memory(pid);
    (memory.resident_kib, memory.peak_kib)
}

/// A process's memory, KiB, from one read of `/proc/<pid>/status`; zeros if unreadable.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessMemory {
    /// `VmRSS`: all of its resident memory.
    pub resident_kib: u64,
    /// `VmHWM`: the most resident memory it has had.
    pub peak_kib: u64,
    /// `RssAnon`: its resident heap and stacks, without the pages of its executable and
    /// libraries.
    pub anonymous_kib: u64,
}

/// [`ProcessMemory`] of a process (`pid` or `self`).
pub fn process_memory(pid: &str) -> ProcessMemory {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    ProcessMemory {
        resident_kib: field("VmRSS:"),
        peak_kib: field("VmHWM:"),
        anonymous_kib: field("RssAnon:"),
    }
}

/// The CPU time (user + system) a process has used so far, ms, from `/proc/<pid>/stat`;
/// `None` if unreadable. Its resolution is the kernel's clock tick (10 ms at the usual
/// 100 Hz).
pub fn cpu_ms_of(pid: u32) -> Option<f64> {
    let stat = ProcStat::of(pid)?;
    Some((stat.utime + stat.stime) as f64 * 1000.0 / clock_ticks_per_second())
}

/// The CPU time a process's live threads have used so far, ns, from each thread's
/// `/proc/<pid>/task/<tid>/schedstat` (the scheduler's own count, to the nanosecond, where
/// `/proc/<pid>/stat` counts 10 ms ticks); `None` if unreadable. A thread that exits
/// between two reads takes its time with it, so this suits a process whose threads live
/// as long as the interval measured, as a Tokio runtime's workers do.
pub fn cpu_ns_of(pid: u32) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(schedstat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        total += schedstat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())?;
    }
    Some(total)
}

/// The counters of `/proc/<pid>/stat` the benchmarks read.
struct ProcStat {
    minflt: u64,
    utime: u64,
    stime: u64,
}

impl ProcStat {
    fn of(pid: u32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
        // minflt, utime and stime are the stat file's fields 10, 14 and 15; `rest` starts
        // at field 3.
        Some(Self {
            minflt: field(7)?,
            utime: field(11)?,
            stime: field(12)?,
        })
    }
}

/// How a process has used the CPUs so far, from `/proc/<pid>/stat` and its threads'
/// `status` files: where a run's CPU time went when two runs of the same code differ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUse {
    /// User time, ms (at the kernel's clock tick).
    pub user_ms: f64,
    /// System time, ms.
    pub system_ms: f64,
    /// Voluntary context switches of its live threads (a thread parking).
    pub voluntary_switches: u64,
    /// Involuntary ones (a thread preempted).
    pub involuntary_switches: u64,
    /// Minor page faults (first touches of new memory, mostly).
    pub minor_faults: u64,
}

impl CpuUse {
    /// User and system time together, ms.
    pub fn cpu_ms(&self) -> f64 {
        self.user_ms + self.system_ms
    }

    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: CpuUse) -> CpuUse {
        CpuUse {
            user_ms: self.user_ms - earlier.user_ms,
            system_ms: self.system_ms - earlier.system_ms,
            voluntary_switches: self
                .voluntary_switches
                .saturating_sub(earlier.voluntary_switches),
            involuntary_switches: self
                .involuntary_switches
                .saturating_sub(earlier.involuntary_switches),
            minor_faults: self.minor_faults.saturating_sub(earlier.minor_faults),
        }
    }
}

/// [`CpuUse`] of a process; `None` if its `stat` is unreadable. Threads that already
/// exited are missing from the switch counts.
pub fn cpu_use_of(pid: u32) -> Option<CpuUse> {
    let stat = ProcStat::of(pid)?;
    let tick_ms = 1000.0 / clock_ticks_per_second();
    let mut cpu = CpuUse {
        minor_faults: stat.minflt,
        user_ms: stat.utime as f64 * tick_ms,
        system_ms: stat.stime as f64 * tick_ms,
        ..CpuUse::default()
    };
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        for line in status.lines() {
            let count = |prefix: &str| {
                line.strip_prefix(prefix)
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            if let Some(n) = count("voluntary_ctxt_switches:") {
                cpu.voluntary_switches += n;
            } else if let Some(n) = count("nonvoluntary_ctxt_switches:") {
                cpu.involuntary_switches += n;
            }
        }
    }
    Some(cpu)
}

/// `getconf CLK_TCK`, once; 100 if it cannot be read.
fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        command_output("getconf", &["CLK_TCK"])
            .parse()
            .unwrap_or(100.0)
    })
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

    /// Waits for every expected update (if any) and prints the updates line.
    pub async fn wait_for_updates(&self) {
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
    }
}

/// Waits for the driver's go-ahead, a line on stdin: the driver writes it once the CPUs
/// are idle, so that a subject's timed reads of its cache share them with nothing else.
///
/// # Errors
///
/// When stdin closes or breaks first.
pub async fn wait_for_go_ahead() -> anyhow::Result<()> {
    use anyhow::Context;
    let mut line = String::new();
    let read = tokio::io::AsyncBufReadExt::read_line(
        &mut tokio::io::BufReader::new(tokio::io::stdin()),
        &mut line,
    )
    .await
    .context("reading the driver's go-ahead from stdin")?;
    if read == 0 {
        anyhow::bail!("stdin closed before the driver's go-ahead");
    }
    Ok(())
}

/// Waits until stdin closes (the driver reads memory, then closes it or kills the
/// process).
pub async fn wait_for_stdin() {
    let mut sink = Vec::new();
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
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

/// Nearest-rank percentile `p` (0 to 1) of sorted values; NaN for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
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

/// Bytes the process's TCP sockets have received so far (`bytes_received` of each, from
/// iproute2's `ss`): the TLS stream from the API server.
///
/// # Errors
///
/// When `ss` cannot be run.
pub fn bytes_received(pid: u32) -> anyhow::Result<u64> {
    use anyhow::Context;
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

/// Builds the Rust subject binaries `bins` with this executable's profile, into the target
/// directory this executable is in (the subjects are run from beside it, whatever
/// `CARGO_TARGET_DIR` says now): `cargo run --bin informer-bench` builds only the driver,
/// and a subject must never be stale or missing.
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
    // <target>/<profile>/<this executable>, or <target>/<profile>/deps/<a test's>
    let exe = std::env::current_exe()?;
    let profile_dir = exe.parent().and_then(|dir| {
        if dir.ends_with("deps") {
            dir.parent()
        } else {
            Some(dir)
        }
    });
    if let Some(target_dir) = profile_dir.and_then(Path::parent) {
        command.arg("--target-dir").arg(target_dir);
    }
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
