//! client-go's subject: `benches/go-subject/soak`, a Pod informer and a dynamic widget
//! informer with the same three handlers, run as a process through its own proxy and
//! writing its events to a file in the records' JSON form.

use std::{
    io::{Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use anyhow::{Context, bail};
use serde::Deserialize;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    process::{Child, ChildStdin},
    sync::watch,
};
use tracing::{info, warn};

use crate::{record::EventRecord, subject::Tuning, writer::WIDGET_GROUP};

/// The subject's name in records and reports.
pub const NAME: &str = "client-go";

/// Builds the subject with `go build`, beside this executable.
///
/// # Errors
///
/// When Go is missing or the build fails.
pub fn build() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("the executable has a directory")?;
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/go-subject");
    let binary = dir.join("soak-subject-client-go");
    info!(module = %module.display(), "building the client-go subject");
    let status = std::process::Command::new("go")
        .args(["build", "-trimpath", "-o"])
        .arg(&binary)
        .arg("./soak")
        .current_dir(&module)
        .status()
        .context("running go build (is Go installed?)")?;
    if !status.success() {
        bail!(
            "go build of ./soak in {} failed: {status}",
            module.display()
        );
    }
    Ok(binary)
}

#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Line {
    Synced {},
    LateAdded {},
    WatchError { at_ns: i64 },
    Done { events: u64 },
}

/// What the subject has said on stdout.
#[derive(Clone, Debug, Default)]
pub struct Said {
    pub synced: bool,
    pub late_added: bool,
    /// When each watch error was reported, Unix ns.
    pub watch_errors: Vec<i64>,
    pub done: Option<u64>,
    pub ended: bool,
}

/// The running subject.
pub struct Subject {
    child: Child,
    stdin: Option<ChildStdin>,
    said: watch::Receiver<Said>,
    events: EventsFile,
    pid: u32,
}

impl Subject {
    /// Starts `binary` on `kubeconfig` (the subject's proxy), writing events to
    /// `events` and its log to `log`.
    ///
    /// # Errors
    ///
    /// When the process cannot start.
    pub fn spawn(
        binary: &Path,
        kubeconfig: &Path,
        events: PathBuf,
        log: &Path,
        tuning: Tuning,
    ) -> anyhow::Result<Self> {
        let stderr = std::fs::File::create(log)
            .with_context(|| format!("creating the subject log {}", log.display()))?;
        let mut command = tokio::process::Command::new(binary);
        command
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--events")
            .arg(&events)
            .args(["--widgets-group", WIDGET_GROUP])
            .arg(format!(
                "--slow-handler-delay={}ms",
                tuning.slow_handler_delay.as_millis()
            ));
        if let Some(timeout) = tuning.watch_timeout {
            command.arg(format!("--watch-timeout-seconds={}", timeout.as_secs()));
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let pid = child.id().context("the subject has a pid")?;
        let stdout = child.stdout.take().context("stdout is piped")?;
        let stdin = child.stdin.take();
        let (tx, said) = watch::channel(Said::default());
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Line>(&line) {
                    Ok(Line::Synced {}) => tx.send_modify(|s| s.synced = true),
                    Ok(Line::LateAdded {}) => tx.send_modify(|s| s.late_added = true),
                    Ok(Line::WatchError { at_ns }) => {
                        tx.send_modify(|s| s.watch_errors.push(at_ns))
                    }
                    Ok(Line::Done { events }) => tx.send_modify(|s| s.done = Some(events)),
                    Err(error) => warn!(subject = NAME, %line, %error, "unreadable subject line"),
                }
            }
            tx.send_modify(|s| s.ended = true);
        });
        Ok(Self {
            child,
            stdin,
            said,
            events: EventsFile::new(events),
            pid,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn said(&self) -> Said {
        self.said.borrow().clone()
    }

    /// Tells the subject to add its late handlers.
    ///
    /// # Errors
    ///
    /// When the subject's stdin is closed.
    pub async fn add_late_handlers(&mut self) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("the subject was stopped")?;
        stdin.write_all(b"late\n").await?;
        stdin.flush().await?;
        Ok(())
    }

    /// The events written so far (the subject flushes its file every 200 ms).
    ///
    /// # Errors
    ///
    /// When the file cannot be read; an unreadable line is an error too.
    pub fn events(&self) -> anyhow::Result<Vec<EventRecord>> {
        self.events.read()
    }

    /// Closes stdin, the subject's signal to stop, and waits for it to exit; returns
    /// whether it exited cleanly within `patience`.
    pub async fn stop(mut self, patience: Duration) -> anyhow::Result<bool> {
        drop(self.stdin.take());
        match tokio::time::timeout(patience, self.child.wait()).await {
            Ok(status) => Ok(status?.success()),
            Err(_) => {
                self.child.kill().await?;
                Ok(false)
            }
        }
    }
}

/// The subject's events file, read from where the last read stopped: the driver reads
/// it every 250 ms while waiting for the subjects to settle, and a long run writes
/// hundreds of thousands of lines.
struct EventsFile {
    path: PathBuf,
    /// Bytes parsed so far, and what they held.
    read: Mutex<(u64, Vec<EventRecord>)>,
}

impl EventsFile {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            read: Mutex::default(),
        }
    }

    fn read(&self) -> anyhow::Result<Vec<EventRecord>> {
        let mut read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
        let (offset, events) = &mut *read;
        let mut file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(e).with_context(|| format!("reading {}", self.path.display()));
            }
        };
        file.seek(SeekFrom::Start(*offset))?;
        let mut text = String::new();
        file.read_to_string(&mut text)
            .with_context(|| format!("reading {}", self.path.display()))?;
        // The last line may be cut short by a flush in progress: it is read next time.
        let complete = text.rfind('\n').map_or("", |end| &text[..=end]);
        let parsed = complete
            .lines()
            .map(|line| {
                serde_json::from_str(line).with_context(|| format!("an unreadable event: {line}"))
            })
            .collect::<anyhow::Result<Vec<EventRecord>>>()?;
        events.extend(parsed);
        *offset += complete.len() as u64;
        Ok(events.clone())
    }
}
