//! [`FaultProxy`]: network faults between clients and a server, injected by a
//! real Toxiproxy rather than simulated in the client.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::{
    Error, Result, TestEnv, ToxiproxyBinary, env::scratch_dir, ports::free_port,
    process::Supervised,
};

/// The name of the one proxy each toxiproxy-server holds.
const PROXY: &str = "kube-testenv";

/// How long toxiproxy-server may take to answer its API after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one request to Toxiproxy's API may take. It answers in
/// milliseconds, except that removing a toxic waits for each link's toxics to
/// take the change, and a link held by a stall (a `timeout` toxic) takes it only
/// once the stall is lifted: seconds, with stalls and latency held at once.
const API_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a request Toxiproxy's API gave up on is sent in all.
const API_ATTEMPTS: u64 = 4;

/// A TCP proxy in front of a server (usually the API server of a
/// [`TestEnv`]) that injects network faults on command: connections reset,
/// stalled or refused, latency, limited bandwidth.
///
/// It runs its own toxiproxy-server (built once from the Go module
/// `toxiproxy/` beside this crate, like the control plane) on free loopback
/// ports. Only clients that connect through [`listen_addr`](Self::listen_addr)
/// see the faults: build them with [`TestEnv::client_via`] or
/// [`TestEnv::kubeconfig_via`], while the environment's own clients keep a
/// direct path to the API server.
///
/// Faults act on new connections and on connections already open, as
/// Toxiproxy applies them; they stay until [`clear`](Self::clear),
/// [`restore`](Self::restore) or [`reset`](Self::reset) lifts them. Dropping
/// the proxy stops toxiproxy-server and so closes every connection through it.
/// A [`cut`](Self::cut) stops it too: Toxiproxy files each connection under its
/// client's address and can lose one whose client reused the address of a
/// connection that had just closed, which disabling the proxy would leave open.
///
/// ```no_run
/// # async fn demo() -> kube_testenv::Result<()> {
/// use k8s_openapi::api::core::v1::Namespace;
/// use kube_client::{Api, api::ListParams};
/// use kube_testenv::{FaultProxy, TestEnv};
///
/// let env = TestEnv::shared().await;
/// let proxy = FaultProxy::for_apiserver(env).await?;
/// let namespaces: Api<Namespace> = Api::all(env.client_via(&proxy).await?);
/// proxy.cut().await?;
/// assert!(namespaces.list(&ListParams::default()).await.is_err());
/// proxy.restore().await?;
/// namespaces.list(&ListParams::default()).await.expect("reachable again");
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    // Field order: toxiproxy-server stops before its directory is removed.
    server: tokio::sync::Mutex<Server>,
    /// toxiproxy-server's process id; 0 while the proxy is cut.
    pid: AtomicU32,
    binary: PathBuf,
    args: Vec<String>,
    api: Api,
    listen: SocketAddr,
    upstream: SocketAddr,
    _dir: tempfile::TempDir,
}

/// toxiproxy-server, running, or stopped by a [`FaultProxy::cut`] with the toxics it had.
#[derive(Debug)]
enum Server {
    Running(Supervised),
    Cut {
        /// Each toxic as Toxiproxy described it, added again on restore.
        toxics: Vec<Value>,
    },
}

impl FaultProxy {
    /// Starts toxiproxy-server, building it first if the cache lacks it, and
    /// a proxy in it that forwards a free loopback port to `upstream`, with
    /// no fault yet.
    ///
    /// # Errors
    ///
    /// [`Error::GoMissing`] or [`Error::BuildFailed`] if it cannot be built;
    /// [`Error::Spawn`], [`Error::Exited`] or [`Error::NotReady`] if it does
    /// not come up; [`Error::Toxiproxy`] if it refuses the proxy.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let started = Instant::now();
        let binary = tokio::task::spawn_blocking(ToxiproxyBinary::ensure)
            .await
            .expect("the toxiproxy build does not panic")?;
        let dir = scratch_dir(Some("toxiproxy"))?;
        let log = dir.path().join("toxiproxy.log");
        let api_port = free_port()?;
        let args = vec!["-host=127.0.0.1".to_owned(), format!("-port={api_port}")];
        let api = Api {
            base: format!("http://127.0.0.1:{api_port}"),
            log,
        };
        // Port 0 lets Toxiproxy bind the listener itself, leaving no window in
        // which another process could take a port picked here; it binds the
        // same port again when the proxy is restored after a cut.
        let (process, created) =
            spawn_server(binary.path(), &args, &api, "127.0.0.1:0", upstream).await?;
        let listen = serde_json::from_str::<Value>(&created)
            .ok()
            .and_then(|proxy| proxy["listen"].as_str()?.parse::<SocketAddr>().ok())
            .ok_or_else(|| {
                api.error(
                    format!("creating the proxy to {upstream}"),
                    format!("no listen address in its answer {created}"),
                )
            })?;
        tracing::info!(
            %listen,
            %upstream,
            api = %api.base,
            pid = process.pid(),
            elapsed_ms = started.elapsed().as_millis(),
            "fault proxy ready"
        );
        Ok(Self {
            pid: AtomicU32::new(process.pid()),
            server: tokio::sync::Mutex::new(Server::Running(process)),
            binary: binary.path().to_owned(),
            args,
            api,
            listen,
            upstream,
            _dir: dir,
        })
    }

    /// [`start`](Self::start) in front of `env`'s API server.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn for_apiserver(env: &TestEnv) -> Result<Self> {
        Self::start(env.apiserver_addr()).await
    }

    /// The address clients connect to instead of the upstream's.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// The address the proxy forwards to.
    pub fn upstream_addr(&self) -> SocketAddr {
        self.upstream
    }

    /// The base URL of Toxiproxy's HTTP API, e.g. `http://127.0.0.1:43210`,
    /// for faults this type has no method for. The proxy is named
    /// `kube-testenv`.
    pub fn api_url(&self) -> &str {
        &self.api.base
    }

    /// toxiproxy-server's log file.
    pub fn log_path(&self) -> &Path {
        &self.api.log
    }

    /// toxiproxy-server's process id; `None` while the proxy is [`cut`](Self::cut).
    pub fn pid(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::Relaxed)).filter(|&pid| pid != 0)
    }

    /// Resets every connection that carries a byte from now on, in either
    /// direction: a new connection is reset (`RST`) as soon as the client
    /// sends its TLS hello, an open one is closed when either side next
    /// sends (Toxiproxy can close those only with a `FIN`).
    ///
    /// Toxics `reset_peer` with `timeout` 0, upstream and downstream.
    ///
    /// # Errors
    ///
    /// [`Error::Toxiproxy`] if Toxiproxy refuses.
    pub async fn reset_connections(&self) -> Result<()> {
        self.both_ways("reset_peer", json!({ "timeout": 0 })).await
    }

    /// Stalls every connection: no byte passes in either direction and none
    /// is closed, so a request hangs until the client's own timeout, the way
    /// a dead peer behind a silent network looks. New connections are
    /// accepted and stall too.
    ///
    /// Toxics `timeout` with `timeout` 0, upstream and downstream. Lifting
    /// them ([`clear`](Self::clear)) closes the stalled connections, as
    /// Toxiproxy does.
    ///
    /// # Errors
    ///
    /// [`Error::Toxiproxy`] if Toxiproxy refuses.
    pub async fn stall(&self) -> Result<()> {
        self.timeout(Duration::ZERO).await
    }

    /// Stops every byte in either direction, like [`stall`](Self::stall), and
    /// then closes each connection once `after` has passed without its
    /// client or its server sending (Toxiproxy restarts a direction's clock
    /// at each chunk it drops): a client that waits for an answer sees its
    /// connection closed (`EOF`) `after` the fault takes hold, or `after` it
    /// connects if it connects later. A zero `after` never closes: that is
    /// [`stall`](Self::stall). Toxiproxy counts in whole milliseconds.
    ///
    /// Toxics `timeout`, upstream and downstream, named as those of
    /// [`stall`](Self::stall), which this replaces and which replaces it.
    ///
    /// # Errors
    ///
    /// [`Error::Toxiproxy`] if Toxiproxy refuses.
    pub async fn timeout(&self, after: Duration) -> Result<()> {
        self.both_ways("timeout", json!({ "timeout": millis(after) }))
            .await
    }

    /// Makes the upstream unreachable: closes every open connection and
    /// stops listening, so a new connection is refused at once. Toxics stay
    /// configured for when [`restore`](Self::restore) listens again, and can
    /// be added and removed meanwhile.
    ///
    /// toxiproxy-server is stopped (and started again by `restore`): only the
    /// end of its process closes every connection for certain (see the
    /// [type](Self)).
    ///
    /// # Errors
    ///
    /// [`Error::Toxiproxy`] if Toxiproxy does not list its toxics.
    pub async fn cut(&self) -> Result<()> {
        let mut server = self.server.lock().await;
        let Server::Running(process) = &mut *server else {
            return Ok(());
        };
        let toxics = self.api.toxics().await?;
        process.kill();
        self.pid.store(0, Ordering::Relaxed);
        *server = Server::Cut { toxics };
        tracing::info!(proxy = %self.listen, upstream = %self.upstream, "fault proxy cut");
        Ok(())
    }

    /// Listens again after [`cut`](Self::cut), on the same port, with the
    /// toxics in force then (or added since).
    ///
    /// # Errors
    ///
    /// [`Error::Spawn`], [`Error::Exited`] or [`Error::NotReady`] if
    /// toxiproxy-server does not come up again; [`Error::Toxiproxy`] if it
    /// refuses the proxy, e.g. because another process took the port in
    /// between, or a toxic.
    pub async fn restore(&self) -> Result<()> {
        let mut server = self.server.lock().await;
        let Server::Cut { toxics } = &mut *server else {
            return Ok(());
        };
        let toxics = std::mem::take(toxics);
        let (process, _) = spawn_server(
            &self.binary,
            &self.args,
            &self.api,
            &self.listen.to_string(),
            self.upstream,
        )
        .await?;
        self.pid.store(process.pid(), Ordering::Relaxed);
        *server = Server::Running(process);
        for toxic in toxics {
            let path = format!("/proxies/{PROXY}/toxics");
            self.api
                .call(Method::POST, &path, Some(toxic.clone()), || {
                    format!("adding toxic {} again", toxic["name"])
                })
                .await?;
        }
        tracing::info!(proxy = %self.listen, upstream = %self.upstream, "fault proxy restored");
        Ok(())
    }

    /// Delays everything the upstream sends by `latency`, give or take up to
    /// `jitter`, so each request-response round trip takes that much longer
    /// (a TLS handshake on a new connection adds another round trip).
    /// Toxiproxy counts in whole milliseconds.
    ///
    /// Toxic `latency`, downstream. Calling it again replaces the delay.
    ///
    /// # Errors
    ///
    /// [`Error::Toxiproxy`] if Toxiproxy refuses.
    pub async fn latency(&self, latency: Duration, jitter: Duration) -> Result<()> {
        self.downstream(
            "latency",
            json!({
                "latency": millis(latency),
                "jitter": millis(jitter),
            }),
        )
        .await
    }

    /// Limits what the upstream sends to `kb_per_s` kilobytes (1000 bytes) a
    /// second per connection, e.g. to make a large list or a watch's events
    /// arrive slowly.
    ///
    /// Toxic `bandwidth`, downstream. Calling it again replaces the rate.
    ///
    /// # Errors
    ///
    /// [`Error::Toxiproxy`] if Toxiproxy refuses.
    pub async fn bandwidth(&self, kb_per_s: u64) -> Result<()> {
        self.downstream("bandwidth", json!({ "rate": kb_per_s }))
            .await
    }

    /// Cuts what the upstream sends into slices of about `average_size`
    /// bytes, give or take up to `size_variation`, and waits `delay` after
    /// each, so a response arrives in many small reads, the way a slow or
    /// fragmenting network delivers it. Toxiproxy counts the delay in whole
    /// microseconds.
    ///
    /// Toxic `slicer`, downstream. Calling it again replaces the slicing.
    ///
    /// # Errors
    ///
    /// [`Error::Toxiproxy`] if Toxiproxy refuses.
    ///
    /// # Panics
    ///
    /// If `average_size` is 0 or `size_variation` is not below it: Toxiproxy
    /// takes both, then recurses without end on the first byte it slices.
    pub async fn slicer(
        &self,
        average_size: usize,
        size_variation: usize,
        delay: Duration,
    ) -> Result<()> {
        assert!(
            size_variation < average_size,
            "a slicer needs 0 <= size_variation < average_size, got {size_variation} and \
             {average_size}"
        );
        let delay_us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.downstream(
            "slicer",
            json!({
                "average_size": average_size,
                "size_variation": size_variation,
                "delay": delay_us,
            }),
        )
        .await
    }

    /// Adds a toxic of any type Toxiproxy has, for faults this type has no
    /// method for: `kind` is its type (`latency`, `bandwidth`, `slow_close`,
    /// `timeout`, `reset_peer`, `slicer`, `limit_data`), `stream` the way it
    /// acts, `toxicity` the probability that it acts on a connection (1.0 on
    /// every one; Toxiproxy draws for each connection and direction whenever
    /// it starts the toxic there: when either is new, and again when the
    /// chain of toxics changes), and `attributes` its type's JSON
    /// attributes, e.g. `{"latency": 300, "jitter": 0}` (times in
    /// milliseconds, except `slicer`'s `delay` in microseconds, as Toxiproxy
    /// takes them).
    ///
    /// If a toxic named `name` is in force already, this replaces it:
    /// Toxiproxy updates it in place when the type and stream are the same,
    /// and otherwise it is removed and the new one added. The convenience
    /// methods name their toxics `<type>_<stream>` (e.g.
    /// `latency_downstream`), so a toxic added here under such a name
    /// replaces theirs and [`clear`](Self::clear) removes all alike.
    ///
    /// ```no_run
    /// # async fn demo(proxy: &kube_testenv::FaultProxy) -> kube_testenv::Result<()> {
    /// use kube_testenv::ToxicStream;
    ///
    /// // Half of the connections see at most 1 kB from the server, then are closed.
    /// let attributes = serde_json::json!({ "bytes": 1000 });
    /// proxy.add_toxic("truncated", "limit_data", ToxicStream::Downstream, 0.5, attributes).await?;
    /// proxy.remove_toxic("truncated").await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Toxiproxy`] if Toxiproxy refuses, e.g. an unknown type or
    /// attributes of the wrong JSON type.
    pub async fn add_toxic(
        &self,
        name: &str,
        kind: &str,
        stream: ToxicStream,
        toxicity: f32,
        attributes: Value,
    ) -> Result<()> {
        let body = json!({
            "name": name,
            "type": kind,
            "stream": stream.as_str(),
            "toxicity": toxicity,
            "attributes": attributes,
        });
        let mut server = self.server.lock().await;
        match &mut *server {
            Server::Cut { toxics } => {
                toxics.retain(|toxic| toxic["name"] != name);
                toxics.push(body);
            }
            Server::Running(_) => self.api.add_toxic(name, kind, stream, body).await?,
        }
        tracing::info!(
            proxy = %self.listen,
            toxic = %name,
            kind,
            stream = stream.as_str(),
            toxicity,
            %attributes,
            "toxic in force"
        );
        Ok(())
    }

    /// Removes the toxic named `name`, as [`toxics`](Self::toxics) lists it;
    /// one that is not there is removed already. Connections it held (a
    /// `timeout` toxic's) are closed, as Toxiproxy does.
    ///
    /// # Errors
    ///
    /// [`Error::Toxiproxy`] if Toxiproxy refuses.
    pub async fn remove_toxic(&self, name: &str) -> Result<()> {
        let mut server = self.server.lock().await;
        match &mut *server {
            Server::Cut { toxics } => toxics.retain(|toxic| toxic["name"] != name),
            Server::Running(_) => self.api.remove_toxic(name).await?,
        }
        tracing::info!(proxy = %self.listen, toxic = %name, "toxic removed");
        Ok(())
    }

    /// Removes every toxic (reset, stall, latency, bandwidth, and those of
    /// [`add_toxic`](Self::add_toxic)), so data flows freely again; a proxy
    /// that is [`cut`](Self::cut) stays cut.
    ///
    /// # Errors
    ///
    /// [`Error::Toxiproxy`] if Toxiproxy refuses.
    pub async fn clear(&self) -> Result<()> {
        let mut server = self.server.lock().await;
        match &mut *server {
            Server::Cut { toxics } => toxics.clear(),
            Server::Running(_) => {
                for toxic in self.api.toxics().await? {
                    if let Some(name) = toxic["name"].as_str() {
                        self.api.remove_toxic(name).await?;
                    }
                }
            }
        }
        tracing::info!(proxy = %self.listen, "toxics cleared");
        Ok(())
    }

    /// [`clear`](Self::clear) and [`restore`](Self::restore) at once: the
    /// proxy as it started.
    ///
    /// # Errors
    ///
    /// [`Error::Toxiproxy`] if Toxiproxy refuses; as `restore` if the proxy
    /// was cut.
    pub async fn reset(&self) -> Result<()> {
        {
            let mut server = self.server.lock().await;
            match &mut *server {
                Server::Cut { toxics } => toxics.clear(),
                Server::Running(_) => {
                    self.api
                        .call(Method::POST, "/reset", None, || "resetting".to_owned())
                        .await?;
                    tracing::info!(proxy = %self.listen, "fault proxy reset");
                    return Ok(());
                }
            }
        }
        self.restore().await
    }

    /// The names of the toxics in force, e.g. `latency_downstream`.
    ///
    /// # Errors
    ///
    /// [`Error::Toxiproxy`] if Toxiproxy refuses or answers something else
    /// than a list of toxics.
    pub async fn toxics(&self) -> Result<Vec<String>> {
        let server = self.server.lock().await;
        let toxics = match &*server {
            Server::Cut { toxics } => toxics.clone(),
            Server::Running(_) => self.api.toxics().await?,
        };
        toxics
            .iter()
            .map(|toxic| {
                toxic["name"].as_str().map(str::to_owned).ok_or_else(|| {
                    self.api.error(
                        "listing toxics".to_owned(),
                        format!("a toxic without a name: {toxic}"),
                    )
                })
            })
            .collect()
    }

    /// A toxic of type `kind` on every connection, downstream, named
    /// `<kind>_downstream`.
    async fn downstream(&self, kind: &str, attributes: Value) -> Result<()> {
        let stream = ToxicStream::Downstream;
        self.add_toxic(&stream.name(kind), kind, stream, 1.0, attributes)
            .await
    }

    /// A toxic of type `kind` on every connection, upstream and downstream,
    /// named `<kind>_upstream` and `<kind>_downstream`.
    async fn both_ways(&self, kind: &str, attributes: Value) -> Result<()> {
        for stream in [ToxicStream::Upstream, ToxicStream::Downstream] {
            // Every connection, not a random share of them: tests must be
            // deterministic.
            self.add_toxic(&stream.name(kind), kind, stream, 1.0, attributes.clone())
                .await?;
        }
        Ok(())
    }
}

/// Toxiproxy's HTTP API on one toxiproxy-server.
#[derive(Debug)]
struct Api {
    base: String,
    log: PathBuf,
}

impl Api {
    /// Adds the toxic `body` describes, or replaces the one named `name`: in place when
    /// its type and stream are the same, as Toxiproxy updates, or else removed first.
    async fn add_toxic(
        &self,
        name: &str,
        kind: &str,
        stream: ToxicStream,
        body: Value,
    ) -> Result<()> {
        let toxics = format!("/proxies/{PROXY}/toxics");
        let path = format!("{toxics}/{name}");
        let adding = || format!("adding toxic {name}");
        let (status, text) = self
            .send(Method::POST, &toxics, Some(&body), adding)
            .await?;
        if status == StatusCode::CONFLICT {
            let reading = || format!("reading toxic {name}");
            let current = self.call(Method::GET, &path, None, reading).await?;
            let current: Value = serde_json::from_str(&current)
                .map_err(|e| self.error(reading(), format!("{e} in {current}")))?;
            if current["type"] == kind && current["stream"] == stream.as_str() {
                let updating = || format!("updating toxic {name}");
                self.call(Method::POST, &path, Some(body), updating).await?;
            } else {
                self.remove_toxic(name).await?;
                self.call(Method::POST, &toxics, Some(body), adding).await?;
            }
        } else if !status.is_success() {
            return Err(self.error(adding(), format!("{status}: {text}")));
        }
        Ok(())
    }

    /// Removes the toxic named `name`; one that is not there is removed already.
    async fn remove_toxic(&self, name: &str) -> Result<()> {
        let path = format!("/proxies/{PROXY}/toxics/{name}");
        let removing = || format!("removing toxic {name}");
        let (status, text) = self.send(Method::DELETE, &path, None, removing).await?;
        // Not there is removed: a removal sent again after a timeout finds it gone.
        if !status.is_success() && status != StatusCode::NOT_FOUND {
            return Err(self.error(removing(), format!("{status}: {text}")));
        }
        Ok(())
    }

    /// Each toxic in force, as Toxiproxy describes it (name, type, stream, toxicity and
    /// attributes: what adding it takes).
    async fn toxics(&self) -> Result<Vec<Value>> {
        let path = format!("/proxies/{PROXY}/toxics");
        let what = || "listing toxics".to_owned();
        let body = self.call(Method::GET, &path, None, what).await?;
        serde_json::from_str(&body).map_err(|e| self.error(what(), format!("{e} in {body}")))
    }

    /// Polls `/version` until it answers, failing early if the process exits.
    async fn wait_ready(&self, process: &mut Supervised) -> Result<()> {
        let started = Instant::now();
        let mut last_problem = String::from("no probe yet");
        while started.elapsed() < START_TIMEOUT {
            process.check_running()?;
            let uri = format!("{}/version", self.base);
            match crate::http::request(Method::GET, &uri, None, API_TIMEOUT).await {
                Ok((status, version)) if status.is_success() => {
                    tracing::debug!(
                        %version,
                        elapsed_ms = started.elapsed().as_millis(),
                        "toxiproxy-server ready"
                    );
                    return Ok(());
                }
                Ok((status, body)) => last_problem = format!("/version answered {status}: {body}"),
                Err(reason) => last_problem = reason,
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(Error::NotReady {
            component: "toxiproxy-server",
            waited: START_TIMEOUT,
            last_problem,
            log: self.log.clone(),
        })
    }

    /// Sends a request and returns the body of a successful answer.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        action: impl Fn() -> String,
    ) -> Result<String> {
        let (status, text) = self.send(method, path, body.as_ref(), &action).await?;
        if !status.is_success() {
            return Err(self.error(action(), format!("{status}: {text}")));
        }
        Ok(text)
    }

    /// Sends a request and returns whatever status it answers. A request Toxiproxy's
    /// API gives up on (`503` with its handler's "Timeout" page: a toxic's change waits
    /// while the link it acts on is busy handing on held bytes) is sent again, up to
    /// [`API_ATTEMPTS`] times, a second apart and more: Toxiproxy finishes the change in
    /// the meantime, and a second add finds it (`409`), a second removal finds it gone.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        action: impl Fn() -> String,
    ) -> Result<(StatusCode, String)> {
        let uri = format!("{}{path}", self.base);
        let mut attempt = 1;
        loop {
            let (status, text) = crate::http::request(
                method.clone(),
                &uri,
                body.map(Value::to_string),
                API_TIMEOUT,
            )
            .await
            .map_err(|reason| self.error(action(), reason))?;
            let gave_up = status == StatusCode::SERVICE_UNAVAILABLE && text.contains("Timeout");
            if !gave_up || attempt == API_ATTEMPTS {
                return Ok((status, text));
            }
            tracing::warn!(action = %action(), attempt, "Toxiproxy's API timed out; sending again");
            tokio::time::sleep(Duration::from_secs(attempt)).await;
            attempt += 1;
        }
    }

    fn error(&self, action: String, reason: String) -> Error {
        Error::Toxiproxy {
            action,
            reason,
            log: self.log.clone(),
        }
    }
}

/// Which way a toxic of a [`FaultProxy`] acts: on what the client sends or
/// on what the server sends back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToxicStream {
    /// What the client sends to the server.
    Upstream,
    /// What the server sends back to the client.
    Downstream,
}

impl ToxicStream {
    /// `upstream` or `downstream`, as Toxiproxy spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ToxicStream::Upstream => "upstream",
            ToxicStream::Downstream => "downstream",
        }
    }

    /// `<kind>_<stream>`, the name Toxiproxy itself gives an unnamed toxic.
    fn name(self, kind: &str) -> String {
        format!("{kind}_{}", self.as_str())
    }
}

/// Starts toxiproxy-server with `args` and, in it, the proxy from `listen` to
/// `upstream`; returns the process and Toxiproxy's description of the proxy.
async fn spawn_server(
    binary: &Path,
    args: &[String],
    api: &Api,
    listen: &str,
    upstream: SocketAddr,
) -> Result<(Supervised, String)> {
    let mut process = Supervised::start("toxiproxy-server", binary, args, &api.log)?;
    api.wait_ready(&mut process).await?;
    let created = api
        .call(
            Method::POST,
            "/proxies",
            Some(json!({
                "name": PROXY,
                "listen": listen,
                "upstream": upstream.to_string(),
                "enabled": true,
            })),
            || format!("creating the proxy from {listen} to {upstream}"),
        )
        .await?;
    Ok((process, created))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
