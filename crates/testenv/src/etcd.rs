//! The etcd member that stores the control plane's data.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use base64::Engine;

use crate::{Error, Result, process::Supervised};

/// One etcd member on loopback ports, with its data in a directory of the
/// environment.
#[derive(Debug)]
pub(crate) struct Etcd {
    process: Supervised,
    /// Where `/health` answers over plain HTTP: the client URL, or with TLS (which wants a
    /// client certificate there) a metrics listener of its own.
    probe_url: String,
}

/// etcd's JSON gateway on a plain-HTTP client port, which answers only while a member
/// runs there; kept apart from [`Etcd`] so that requests need no lock on the process.
#[derive(Debug, Clone)]
pub(crate) struct Gateway {
    url: String,
    log: PathBuf,
}

/// The files of an etcd member that serves TLS and requires client certificates.
#[derive(Debug, Clone)]
pub(crate) struct ServerTls {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    pub(crate) trusted_ca: PathBuf,
    /// The plain-HTTP port of `/health` and `/metrics`.
    pub(crate) metrics_port: u16,
}

impl Etcd {
    /// Starts a member on the given ports, with its data in `dir/etcd-data` (kept across
    /// restarts on the same ports), serving clients over TLS when `tls` is given.
    pub(crate) async fn start_on(
        binary: &Path,
        dir: &Path,
        client_port: u16,
        peer_port: u16,
        timeout: Duration,
        tls: Option<&ServerTls>,
    ) -> Result<Self> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let data_dir: PathBuf = dir.join("etcd-data");
        let mut args = vec![
            "--name=default".to_owned(),
            format!("--data-dir={}", data_dir.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            // Test data need not survive a power cut; fsync dominates write latency.
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let probe_url = match tls {
            Some(tls) => {
                args.extend([
                    format!("--cert-file={}", tls.cert.display()),
                    format!("--key-file={}", tls.key.display()),
                    "--client-cert-auth=true".to_owned(),
                    format!("--trusted-ca-file={}", tls.trusted_ca.display()),
                    format!(
                        "--listen-metrics-urls=http://127.0.0.1:{}",
                        tls.metrics_port
                    ),
                ]);
                format!("http://127.0.0.1:{}", tls.metrics_port)
            }
            None => client_url.clone(),
        };
        let process = Supervised::start("etcd", binary, &args, &dir.join("etcd.log"))?;
        let mut etcd = Self { process, probe_url };
        etcd.wait_ready(timeout).await?;
        Ok(etcd)
    }

    pub(crate) fn log(&self) -> &Path {
        self.process.log()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Kills the member with `SIGKILL`, as a crash would, and reaps it; blocks until it is
    /// gone. Its data stays as the crash left it.
    pub(crate) fn kill(mut self) {
        self.process.kill();
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        let mut last_problem = String::from("no probe yet");
        while started.elapsed() < timeout {
            self.process.check_running()?;
            match self.probe().await {
                Ok(body) if body.contains("true") => return Ok(()),
                Ok(body) => last_problem = format!("/health answered {body}"),
                Err(err) => last_problem = err.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(Error::NotReady {
            component: "etcd",
            waited: timeout,
            last_problem,
            log: self.log().to_owned(),
        })
    }

    async fn probe(&self) -> Result<String> {
        let uri = format!("{}/health", self.probe_url);
        let (status, text) =
            crate::http::request(http::Method::GET, &uri, None, Duration::from_secs(10))
                .await
                .map_err(|reason| self.error(reason))?;
        if !status.is_success() {
            return Err(self.error(format!("{status}: {text}")));
        }
        Ok(text)
    }

    fn error(&self, reason: String) -> Error {
        Error::Etcd {
            path: "/health",
            reason,
            log: self.log().to_owned(),
        }
    }
}

impl Gateway {
    /// The gateway of the member whose plain-HTTP client port is `client_port` and whose
    /// output goes to `log`.
    pub(crate) fn new(client_port: u16, log: PathBuf) -> Self {
        Self {
            url: format!("http://127.0.0.1:{client_port}"),
            log,
        }
    }

    /// The client URL, e.g. `http://127.0.0.1:42345`: what API servers use.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Compacts the key space up to the current revision, so that every
    /// older resourceVersion is gone and watches from it fail with 410.
    ///
    /// Returns the revision compacted to.
    pub(crate) async fn compact(&self) -> Result<i64> {
        let key = base64::engine::general_purpose::STANDARD.encode("/");
        let range = serde_json::json!({ "key": key, "limit": 1 }).to_string();
        let body = self.request("/v3/kv/range", Some(range)).await?;
        let revision = revision_of(&body)
            .ok_or_else(|| self.error("/v3/kv/range", format!("no header.revision in {body}")))?;
        let compaction = serde_json::json!({ "revision": revision, "physical": true }).to_string();
        self.request("/v3/kv/compaction", Some(compaction)).await?;
        tracing::info!(revision, "compacted etcd");
        Ok(revision)
    }

    fn error(&self, path: &'static str, reason: String) -> Error {
        Error::Etcd {
            path,
            reason,
            log: self.log.clone(),
        }
    }

    async fn request(&self, path: &'static str, body: Option<String>) -> Result<String> {
        let method = if body.is_some() {
            http::Method::POST
        } else {
            http::Method::GET
        };
        let uri = format!("{}{path}", self.url);
        let (status, text) = crate::http::request(method, &uri, body, Duration::from_secs(10))
            .await
            .map_err(|reason| self.error(path, reason))?;
        if !status.is_success() {
            return Err(self.error(path, format!("{status}: {text}")));
        }
        Ok(text)
    }
}

/// etcd's JSON gateway encodes int64 fields as strings.
fn revision_of(body: &str) -> Option<i64> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    let revision = &value["header"]["revision"];
    revision
        .as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| revision.as_i64())
}
