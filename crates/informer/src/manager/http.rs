//! The manager's endpoints: `/healthz` and `/readyz` on the probe address, `/metrics` on
//! the metrics address (the collectors live beside what they measure).

use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode, body::Incoming, server::conn::http1, service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{encoding::text::encode, registry::Registry};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    fleet::{ClusterPhase, ClusterStatus, FleetView, Reachability},
    informer::{InformerFactory, InformerHealth},
};

pub(super) const PROBE_PATHS: &[&str] = &["/healthz", "/readyz"];
pub(super) const METRICS_PATHS: &[&str] = &["/metrics"];

/// A slow or idle client gets this long to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long past the lease duration a leader's stalled renewals are tolerated before
/// `/healthz` fails (client-go's `HealthzAdaptor` timeout).
#[cfg(feature = "leader-election")]
const LEADER_STALL_TOLERANCE: Duration = Duration::from_secs(20);

/// What the endpoints answer from.
pub(super) struct State {
    factory: InformerFactory,
    registry: Registry,
    elector: Option<Arc<super::LeaderElector>>,
    fleets: Vec<FleetView>,
}

impl State {
    pub(super) fn new(
        factory: InformerFactory,
        registry: Registry,
        elector: Option<Arc<super::LeaderElector>>,
        fleets: Vec<FleetView>,
    ) -> Self {
        Self {
            factory,
            registry,
            elector,
            fleets,
        }
    }

    /// `/healthz`: failing while a leader's renewals have stalled.
    fn health(&self) -> Result<(), String> {
        match &self.elector {
            #[cfg(feature = "leader-election")]
            Some(elector) => elector.check_health(LEADER_STALL_TOLERANCE),
            _ => Ok(()),
        }
    }

    /// `/readyz`: failing until every informer has synced, and while the server does not
    /// serve an informer's resource; once ready, naming the fleets' clusters that are
    /// behind without failing for them.
    fn readiness(&self) -> Result<String, String> {
        let missing: Vec<String> = self
            .factory
            .informers()
            .into_iter()
            .filter_map(|informer| match informer.health {
                InformerHealth::ResourceMissing { since } => Some(format!(
                    "the API server has not served {} for {:?}",
                    informer.resource,
                    since.elapsed().unwrap_or_default()
                )),
                _ => None,
            })
            .collect();
        if !missing.is_empty() {
            return Err(missing.join("\n"));
        }
        if !self.factory.has_synced() {
            return Err("caches not synced yet".into());
        }
        let mut answer = String::from("ok");
        for view in &self.fleets {
            for cluster in view.clusters() {
                if let Some(why) = behind_because(&cluster) {
                    answer.push_str(&format!("\ncluster {} is behind: {why}", cluster.name));
                }
            }
        }
        Ok(answer)
    }

    fn answer(&self, path: &str) -> (StatusCode, &'static str, String) {
        const TEXT: &str = "text/plain; charset=utf-8";
        match path {
            "/healthz" => match self.health() {
                Ok(()) => (StatusCode::OK, TEXT, "ok".into()),
                Err(why) => (StatusCode::INTERNAL_SERVER_ERROR, TEXT, why),
            },
            "/readyz" => match self.readiness() {
                Ok(answer) => (StatusCode::OK, TEXT, answer),
                Err(why) => (StatusCode::SERVICE_UNAVAILABLE, TEXT, why),
            },
            "/metrics" => {
                let mut body = String::new();
                match encode(&mut body, &self.registry) {
                    Ok(()) => (
                        StatusCode::OK,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        body,
                    ),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, TEXT, e.to_string()),
                }
            }
            _ => (StatusCode::NOT_FOUND, TEXT, "not found".into()),
        }
    }
}

/// Why `cluster` is behind, or `None` when it runs synced and reachable (as
/// [`FleetView::behind`] decides).
fn behind_because(cluster: &ClusterStatus) -> Option<String> {
    if let Reachability::Unreachable { since, error } = &cluster.reach {
        let for_ = since.elapsed().unwrap_or_default().as_secs();
        return Some(format!("unreachable for {for_} s ({error})"));
    }
    match (cluster.phase, cluster.synced) {
        (ClusterPhase::Running, true) => None,
        (ClusterPhase::Running, false) => Some("its informers have not synced".into()),
        (ClusterPhase::BackingOff, _) => Some(format!(
            "its run failed and starts again after a backoff ({})",
            cluster.last_error.as_deref().unwrap_or("no error recorded")
        )),
        (phase, _) => Some(format!("its run is {phase:?}")),
    }
}

/// Serves `paths` on `listener` until `cancel` fires; other paths get 404. Accept errors
/// (out of file descriptors, ...) back off from 5 ms to 1 s instead of spinning.
pub(super) async fn serve(
    listener: TcpListener,
    state: Arc<State>,
    paths: &'static [&'static str],
    cancel: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, ?paths, "serving");
    }
    let mut backoff = Duration::from_millis(5);
    loop {
        let (stream, peer) = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(%error, retry_in = ?backoff, "accept failed");
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
        };
        backoff = Duration::from_millis(5);
        let state = state.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let path = request.uri().path();
            let (status, content_type, body) =
                state.answer(if paths.contains(&path) { path } else { "" });
            let response = Response::builder()
                .status(status)
                .header("content-type", content_type)
                .body(Full::new(Bytes::from(body)));
            async move { Ok::<_, Infallible>(response.unwrap_or_default()) }
        });
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => if let Err(error) = result {
                    debug!(%peer, %error, "connection ended with an error");
                },
                () = cancel.cancelled() => connection.as_mut().graceful_shutdown(),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn serving() -> (std::net::SocketAddr, CancellationToken) {
        let config = kube_client::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = kube_client::Client::try_from(config).unwrap();
        let state = Arc::new(State::new(
            InformerFactory::new(client),
            Registry::default(),
            None,
            Vec::new(),
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        tokio::spawn(serve(listener, state, PROBE_PATHS, cancel.clone()));
        (addr, cancel)
    }

    /// Reads until the server closes the connection; what it sent.
    async fn read_to_close(stream: &mut tokio::net::TcpStream) -> String {
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(3600), stream.read_to_end(&mut answer))
            .await
            .expect("the server closes the connection")
            .unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    }

    // Paused time runs ahead whenever the runtime waits on the sockets, so the header-read
    // timeout is reached at once if it is set, and the read never ends if it is not.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_finishes_its_headers_is_dropped() {
        let (addr, cancel) = serving().await;
        let mut complete = tokio::net::TcpStream::connect(addr).await.unwrap();
        complete
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        assert!(
            read_to_close(&mut complete)
                .await
                .starts_with("HTTP/1.1 200")
        );

        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let answer = read_to_close(&mut slow).await;
        assert!(!answer.contains("200"), "{answer}");
        // Ours, not hyper's default of 30 s.
        let waited = started.elapsed();
        assert!(
            waited >= HEADER_READ_TIMEOUT && waited < Duration::from_secs(20),
            "{waited:?}"
        );
        cancel.cancel();
    }
}
