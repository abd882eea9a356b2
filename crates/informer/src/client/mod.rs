//! An API client for informers that finds a dead connection in seconds.
//!
//! kube-client's default client speaks HTTP/1.1, one connection per watch, and notices a
//! connection that silently stopped carrying bytes (a load balancer that forgot the flow,
//! a peer gone behind a silent network) only when the watch's own idle timeout runs out.
//! [`client`] builds the same stack (kube-client's TLS configuration, authentication,
//! base URI and headers) on HTTP/2 with keep-alive pings, as client-go does: requests and
//! watches share a connection per API server, another opened only when one carries all
//! the streams a server allows, and a ping that goes unanswered closes a connection, so
//! each watch on it ends with an error and reconnects at once. Its requests are
//! counted and timed under client-go's REST client metric names, which a
//! [`Manager`](crate::Manager) serves.

mod cluster;
pub(crate) mod metrics;
mod pool;

use std::time::Duration;

use hyper_util::{
    client::legacy::{Client as HyperClient, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use kube_client::{Client, Config, client::ConfigExt};
use tower::ServiceBuilder;
use tracing::warn;

use crate::error::{BoxError, Error};
use pool::{DEFAULT_STREAMS_PER_CONNECTION, StreamPool};

pub use cluster::ClusterSource;

/// When an HTTP/2 connection is pinged, and how long an answer may take.
///
/// The defaults find a dead connection within 25 s (client-go: within 45 s, a ping after
/// 30 s of silence and 15 s for its answer). A ping is a few bytes, sent only on a
/// connection that has been silent for [`idle`](Self::idle).
///
/// ```
/// use std::time::Duration;
/// use kube_informer::client::KeepAlive;
///
/// let keep_alive = KeepAlive::default().idle(Duration::from_secs(5)).timeout(Duration::from_secs(5));
/// # let _ = keep_alive;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepAlive {
    idle: Duration,
    timeout: Duration,
}

impl KeepAlive {
    /// A connection that received nothing for this long is pinged (15 s).
    #[must_use]
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// A ping unanswered for this long closes the connection (10 s), ending every request
    /// and watch on it with an error.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl Default for KeepAlive {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(15),
            timeout: Duration::from_secs(10),
        }
    }
}

/// How a client built by [`client_with`] uses its connections: the pings that find a dead
/// one, and how many open streams one carries before the next request opens another.
///
/// An HTTP/2 server caps the streams a connection may hold open (kube-apiserver
/// advertises 100 unless `--http2-max-streams-per-connection` says otherwise), and every
/// watch holds one for minutes. A request past the cap would wait on its connection until
/// a watch ends; the client sends it on another connection instead, as Go's transport does.
///
/// ```
/// use std::time::Duration;
/// use kube_informer::client::{Connections, KeepAlive};
///
/// // A server started with `--http2-max-streams-per-connection=1000`.
/// let connections = Connections::default()
///     .keep_alive(KeepAlive::default().idle(Duration::from_secs(5)))
///     .streams_per_connection(1000);
/// # let _ = connections;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connections {
    keep_alive: KeepAlive,
    streams_per_connection: usize,
    window: Window,
}

/// How much a server may send before the client has read it: HTTP/2's flow-control
/// windows, which bound what a connection buffers while its reader is behind (a list
/// arriving faster than it decodes, say).
///
/// ```
/// use kube_informer::client::{Connections, Window};
///
/// // One connection per cluster of a fleet: what each buffers counts many times over.
/// let connections = Connections::default().window(Window::Adaptive);
/// # let _ = connections;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// Fixed windows, in bytes, per stream and per connection. The default is hyper's,
    /// 2 MiB and 5 MiB: a large list streams without waiting for the reader, for up to
    /// 2 MiB of buffered frames per stream, memory the allocator mostly keeps afterwards.
    Fixed {
        /// The window of each stream.
        stream: u32,
        /// The window of the whole connection.
        connection: u32,
    },
    /// Windows that start at HTTP/2's 64 KiB and grow to the link's bandwidth-delay
    /// product, measured with pings while data flows: a connection buffers little while a
    /// list arrives, at the price of a slower start (a list of 10,000 Pods took about a
    /// tenth longer on one machine). What a fleet's clusters use, since a fleet pays each
    /// connection's buffers once per cluster.
    Adaptive,
}

impl Default for Window {
    fn default() -> Self {
        Self::Fixed {
            stream: 2 << 20,
            connection: 5 << 20,
        }
    }
}

impl Connections {
    /// When a connection is pinged, and how long an answer may take ([`KeepAlive::default`]).
    #[must_use]
    pub fn keep_alive(mut self, keep_alive: KeepAlive) -> Self {
        self.keep_alive = keep_alive;
        self
    }

    /// The most streams (requests and watches in progress) one connection carries (100,
    /// kube-apiserver's default cap; at least 1). Set it to the server's own cap when that
    /// is known to be higher, or lower for a proxy that allows fewer: a request past the
    /// server's cap waits on its connection until a stream ends.
    #[must_use]
    pub fn streams_per_connection(mut self, streams: usize) -> Self {
        self.streams_per_connection = streams.max(1);
        self
    }

    /// The flow-control windows (by default [`Window::Fixed`] at hyper's 2 MiB per stream).
    #[must_use]
    pub fn window(mut self, window: Window) -> Self {
        self.window = window;
        self
    }
}

impl Default for Connections {
    fn default() -> Self {
        Self {
            keep_alive: KeepAlive::default(),
            streams_per_connection: DEFAULT_STREAMS_PER_CONNECTION,
            window: Window::default(),
        }
    }
}

/// A client for `config` on HTTP/2 with the default [`Connections`]: pings that find a dead
/// connection in 25 s, and at most 100 streams on a connection.
///
/// Use it for the `Api`s informers watch through: a stalled connection is then found by
/// its pings, in seconds, instead of by the reflector's idle timeout
/// ([`ReflectorConfig::idle_timeout`](crate::reflector::ReflectorConfig::idle_timeout)). A server
/// that offers no HTTP/2 (no TLS, or no `h2` in its ALPN) is spoken to over HTTP/1.1, and
/// a configured proxy (`proxy-url`) gets kube-client's own client, both without pings.
///
/// ```no_run
/// use k8s_openapi::api::core::v1::Pod;
/// use kube_client::{Api, Config};
/// use kube_informer::SharedInformer;
///
/// # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
/// let client = kube_informer::client(Config::infer().await?)?;
/// let informer = SharedInformer::new(Api::<Pod>::all(client));
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`Error::Client`] when the configuration's TLS or authentication settings are unusable
/// (unreadable certificates, an invalid `tls-server-name`, ...).
pub fn client(config: Config) -> Result<Client, Error> {
    client_with(config, Connections::default())
}

/// A client for `config` on HTTP/2, its connections used as `connections` says (see
/// [`client`]).
///
/// # Errors
///
/// [`Error::Client`], as for [`client`].
pub fn client_with(config: Config, connections: Connections) -> Result<Client, Error> {
    if config.proxy_url.is_some() {
        warn!("a proxy is configured: using kube-client's HTTP/1.1 client, without pings");
        return Client::try_from(config).map_err(|e| Error::Client(e.into()));
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let tls = config
        .rustls_client_config()
        .map_err(|e| Error::Client(e.into()))?;
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| Error::Client(format!("tls-server-name {name:?}: {e}").into()))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_http1().enable_http2().wrap_connector(http);
    let keep_alive = connections.keep_alive;
    let mut builder = HyperClient::builder(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(keep_alive.idle)
        .http2_keep_alive_timeout(keep_alive.timeout)
        .http2_keep_alive_while_idle(true);
    match connections.window {
        Window::Adaptive => {
            builder.http2_adaptive_window(true);
        }
        Window::Fixed { stream, connection } => {
            builder
                .http2_initial_stream_window_size(stream)
                .http2_initial_connection_window_size(connection);
        }
    }
    // Each hyper client keeps its own connection; the pool adds one when all are full.
    let hyper = StreamPool::new(connections.streams_per_connection, move || {
        builder.build::<_, kube_client::client::Body>(https.clone())
    });
    let auth = config.auth_layer().map_err(|e| Error::Client(e.into()))?;
    let headers = config
        .extra_headers_layer()
        .map_err(|e| Error::Client(e.into()))?;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(auth)
        .layer(headers)
        .layer(metrics::RecordRequests)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::new("https://127.0.0.1:6443".parse().unwrap())
    }

    #[tokio::test]
    async fn a_configuration_builds_a_client() {
        let client = client(config()).expect("a plain configuration is usable");
        assert_eq!(client.default_namespace(), "default");
        let fixed = Connections::default().window(Window::Fixed {
            stream: 1 << 20,
            connection: 4 << 20,
        });
        assert!(
            client_with(config(), fixed).is_ok(),
            "fixed windows are usable"
        );
    }

    #[tokio::test]
    async fn an_invalid_tls_server_name_is_a_clear_error() {
        let mut config = config();
        config.tls_server_name = Some("not a host name!".to_owned());
        let Err(err) = client(config) else {
            panic!("an invalid name is refused")
        };
        assert!(matches!(err, Error::Client(_)), "{err:?}");
        assert!(err.to_string().contains("tls-server-name"), "{err}");
    }

    #[tokio::test]
    async fn an_unreadable_certificate_is_a_clear_error() {
        let mut config = config();
        config.root_cert = Some(vec![b"not a certificate".to_vec()]);
        let Err(err) = client(config) else {
            panic!("a bad certificate is refused")
        };
        assert!(matches!(err, Error::Client(_)), "{err:?}");
    }
}
