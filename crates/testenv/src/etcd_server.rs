//! [`EtcdServer`]: a standalone etcd for tests of programs that keep their own data in
//! etcd (for example Traefik's KV provider), separate from the control plane's.

use std::{path::PathBuf, sync::Mutex, time::Duration};

use crate::{Binaries, Error, Result, etcd::Etcd, ports::free_port};

/// One etcd member on fixed loopback ports with its data in a temporary directory. It can
/// be stopped and started again on the same ports with the same data, for tests of what
/// clients do while etcd is down. Dropping it stops etcd and removes the directory.
///
/// ```no_run
/// # async fn demo() -> kube_testenv::Result<()> {
/// let binaries = tokio::task::spawn_blocking(kube_testenv::Binaries::ensure).await.unwrap()?;
/// let etcd = kube_testenv::EtcdServer::start(&binaries).await?;
/// println!("etcd at {}", etcd.endpoint());
/// etcd.stop().await;
/// etcd.start_again().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct EtcdServer {
    // Field order: the member stops before its directory is removed.
    member: Mutex<Option<Etcd>>,
    binary: PathBuf,
    client_port: u16,
    peer_port: u16,
    timeout: Duration,
    dir: tempfile::TempDir,
}

impl EtcdServer {
    /// Starts etcd on two free loopback ports and waits until it is healthy.
    ///
    /// # Errors
    ///
    /// [`Error::Spawn`], [`Error::Exited`] or [`Error::NotReady`] naming etcd's log.
    pub async fn start(binaries: &Binaries) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-etcd-", std::process::id()))
            .tempdir_in(std::env::temp_dir())
            .map_err(Error::io("creating a directory in", std::env::temp_dir()))?;
        let server = Self {
            member: Mutex::new(None),
            binary: binaries.etcd(),
            client_port: free_port()?,
            peer_port: free_port()?,
            timeout: Duration::from_secs(60),
            dir,
        };
        server.start_again().await?;
        Ok(server)
    }

    /// `127.0.0.1:<port>`, the form most etcd clients take.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.endpoint())
    }

    /// etcd's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// Whether etcd runs (not stopped by [`stop`](Self::stop)).
    pub fn is_running(&self) -> bool {
        self.member
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Stops etcd (`SIGTERM`, then `SIGKILL` after 10 s); its data stays. Does nothing if
    /// it is stopped already.
    pub async fn stop(&self) {
        let member = self.member.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(member) = member {
            tokio::task::spawn_blocking(move || drop(member))
                .await
                .expect("stopping a process does not panic");
            tracing::info!(endpoint = %self.endpoint(), "standalone etcd stopped");
        }
    }

    /// Starts etcd again on the same ports with the same data, and waits until it is
    /// healthy. Does nothing if it runs.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn start_again(&self) -> Result<()> {
        if self.is_running() {
            return Ok(());
        }
        let member = Etcd::start_on(
            &self.binary,
            self.dir.path(),
            self.client_port,
            self.peer_port,
            self.timeout,
        )
        .await?;
        *self.member.lock().unwrap_or_else(|p| p.into_inner()) = Some(member);
        tracing::info!(endpoint = %self.endpoint(), "standalone etcd ready");
        Ok(())
    }
}
