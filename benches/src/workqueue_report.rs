//! The workqueue part of `informer-bench`: kube-informer's workqueue against client-go's,
//! each in its own process.
//!
//! The Rust subject is `subject-workqueue` (the cases of [`crate::workqueue_cases`]), the Go
//! one `go-subject/workqueue` (the same cases on client-go's typed workqueue); [`measure`]
//! builds both beside the driver (the Go one with `go build`, as the driver builds the
//! informer's Go subject, in the same module), then runs them alternately (kube-informer,
//! client-go, kube-informer, ...), `runs` times each; [`markdown`] writes the medians and the
//! ratios to client-go as the `## Workqueue` section of `BENCHMARKS.md`.

use std::{fmt::Write as _, path::Path, process::Stdio, time::Duration};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::workqueue_cases::{CaseResult, ITEMS, WorkqueueLine};
use crate::{client_go_version, command_output, lock_version, machine, median};

/// The Rust subject's executable, beside the driver's.
pub const RUST_BINARY: &str = "subject-workqueue";
/// The Go subject's executable, built beside the driver's.
pub const GO_BINARY: &str = "go-subject-workqueue";
/// The Go subject's package in the `go-subject` module.
const GO_PACKAGE: &str = "./workqueue";

const RUST_SUBJECT: &str = "kube-informer";
const GO_SUBJECT: &str = "client-go";
const TIMEOUT: Duration = Duration::from_secs(600);

/// One run of one subject: every case's figure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkqueueRun {
    /// `kube-informer` or `client-go`.
    pub subject: String,
    /// Which run, from 0.
    pub run: usize,
    /// The cases as the subject reported them.
    pub cases: Vec<CaseResult>,
}

/// The workqueue comparison as `results.json` keeps it, with what the report says about
/// the machine and versions, recorded when measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkqueueResults {
    /// The command that reproduces them.
    pub command: String,
    /// The machine, as [`machine`] describes it.
    pub machine: String,
    /// The subjects' versions and toolchains.
    pub versions: String,
    /// Minimum time per case per run, ms.
    pub min_ms: u64,
    /// Runs of each subject.
    pub runs_each: usize,
    /// Every run, in the order run.
    pub runs: Vec<WorkqueueRun>,
}

/// Builds both subjects beside the running executable, then runs them alternately, `runs`
/// times each, every case timed for at least `min_ms`. The results record the command that
/// reproduces them: this process's arguments after `cargo run -p benches --bin
/// informer-bench --`.
///
/// # Errors
///
/// If a build fails, or a subject is missing, fails, times out or prints something else
/// than a [`WorkqueueLine`].
pub async fn measure(runs: usize, min_ms: u64) -> anyhow::Result<WorkqueueResults> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("the executable has a directory")?;
    crate::build_rust_subjects(&[RUST_BINARY])?;
    build_go_subject(&dir.join(GO_BINARY))?;
    let subjects = [
        (RUST_SUBJECT, dir.join(RUST_BINARY)),
        (GO_SUBJECT, dir.join(GO_BINARY)),
    ];
    for (_, path) in &subjects {
        if !path.is_file() {
            bail!(
                "{} is missing after the build; was the driver built with another profile?",
                path.display()
            );
        }
    }
    let mut results = Vec::new();
    for run in 0..runs {
        for (subject, binary) in &subjects {
            eprintln!("workqueue: {subject}, run {}/{runs}", run + 1);
            let line = run_subject(binary, min_ms)
                .await
                .with_context(|| format!("workqueue: {subject}, run {run}"))?;
            if line.subject != *subject {
                bail!("{} reported itself as {}", binary.display(), line.subject);
            }
            for case in &line.cases {
                eprintln!(
                    "  {:<24} {:>12.0} items/s ({} iterations)",
                    case.name, case.items_per_sec, case.iterations
                );
            }
            results.push(WorkqueueRun {
                subject: line.subject,
                run,
                cases: line.cases,
            });
        }
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let release = if cfg!(debug_assertions) {
        ""
    } else {
        " --release"
    };
    Ok(WorkqueueResults {
        command: format!(
            "cargo run{release} -p benches --bin informer-bench -- {}",
            args.join(" ")
        ),
        machine: machine(),
        versions: versions(),
        min_ms,
        runs_each: runs,
        runs: results,
    })
}

/// Builds `go-subject/workqueue` into `binary`.
fn build_go_subject(binary: &Path) -> anyhow::Result<()> {
    let go_module = Path::new(env!("CARGO_MANIFEST_DIR")).join("go-subject");
    eprintln!("building {GO_PACKAGE} in {}", go_module.display());
    let status = std::process::Command::new("go")
        .args(["build", "-trimpath", "-o"])
        .arg(binary)
        .arg(GO_PACKAGE)
        .current_dir(&go_module)
        .status()
        .context("running go build (is Go installed?)")?;
    if !status.success() {
        bail!(
            "go build of {GO_PACKAGE} in {} failed: {status}",
            go_module.display()
        );
    }
    Ok(())
}

async fn run_subject(binary: &Path, min_ms: u64) -> anyhow::Result<WorkqueueLine> {
    let child = tokio::process::Command::new(binary)
        .args(["--min-ms", &min_ms.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let output = tokio::time::timeout(TIMEOUT, child.wait_with_output())
        .await
        .context("timed out waiting for the subject")??;
    if !output.status.success() {
        bail!("{} failed: {}", binary.display(), output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rfind(|l| !l.trim().is_empty())
        .context("the subject printed nothing")?;
    serde_json::from_str(line).with_context(|| format!("parsing the subject's line {line:?}"))
}

/// The subjects' versions and toolchains, in one line.
fn versions() -> String {
    let client_go = client_go_version();
    format!(
        "kube-informer {} `Queue` / `DelayingQueue` on tokio {}'s multi-threaded runtime ({}); \
         client-go {client_go} `workqueue.NewTyped` / `NewTypedDelayingQueue` ({})",
        lock_version("kube-informer"),
        lock_version("tokio"),
        command_output("rustc", &["--version"]),
        command_output("go", &["env", "GOVERSION"]),
    )
}

/// The `## Workqueue` section of `BENCHMARKS.md`: per case, the median items/s of each
/// subject and kube-informer's ratio to client-go.
pub fn markdown(results: &WorkqueueResults) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## Workqueue\n");
    let _ = writeln!(
        out,
        "kube-informer's workqueue against client-go's, each subject its own process \
         (`subject-workqueue`, `benches/go-subject/workqueue`) running the cases of \
         `benches/src/workqueue_cases.rs` (also the criterion bench, `cargo bench -p \
         benches`) and their Go mirror. Every iteration pushes {} distinct items through a \
         fresh queue; each case runs one untimed iteration, then iterations for at least {} \
         ms (3 at least). Subjects alternate (kube-informer, client-go, kube-informer, ...), \
         {} run{} each; figures are medians of items/s over the runs; the ratio is \
         kube-informer's over client-go's, so **above 1 is faster** (unlike the informer \
         tables, where the figures are times and memory).\n",
        thousands(Some(ITEMS as f64)),
        results.min_ms,
        results.runs_each,
        if results.runs_each == 1 { "" } else { "s" },
    );
    let _ = writeln!(out, "- command: `{}`", results.command);
    let _ = writeln!(out, "- machine: {}", results.machine);
    let _ = writeln!(out, "- subjects: {}", results.versions);
    let _ = writeln!(
        out,
        "- cases: `add_get_done/<item>/<W>` = add the items while W workers (tokio \
         tasks, goroutines) get and mark them done, then shut down and wait for the \
         workers; items are `u64` or the keys `default/object-00000`... (`string`: Go \
         passes each `string`, Rust each `kube_informer::ObjectKey`, the key type its \
         controllers queue, an immutable shared `Arc<str>` whose clone copies a pointer, \
         like for like with a Go string). \
         `add_after/schedule` = `add_after` of each item with delays of 60 s + (i mod 1000) s, \
         then shutdown: the cost of scheduling (kube-informer pushes onto its timer heap \
         under a mutex in the caller; client-go sends each item over a channel of 1000 to \
         its waiting-loop goroutine, which keeps the heap, so the producer waits for that \
         goroutine once the channel is full). `add_after/fire_1ms` = the items scheduled \
         1 + (i mod 1000) µs ahead and drained by one worker: heap, timer and queue \
         together. The Rust iteration runs in `block_on` on the main thread beside tokio's \
         worker thread per CPU (as under criterion and `#[tokio::main]`); Go's on \
         `GOMAXPROCS` = CPUs\n"
    );
    let _ = writeln!(
        out,
        "| case | kube-informer items/s | client-go items/s | ratio to client-go |"
    );
    let _ = writeln!(out, "|---|---|---|---|");
    let mut names: Vec<&str> = Vec::new();
    for case in results.runs.iter().flat_map(|r| &r.cases) {
        if !names.contains(&case.name.as_str()) {
            names.push(&case.name);
        }
    }
    let medians = |subject: &str, name: &str| {
        let values: Vec<f64> = results
            .runs
            .iter()
            .filter(|r| r.subject == subject)
            .flat_map(|r| &r.cases)
            .filter(|c| c.name == name)
            .map(|c| c.items_per_sec)
            .collect();
        (!values.is_empty()).then(|| median(values))
    };
    for name in names {
        let rust = medians(RUST_SUBJECT, name);
        let go = medians(GO_SUBJECT, name);
        let ratio = match (rust, go) {
            (Some(r), Some(g)) if g > 0.0 => format!("{:.2}×", r / g),
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            out,
            "| `{name}` | {} | {} | {ratio} |",
            thousands(rust),
            thousands(go)
        );
    }
    out
}

/// `1234567.8` as `1,234,568`; a dash if absent.
fn thousands(value: Option<f64>) -> String {
    let Some(value) = value.filter(|v| v.is_finite()) else {
        return "–".to_owned();
    };
    let digits = format!("{:.0}", value.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if value < 0.0 {
        out.insert(0, '-');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(Some(1_234_567.8)), "1,234,568");
        assert_eq!(thousands(Some(999.0)), "999");
        assert_eq!(thousands(Some(1000.0)), "1,000");
        assert_eq!(thousands(None), "–");
    }

    #[test]
    fn markdown_has_medians_and_ratios() {
        let case = |v: f64| CaseResult {
            name: "add_get_done/u64/1".to_owned(),
            iterations: 1,
            elapsed_ms: 1.0,
            items_per_sec: v,
        };
        let run = |subject: &str, run: usize, v: f64| WorkqueueRun {
            subject: subject.to_owned(),
            run,
            cases: vec![case(v)],
        };
        let results = WorkqueueResults {
            command: "informer-bench --workqueue-only".to_owned(),
            machine: "m".to_owned(),
            versions: "v".to_owned(),
            min_ms: 1000,
            runs_each: 3,
            runs: vec![
                run(RUST_SUBJECT, 0, 1000.0),
                run(GO_SUBJECT, 0, 4000.0),
                run(RUST_SUBJECT, 1, 3000.0),
                run(GO_SUBJECT, 1, 2000.0),
                run(RUST_SUBJECT, 2, 2000.0),
                run(GO_SUBJECT, 2, 1000.0),
            ],
        };
        let text = markdown(&results);
        assert!(
            text.contains("| `add_get_done/u64/1` | 2,000 | 2,000 | 1.00× |"),
            "{text}"
        );
    }
}
