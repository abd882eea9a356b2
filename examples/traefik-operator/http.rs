//! The manager's HTTP endpoints, as controller-runtime serves them: `/healthz` and
//! `/readyz` on the probe address, Prometheus `/metrics` on the metrics address.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode, body::Incoming, server::conn::http1, service::service_fn,
};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

/// What the endpoints report: readiness and the metrics registry.
#[derive(Debug)]
pub struct Health {
    ready: AtomicBool,
    registry: Registry,
}

impl Health {
    /// Not ready yet, serving `registry` on `/metrics`.
    pub fn new(registry: Registry) -> Self {
        Self {
            ready: AtomicBool::new(false),
            registry,
        }
    }

    /// Sets what `/readyz` answers.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    fn answer(&self, path: &str) -> (StatusCode, &'static str, String) {
        const TEXT: &str = "text/plain; charset=utf-8";
        match path {
            "/healthz" => (StatusCode::OK, TEXT, "ok".into()),
            "/readyz" if self.is_ready() => (StatusCode::OK, TEXT, "ok".into()),
            "/readyz" => (
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                "caches not synced yet".into(),
            ),
            "/metrics" => {
                let mut body = String::new();
                match prometheus_client::encoding::text::encode(&mut body, &self.registry) {
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

/// Binds `addr`.
///
/// # Errors
///
/// When the address cannot be bound (in use, not local, no permission).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `paths` of `health` on `listener` until `cancel` fires. Other paths get 404.
pub async fn serve(
    listener: TcpListener,
    health: Arc<Health>,
    paths: &'static [&'static str],
    cancel: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, ?paths, "serving");
    }
    loop {
        let (stream, peer) = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    debug!(error = %err, "accept failed");
                    continue;
                }
            },
        };
        let health = health.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let path = request.uri().path();
            let (status, content_type, body) = if paths.contains(&path) {
                health.answer(path)
            } else {
                health.answer("")
            };
            let response = Response::builder()
                .status(status)
                .header("content-type", content_type)
                .body(Full::new(Bytes::from(body)));
            async move { Ok::<_, Infallible>(response.unwrap_or_default()) }
        });
        tokio::spawn(async move {
            if let Err(err) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(%peer, error = %err, "connection ended with an error");
            }
        });
    }
}
