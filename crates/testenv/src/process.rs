//! Child processes that never outlive the process that started them.
//!
//! Every component is started through `setpriv --pdeathsig KILL`, which asks
//! the kernel to kill it as soon as the thread that forked it ends. That
//! thread is one long-lived spawner thread per process, so the children die
//! with the test binary or CLI however it ends: normal exit, panic, or
//! `SIGKILL`. Dropping a [`Supervised`] stops its process gracefully first.

use std::{
    fs::File,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Mutex, OnceLock, mpsc},
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::{Error, Result};

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// How long a component gets to exit after `SIGTERM` before it is killed.
const GRACE: Duration = Duration::from_secs(10);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("kube-testenv-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
                // The sender lives in a static, so this loop ends only with the
                // process; parking keeps the parent-death signal armed anyway.
                loop {
                    thread::park();
                }
            })
            .expect("spawning the kube-testenv spawner thread");
        Mutex::new(tx)
    })
}

/// A running component whose output goes to a log file.
#[derive(Debug)]
pub(crate) struct Supervised {
    component: &'static str,
    child: Child,
    log: PathBuf,
}

impl Supervised {
    /// Starts `binary args...` with stdout and stderr appended to `log`.
    pub(crate) fn start(
        component: &'static str,
        binary: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(Error::io("opening the log file", log))?;
        let err = out
            .try_clone()
            .map_err(Error::io("opening the log file", log))?;
        let mut command = Command::new("setpriv");
        command
            .arg("--pdeathsig")
            .arg("KILL")
            .arg("--")
            .arg(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let (tx, rx) = mpsc::channel();
        let spawn_error = |source| Error::Spawn {
            component,
            binary: binary.to_owned(),
            source,
        };
        spawner()
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .send((command, tx))
            .map_err(|_| spawn_error(std::io::Error::other("spawner thread is gone")))?;
        let child = rx
            .recv()
            .map_err(|_| spawn_error(std::io::Error::other("spawner thread is gone")))?
            .map_err(spawn_error)?;
        tracing::debug!(component, pid = child.id(), log = %log.display(), "started");
        Ok(Self {
            component,
            child,
            log: log.to_owned(),
        })
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where the component's output goes.
    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    /// Fails with [`Error::Exited`] if the process has exited.
    pub(crate) fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(self.exited(status)),
            _ => Ok(()),
        }
    }

    fn exited(&self, status: ExitStatus) -> Error {
        Error::Exited {
            component: self.component,
            status: status.to_string(),
            log: self.log.clone(),
            tail: log_tail(&self.log, 15),
        }
    }

    /// Sends `SIGTERM`, waits up to a grace period, then kills.
    pub(crate) fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                tracing::debug!(component = self.component, "stopped");
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!(
            component = self.component,
            "did not stop within {GRACE:?}; killing"
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the process with `SIGKILL` at once, as a crash would, and reaps it.
    pub(crate) fn kill(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        tracing::debug!(component = self.component, "killed");
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a log file, each indented, after a newline.
pub(crate) fn log_tail(log: &Path, lines: usize) -> String {
    let Ok(file) = File::open(log) else {
        return String::new();
    };
    let all: Vec<String> = BufReader::new(file).lines().map_while(|l| l.ok()).collect();
    let start = all.len().saturating_sub(lines);
    all[start..].iter().map(|l| format!("\n    {l}")).collect()
}
