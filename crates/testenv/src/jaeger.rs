//! [`Jaeger`]: a real trace collector and query service on this machine, for tests that
//! follow a trace end to end.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use http::Method;

use crate::{Error, JaegerBinary, Result, env::scratch_dir, http::request, process::Supervised};

/// How long Jaeger gets to answer on its query port once started.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Jaeger's all-in-one (OTLP receivers, in-memory storage, query service), built from its
/// Go module on first use and run until dropped. It listens on its default ports on
/// loopback and every interface: OTLP over HTTP on 4318, over gRPC on 4317, the query
/// service (API and UI) on 16686; so one runs on a machine at a time.
///
/// ```no_run
/// # async fn doc() -> kube_testenv::Result<()> {
/// let jaeger = kube_testenv::Jaeger::start().await?;
/// // Export spans to jaeger.otlp_http_traces_url(), then read them back:
/// let traces = jaeger.traces("my-service").await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Jaeger {
    process: Supervised,
    _dir: tempfile::TempDir,
}

impl Jaeger {
    /// Starts Jaeger (building it first if the cache lacks it) and waits until its query
    /// service answers.
    ///
    /// # Errors
    ///
    /// [`Error::GoMissing`] or [`Error::BuildFailed`] if it cannot be built;
    /// [`Error::Spawn`], [`Error::Exited`] or [`Error::NotReady`] if it does not come up.
    pub async fn start() -> Result<Self> {
        let binary = tokio::task::spawn_blocking(JaegerBinary::ensure)
            .await
            .expect("the Jaeger build does not panic")?;
        // Counted from the start, not from before a first build.
        let started = Instant::now();
        let dir = scratch_dir(Some("jaeger"))?;
        let log = dir.path().join("jaeger.log");
        let mut process = Supervised::start("jaeger", binary.path(), &[], &log)?;
        let mut last_problem = String::from("no probe yet");
        while started.elapsed() < START_TIMEOUT {
            process.check_running()?;
            match request(
                Method::GET,
                "http://127.0.0.1:16686/api/services",
                None,
                Duration::from_secs(2),
            )
            .await
            {
                Ok((status, _)) if status.is_success() => {
                    tracing::info!(
                        pid = process.pid(),
                        elapsed_ms = started.elapsed().as_millis(),
                        "jaeger ready"
                    );
                    return Ok(Self { process, _dir: dir });
                }
                Ok((status, body)) => {
                    last_problem = format!("/api/services answered {status}: {body}")
                }
                Err(reason) => last_problem = reason,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Error::NotReady {
            component: "jaeger",
            waited: START_TIMEOUT,
            last_problem,
            log: log.clone(),
        })
    }

    /// Where spans go over OTLP/HTTP: `http://127.0.0.1:4318/v1/traces`.
    pub fn otlp_http_traces_url(&self) -> String {
        "http://127.0.0.1:4318/v1/traces".to_owned()
    }

    /// The traces Jaeger holds for `service`, as its query API answers them
    /// (`GET /api/traces?service=...`): JSON, with `data[].spans[]` each naming its
    /// `operationName` and its `references` to parents.
    ///
    /// # Errors
    ///
    /// [`Error::NotReady`] when the query service does not answer.
    pub async fn traces(&self, service: &str) -> Result<serde_json::Value> {
        let uri =
            format!("http://127.0.0.1:16686/api/traces?service={service}&limit=100&lookback=1h");
        let problem = match request(Method::GET, &uri, None, Duration::from_secs(5)).await {
            Ok((status, body)) if status.is_success() => {
                return serde_json::from_str(&body).map_err(|e| Error::NotReady {
                    component: "jaeger",
                    waited: Duration::ZERO,
                    last_problem: format!("its traces are not JSON: {e}"),
                    log: self.log().to_owned(),
                });
            }
            Ok((status, body)) => format!("/api/traces answered {status}: {body}"),
            Err(reason) => reason,
        };
        Err(Error::NotReady {
            component: "jaeger",
            waited: Duration::ZERO,
            last_problem: problem,
            log: self.log().to_owned(),
        })
    }

    /// Jaeger's log file.
    pub fn log(&self) -> &Path {
        self.process.log()
    }
}
