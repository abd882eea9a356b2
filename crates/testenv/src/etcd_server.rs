//! [`EtcdServer`]: a standalone etcd for tests of programs that keep their own data in
//! etcd (for example Traefik's KV provider), separate from the control plane's, in
//! plaintext or over TLS with client certificates ([`EtcdTls`]).

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
    time::Duration,
};

use crate::{
    Binaries, Error, Result,
    certs::EtcdCredentials,
    etcd::{Etcd, ServerTls},
    ports::free_port,
};

/// The certificates of an [`EtcdServer`] started with [`EtcdServer::start_tls`]: etcd
/// serves TLS for `127.0.0.1` and `localhost` and accepts only clients presenting a
/// certificate signed by [`ca_cert`](Self::ca_cert).
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// PEM certificate of the CA that signed etcd's serving certificate and the client
    /// certificate; what clients verify etcd with.
    pub ca_cert: PathBuf,
    /// PEM client certificate (common name [`CLIENT_COMMON_NAME`](Self::CLIENT_COMMON_NAME)).
    pub client_cert: PathBuf,
    /// PEM private key of [`client_cert`](Self::client_cert).
    pub client_key: PathBuf,
    server: ServerTls,
}

impl EtcdTls {
    /// The common name of the client certificate. etcd takes it as the user name of
    /// requests that carry no token once authentication is enabled, so no etcd user
    /// should have this name unless certificates alone are to authenticate.
    pub const CLIENT_COMMON_NAME: &'static str = "kube-testenv-etcd-client";

    fn generate(dir: &Path) -> Result<Self> {
        let creds = EtcdCredentials::generate(dir, Self::CLIENT_COMMON_NAME)?;
        Ok(Self {
            server: ServerTls {
                cert: creds.server_cert,
                key: creds.server_key,
                trusted_ca: creds.ca_cert.clone(),
                metrics_port: free_port()?,
            },
            ca_cert: creds.ca_cert,
            client_cert: creds.client_cert,
            client_key: creds.client_key,
        })
    }
}

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
    tls: Option<EtcdTls>,
    dir: tempfile::TempDir,
}

impl EtcdServer {
    /// Starts etcd on two free loopback ports and waits until it is healthy.
    ///
    /// # Errors
    ///
    /// [`Error::Spawn`], [`Error::Exited`] or [`Error::NotReady`] naming etcd's log.
    pub async fn start(binaries: &Binaries) -> Result<Self> {
        Self::start_with(binaries, false).await
    }

    /// Starts etcd serving TLS to clients, requiring client certificates
    /// (`--client-cert-auth`), with freshly generated certificates ([`tls`](Self::tls)),
    /// and waits until it is healthy. Authentication (users, roles, `auth enable`) is left
    /// to the test, through any etcd client.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start), and [`Error::Certificates`] or [`Error::Io`] when the
    /// certificates cannot be generated or written.
    pub async fn start_tls(binaries: &Binaries) -> Result<Self> {
        Self::start_with(binaries, true).await
    }

    async fn start_with(binaries: &Binaries, tls: bool) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-etcd-", std::process::id()))
            .tempdir_in(std::env::temp_dir())
            .map_err(Error::io("creating a directory in", std::env::temp_dir()))?;
        let tls = if tls {
            Some(EtcdTls::generate(dir.path())?)
        } else {
            None
        };
        let server = Self {
            member: Mutex::new(None),
            binary: binaries.etcd(),
            client_port: free_port()?,
            peer_port: free_port()?,
            timeout: Duration::from_secs(60),
            tls,
            dir,
        };
        server.start_again().await?;
        Ok(server)
    }

    /// The certificates, when started with [`start_tls`](Self::start_tls).
    pub fn tls(&self) -> Option<&EtcdTls> {
        self.tls.as_ref()
    }

    /// `127.0.0.1:<port>`, the form most etcd clients take.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// `http://127.0.0.1:<port>`, or `https://` with [`tls`](Self::tls).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.endpoint())
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
            self.tls.as_ref().map(|tls| &tls.server),
        )
        .await?;
        *self.member.lock().unwrap_or_else(|p| p.into_inner()) = Some(member);
        tracing::info!(endpoint = %self.endpoint(), "standalone etcd ready");
        Ok(())
    }
}
