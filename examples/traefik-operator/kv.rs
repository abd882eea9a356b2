//! Traefik's dynamic configuration in etcd: one [`Route`] becomes a router and a
//! load-balancer service under the KV provider's root key, written in one transaction.
//!
//! For a route named `n` under root `traefik`:
//!
//! | key | value |
//! |---|---|
//! | `traefik/http/routers/n/entrypoints/0` | the entrypoint |
//! | `traefik/http/routers/n/rule` | the rule |
//! | `traefik/http/routers/n/service` | `n` |
//! | `traefik/http/services/n/loadBalancer/servers/0/url` | the backend URL |
//!
//! [`TraefikKv::sync`] reads every key under `routers/n/` and `services/n/` (page by page,
//! at one revision), then in one transaction puts the keys that differ and deletes those
//! the route no longer has. The stale keys are deleted as key ranges that lie between the
//! route's own keys, so a transaction holds at most a dozen operations however many stale
//! keys there are (etcd refuses more than its `--max-txn-ops`, and refuses a transaction
//! whose deleted range contains a key it also puts). The transaction only commits if
//! nothing under those prefixes changed since the read, so a range deletes exactly the
//! stale keys that were read, and the route is never seen half-written.
//!
//! It also keeps one unused middleware key ([`PLACEHOLDER_KEY`]) under the root: Traefik's
//! etcd watch fails and backs off while nothing is under the root, and with only non-route
//! keys left it would keep serving the last deleted route (traefik#8092).
//!
//! The connection is configured by [`EtcdOptions`](super::etcd::EtcdOptions): endpoints,
//! TLS (CA, client certificate) and user/password authentication. Error messages name no
//! endpoint address, because they end up in object statuses and logs.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Identity,
    KvClient, TlsOptions, Txn, TxnOp,
};
use tokio::sync::Mutex;
use tracing::{debug, info};

use super::etcd::{EtcdConfigError, EtcdOptions, MIN_TXN_OPS, read_certificates, read_private_key};

/// The unused middleware key that keeps Traefik's watch alive (relative to the root).
pub const PLACEHOLDER_KEY: &str = "http/middlewares/traefik-operator-placeholder/headers/customResponseHeaders/X-Traefik-Operator";

/// How often [`TraefikKv::sync`] retries a transaction that lost a race before giving up.
const ATTEMPTS: usize = 5;

/// Keys per range read: keeps every response far below gRPC's 4 MiB message limit however
/// many keys there are.
const PAGE: i64 = 1000;

/// One HTTP route: requests on `entrypoint` matching `rule` go to `url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The name of both the router and the service in Traefik (no `/`, no `@`).
    pub name: String,
    /// The entrypoint the router listens on.
    pub entrypoint: String,
    /// The router's rule, e.g. ``Host(`web.shop`)``.
    pub rule: String,
    /// The backend URL.
    pub url: String,
}

impl Route {
    /// Every key of this route under `root`, with its value.
    pub fn keys(&self, root: &str) -> BTreeMap<String, String> {
        let n = &self.name;
        BTreeMap::from([
            (
                format!("{root}/http/routers/{n}/entrypoints/0"),
                self.entrypoint.clone(),
            ),
            (format!("{root}/http/routers/{n}/rule"), self.rule.clone()),
            (format!("{root}/http/routers/{n}/service"), n.clone()),
            (
                format!("{root}/http/services/{n}/loadBalancer/servers/0/url"),
                self.url.clone(),
            ),
        ])
    }
}

/// What [`TraefikKv::sync`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Changes {
    /// Keys written.
    pub put: usize,
    /// Stale keys deleted.
    pub deleted: usize,
}

impl Changes {
    /// Whether etcd was left as it was.
    pub fn is_empty(&self) -> bool {
        self.put == 0 && self.deleted == 0
    }
}

/// Why talking to etcd failed. The messages are stable (no addresses, no timings), because
/// they end up in object statuses; [`detail`](Self::detail) has more for logs, with the
/// endpoints' addresses replaced by their position in `--etcd-endpoints`.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// No answer: etcd is down, unreachable, or too slow.
    #[error("etcd is unreachable ({kind}); retrying")]
    Unreachable {
        /// The kind of failure, e.g. `Unavailable`, `DeadlineExceeded`, `transport`.
        kind: String,
        /// The client's full error, for logs.
        detail: String,
    },
    /// The TLS handshake failed: an untrusted certificate, or etcd wanting a client
    /// certificate that was not given or that it does not trust.
    #[error(
        "TLS with etcd failed ({reason}); check --etcd-ca-file, --etcd-cert-file and \
         --etcd-key-file"
    )]
    Tls {
        /// The TLS library's reason, e.g. `received fatal alert: CertificateRequired`.
        reason: String,
        /// The client's full error, for logs.
        detail: String,
    },
    /// etcd did not accept the user and password.
    #[error("etcd rejected the credentials ({reason}); check --etcd-username and --etcd-password")]
    Unauthenticated {
        /// etcd's message.
        reason: String,
    },
    /// The user may not read or write the keys.
    #[error(
        "etcd denied access ({reason}); the etcd user needs a role with readwrite on the root \
         key's prefix and on --etcd-owner-prefix"
    )]
    PermissionDenied {
        /// etcd's message.
        reason: String,
    },
    /// etcd answered with another error.
    #[error("etcd refused the request: {reason}")]
    Refused {
        /// etcd's message.
        reason: String,
    },
    /// Someone else kept changing the route's keys between read and write.
    #[error("the keys of route {name} kept changing during the update ({ATTEMPTS} attempts)")]
    Contended {
        /// The route.
        name: String,
    },
    /// One sync would need more operations than etcd allows in a transaction.
    #[error(
        "updating route {name} needs {ops} operations in one etcd transaction, more than \
         --etcd-max-txn-ops {max}"
    )]
    TooManyOps {
        /// The route.
        name: String,
        /// Operations needed.
        ops: usize,
        /// `--etcd-max-txn-ops`.
        max: u32,
    },
}

impl KvError {
    /// The client's full error text, for logs (endpoint addresses replaced by their
    /// position).
    pub fn detail(&self) -> String {
        match self {
            KvError::Unreachable { detail, .. } | KvError::Tls { detail, .. } => detail.clone(),
            other => other.to_string(),
        }
    }
}

/// An error and its sources, outermost first.
fn chain<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Vec<&'a (dyn std::error::Error + 'static)> {
    let mut all = vec![err];
    while let Some(source) = all.last().and_then(|e| e.source()) {
        all.push(source);
    }
    all
}

/// The TLS failure somewhere in `errors`, if any. rustls' error travels inside an
/// `io::Error` (whose `source()` skips it), sometimes only as its text: an alert etcd sent
/// after the handshake, such as `CertificateRequired`, reaches us as `InvalidData` with
/// rustls' message.
fn tls_failure(errors: &[&(dyn std::error::Error + 'static)]) -> Option<String> {
    errors.iter().find_map(|e| {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        let io = e.downcast_ref::<std::io::Error>()?;
        if let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            return Some(tls.to_string());
        }
        let text = io.to_string();
        let lower = text.to_ascii_lowercase();
        (io.kind() == std::io::ErrorKind::InvalidData
            && [
                "alert",
                "certificate",
                "handshake",
                "peer is incompatible",
                "peer misbehaved",
            ]
            .iter()
            .any(|sign| lower.contains(sign)))
        .then_some(text)
    })
}

/// Stale keys among `existing` as key ranges `[start, end)` that contain no key of
/// `keep`: one range per run of stale keys between two kept keys. `existing` must be the
/// keys under one prefix only, so that no range reaches beyond it.
fn stale_ranges(existing: &BTreeSet<Vec<u8>>, keep: &BTreeSet<Vec<u8>>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut ranges = Vec::new();
    let mut run: Option<(&Vec<u8>, &Vec<u8>)> = None;
    for key in existing.union(keep) {
        if keep.contains(key) {
            ranges.extend(run.take());
        } else {
            run = Some(run.map_or((key, key), |(first, _)| (first, key)));
        }
    }
    ranges.extend(run);
    ranges
        .into_iter()
        .map(|(first, last)| {
            // The smallest key after `last`: the range ends right behind it.
            let mut end = last.clone();
            end.push(0);
            (first.clone(), end)
        })
        .collect()
}

/// The end of etcd's range of every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff: to the end of the key space.
    vec![0]
}

/// A connection to the etcd that Traefik's KV provider reads. Cheap to share behind an
/// `Arc`; connects lazily and reconnects after failures.
pub struct TraefikKv {
    endpoints: Vec<String>,
    root: String,
    connect: ConnectOptions,
    tls: bool,
    username: Option<String>,
    max_txn_ops: u32,
    client: Mutex<Option<Client>>,
    /// The reason of the last TLS failure, until a request succeeds. etcd closes the
    /// connection right after its alert, and the next attempts often see only a closed
    /// connection or a broken pipe (`Cancelled`, `Unknown`); that is the same failure, and
    /// says so.
    last_tls_failure: std::sync::Mutex<Option<String>>,
}

impl fmt::Debug for TraefikKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Addresses stay out of logs; how many endpoints there are is enough.
        f.debug_struct("TraefikKv")
            .field("endpoints", &self.endpoints.len())
            .field("root", &self.root)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Both flags of a pair, or neither.
fn paired(a: (bool, &'static str), b: (bool, &'static str)) -> Result<(), EtcdConfigError> {
    match (a, b) {
        ((true, given), (false, missing)) | ((false, missing), (true, given)) => {
            Err(EtcdConfigError::Incomplete { given, missing })
        }
        _ => Ok(()),
    }
}

fn base_connect_options() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
        // etcd's simple tokens expire (5 min by default); a long-lived client re-authenticates.
        .with_auto_token_refresh(true)
}

impl TraefikKv {
    /// A writer for Traefik's provider at `endpoints` (`host:port` or URLs) under `root`
    /// (Traefik's `--providers.etcd.rootkey`, by default `traefik`), over plaintext and
    /// without authentication. Nothing is contacted yet.
    pub fn new(endpoints: Vec<String>, root: impl Into<String>) -> Self {
        Self {
            endpoints,
            root: root.into().trim_end_matches('/').to_owned(),
            connect: base_connect_options(),
            tls: false,
            username: None,
            max_txn_ops: 128,
            client: Mutex::new(None),
            last_tls_failure: std::sync::Mutex::new(None),
        }
    }

    /// A writer configured by `options`: TLS when a CA is given, a client certificate,
    /// user and password. The files are read and checked now; etcd is contacted on first
    /// use.
    ///
    /// # Errors
    ///
    /// [`EtcdConfigError`]: no or malformed endpoints, a flag missing its pair, a file
    /// that cannot be read or holds no valid PEM, `max_txn_ops` below [`MIN_TXN_OPS`].
    pub fn connect_with(options: &EtcdOptions) -> Result<Self, EtcdConfigError> {
        if options.endpoints.is_empty() {
            return Err(EtcdConfigError::NoEndpoints);
        }
        if options.max_txn_ops < MIN_TXN_OPS {
            return Err(EtcdConfigError::MaxTxnOps {
                value: options.max_txn_ops,
            });
        }
        let tls = options.wants_tls();
        for (index, endpoint) in options.endpoints.iter().enumerate() {
            let url = if endpoint.contains("://") {
                endpoint.clone()
            } else {
                format!("http://{endpoint}")
            };
            let parsed =
                url::Url::parse(&url).map_err(|_| EtcdConfigError::BadEndpoint { index })?;
            match parsed.scheme() {
                "http" if tls && endpoint.contains("://") => {
                    return Err(EtcdConfigError::PlainEndpointWithTls { index });
                }
                "http" | "https" if parsed.host().is_some() => {}
                _ => return Err(EtcdConfigError::BadEndpoint { index }),
            }
        }
        let mut connect = base_connect_options();
        paired(
            (options.cert_file.is_some(), "--etcd-cert-file"),
            (options.key_file.is_some(), "--etcd-key-file"),
        )?;
        paired(
            (options.username.is_some(), "--etcd-username"),
            (options.password.is_some(), "--etcd-password"),
        )?;
        if tls {
            let ca = options
                .ca_file
                .as_deref()
                .ok_or(EtcdConfigError::TlsWithoutCa)?;
            let mut config = TlsOptions::new()
                .ca_certificate(Certificate::from_pem(read_certificates("CA file", ca)?));
            if let (Some(cert), Some(key)) = (&options.cert_file, &options.key_file) {
                config = config.identity(Identity::from_pem(
                    read_certificates("client certificate", cert)?,
                    read_private_key(key)?,
                ));
            }
            if let Some(name) = &options.tls_server_name {
                config = config.domain_name(name.clone());
            }
            connect = connect.with_tls(config);
        }
        if let (Some(user), Some(password)) = (&options.username, &options.password) {
            connect = connect.with_user(user.clone(), password.expose());
        }
        Ok(Self {
            endpoints: options.endpoints.clone(),
            root: options.root_key.trim_end_matches('/').to_owned(),
            connect,
            tls,
            username: options.username.clone(),
            max_txn_ops: options.max_txn_ops,
            client: Mutex::new(None),
            last_tls_failure: std::sync::Mutex::new(None),
        })
    }

    /// The root key.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// `text` with every endpoint's address replaced by its position.
    fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (index, endpoint) in self.endpoints.iter().enumerate() {
            let name = format!("etcd endpoint #{index}");
            let bare = endpoint
                .split_once("://")
                .map_or(endpoint.as_str(), |(_, rest)| rest)
                .trim_end_matches('/');
            for form in [endpoint.as_str(), bare] {
                if !form.is_empty() {
                    text = text.replace(form, &name);
                }
            }
            // The host alone, e.g. in a certificate name mismatch; a dotless name such as
            // `etcd` is left, as replacing it would mangle words like `etcdserver`.
            if let Some((host, _port)) = bare.rsplit_once(':')
                && (host.contains('.') || host.contains(':'))
            {
                text = text.replace(host, &format!("the host of {name}"));
            }
        }
        text
    }

    fn classify(&self, err: etcd_client::Error) -> KvError {
        // etcd-client's error has no `source()`: start from what it wraps.
        let errors = match &err {
            etcd_client::Error::GRpcStatus(status) => chain(status),
            etcd_client::Error::TransportError(transport) => chain(transport),
            etcd_client::Error::IoError(io) => chain(io),
            other => chain(other),
        };
        let detail = self.redact(
            &errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(": "),
        );
        let mut last_tls = self
            .last_tls_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(reason) = tls_failure(&errors) {
            let reason = self.redact(&reason);
            *last_tls = Some(reason.clone());
            return KvError::Tls { reason, detail };
        }
        let err = self.classify_answer(&err, detail);
        match (err, &*last_tls) {
            // Not `Unavailable` (refused, no route): that is etcd gone, whatever came before.
            (KvError::Unreachable { kind, detail }, Some(reason))
                if kind == "Cancelled" || kind == "Unknown" =>
            {
                KvError::Tls {
                    reason: reason.clone(),
                    detail,
                }
            }
            (err, _) => err,
        }
    }

    fn classify_answer(&self, err: &etcd_client::Error, detail: String) -> KvError {
        match err {
            etcd_client::Error::GRpcStatus(status) => {
                // tonic's `Code`, by name: etcd-client does not re-export the type.
                let code = format!("{:?}", status.code());
                let reason = self.redact(status.message());
                match code.as_str() {
                    "Unavailable" | "DeadlineExceeded" | "Unknown" | "Cancelled" => {
                        KvError::Unreachable { kind: code, detail }
                    }
                    "PermissionDenied" => KvError::PermissionDenied { reason },
                    // etcd answers a wrong password with InvalidArgument, and an expired or
                    // missing token with Unauthenticated.
                    _ if code == "Unauthenticated" || reason.contains("authenticat") => {
                        KvError::Unauthenticated { reason }
                    }
                    _ => KvError::Refused { reason },
                }
            }
            etcd_client::Error::TransportError(_) => KvError::Unreachable {
                kind: "transport".into(),
                detail,
            },
            etcd_client::Error::IoError(_) => KvError::Unreachable {
                kind: "io".into(),
                detail,
            },
            _ => KvError::Refused { reason: detail },
        }
    }

    async fn client(&self) -> Result<Client, KvError> {
        let mut slot = self.client.lock().await;
        if let Some(client) = &*slot {
            return Ok(client.clone());
        }
        debug!(
            endpoints = self.endpoints.len(),
            tls = self.tls,
            username = self.username.as_deref(),
            "connecting to etcd"
        );
        let client = Client::connect(&self.endpoints, Some(self.connect.clone()))
            .await
            .map_err(|e| self.classify(e))?;
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Forgets the connection after a failure that a fresh one may not have (etcd back,
    /// a certificate or password replaced), so the next call dials afresh.
    async fn reset(&self, err: &KvError) {
        if matches!(
            err,
            KvError::Unreachable { .. } | KvError::Tls { .. } | KvError::Unauthenticated { .. }
        ) {
            *self.client.lock().await = None;
        }
    }

    /// Runs `op` on the KV client, connecting first if need be.
    async fn call<T, F, Fut>(&self, op: F) -> Result<T, KvError>
    where
        F: FnOnce(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let result = match self.client().await {
            Ok(client) => op(client.kv_client()).await.map_err(|e| self.classify(e)),
            Err(err) => Err(err),
        };
        match &result {
            Ok(_) => {
                *self
                    .last_tls_failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = None;
            }
            Err(err) => self.reset(err).await,
        }
        result
    }

    /// Runs `txn` (for the ownership records kept beside the routes).
    pub(crate) async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, KvError> {
        self.call(|mut kv| async move { kv.txn(txn).await }).await
    }

    /// Every key in `[start, end)` (just `start` when `end` is `None`) at `revision` (0:
    /// the latest), page by page at one revision. Returns that revision and the keys with
    /// their values (empty when `keys_only`).
    async fn range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        revision: i64,
        keys_only: bool,
    ) -> Result<(i64, Vec<(Vec<u8>, Vec<u8>)>), KvError> {
        let mut revision = revision;
        let mut from = start.to_vec();
        let mut all = Vec::new();
        loop {
            let mut options = GetOptions::new().with_revision(revision);
            if let Some(end) = end {
                options = options.with_range(end).with_limit(PAGE);
            }
            if keys_only {
                options = options.with_keys_only();
            }
            let key = from.clone();
            let mut response = self
                .call(|mut kv| async move { kv.get(key, Some(options)).await })
                .await?;
            if revision == 0 {
                revision = response.header().map_or(0, |h| h.revision());
            }
            let more = response.more();
            let kvs = response.take_kvs();
            let Some(last) = kvs.last() else { break };
            from = last.key().to_vec();
            from.push(0);
            all.extend(kvs.into_iter().map(|kv| kv.into_key_value()));
            if !more || end.is_none() {
                break;
            }
        }
        Ok((revision, all))
    }

    /// Makes the keys of the route named `name` exactly `route`'s (none when `route` is
    /// `None`) in one transaction, and makes sure the placeholder key exists. Writes nothing
    /// when etcd already agrees.
    ///
    /// # Errors
    ///
    /// [`KvError`]: etcd unreachable or refusing, or the keys changing under us repeatedly.
    pub async fn sync(&self, name: &str, route: Option<&Route>) -> Result<Changes, KvError> {
        let prefixes = [
            format!("{}/http/routers/{name}/", self.root),
            format!("{}/http/services/{name}/", self.root),
        ];
        let placeholder = format!("{}/{PLACEHOLDER_KEY}", self.root);
        let desired: BTreeMap<Vec<u8>, Vec<u8>> = route
            .map(|r| r.keys(&self.root))
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k.into_bytes(), v.into_bytes()))
            .collect();
        for _ in 0..ATTEMPTS {
            let mut revision = 0;
            let mut existing = Vec::new();
            for prefix in &prefixes {
                let (at, keys) = self
                    .range(
                        prefix.as_bytes(),
                        Some(&prefix_end(prefix.as_bytes())),
                        revision,
                        false,
                    )
                    .await?;
                revision = at;
                existing.push(keys.into_iter().collect::<BTreeMap<_, _>>());
            }
            let (_, found) = self
                .range(placeholder.as_bytes(), None, revision, true)
                .await?;
            let has_placeholder = !found.is_empty();

            let mut ops = Vec::new();
            let mut changes = Changes::default();
            for (key, value) in &desired {
                if existing.iter().all(|keys| keys.get(key) != Some(value)) {
                    ops.push(TxnOp::put(key.clone(), value.clone(), None));
                    changes.put += 1;
                }
            }
            for (prefix, keys) in prefixes.iter().zip(&existing) {
                let keep: BTreeSet<Vec<u8>> = desired
                    .keys()
                    .filter(|k| k.starts_with(prefix.as_bytes()))
                    .cloned()
                    .collect();
                let present: BTreeSet<Vec<u8>> = keys.keys().cloned().collect();
                changes.deleted += present.difference(&keep).count();
                for (start, end) in stale_ranges(&present, &keep) {
                    ops.push(TxnOp::delete(
                        start,
                        Some(DeleteOptions::new().with_range(end)),
                    ));
                }
            }
            if !has_placeholder {
                ops.push(TxnOp::put(placeholder.as_str(), "unused", None));
            }
            if ops.is_empty() {
                debug!(route = name, "etcd already up to date");
                return Ok(changes);
            }
            if ops.len() > self.max_txn_ops as usize {
                return Err(KvError::TooManyOps {
                    name: name.to_owned(),
                    ops: ops.len(),
                    max: self.max_txn_ops,
                });
            }
            let guard: Vec<Compare> = prefixes
                .iter()
                .map(|p| {
                    Compare::mod_revision(p.as_str(), CompareOp::Less, revision + 1).with_prefix()
                })
                .collect();
            let txn = Txn::new().when(guard).and_then(ops);
            let write = self.call(|mut kv| async move { kv.txn(txn).await }).await?;
            if write.succeeded() {
                info!(
                    route = name,
                    put = changes.put,
                    deleted = changes.deleted,
                    "etcd updated"
                );
                return Ok(changes);
            }
            debug!(
                route = name,
                "route keys changed since they were read; retrying"
            );
        }
        Err(KvError::Contended {
            name: name.to_owned(),
        })
    }

    /// Writes the placeholder key unless it exists. [`sync`](Self::sync) does too; calling
    /// this at start-up keeps Traefik's watch from backing off before the first route.
    ///
    /// # Errors
    ///
    /// [`KvError`] when etcd is unreachable or refuses.
    pub async fn ensure_placeholder(&self) -> Result<(), KvError> {
        let key = format!("{}/{PLACEHOLDER_KEY}", self.root);
        let txn = Txn::new()
            .when(vec![Compare::version(key.as_str(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(key.as_str(), "unused", None)]);
        self.call(|mut kv| async move { kv.txn(txn).await })
            .await
            .map(|_| ())
    }

    /// [`ensure_placeholder`](Self::ensure_placeholder) as a start-up task: an etcd not
    /// reachable yet is logged, not fatal (every sync writes the placeholder too).
    ///
    /// # Errors
    ///
    /// Never.
    pub async fn write_placeholder_at_start(
        self: std::sync::Arc<Self>,
    ) -> Result<(), std::convert::Infallible> {
        if let Err(err) = self.ensure_placeholder().await {
            tracing::warn!(error = %err, detail = %err.detail(), "etcd not reachable at start; syncs will retry");
        }
        Ok(())
    }

    /// Every key and value under the root, for diagnostics and tests.
    ///
    /// # Errors
    ///
    /// [`KvError`] when etcd is unreachable or refuses.
    pub async fn dump(&self) -> Result<BTreeMap<String, String>, KvError> {
        let start = format!("{}/", self.root);
        let (_, keys) = self
            .range(
                start.as_bytes(),
                Some(&prefix_end(start.as_bytes())),
                0,
                false,
            )
            .await?;
        Ok(keys
            .into_iter()
            .map(|(k, v)| {
                (
                    String::from_utf8_lossy(&k).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    use crate::etcd::Password;

    fn keys(list: &[&str]) -> BTreeSet<Vec<u8>> {
        list.iter().map(|k| k.as_bytes().to_vec()).collect()
    }

    fn in_range(key: &[u8], (start, end): &(Vec<u8>, Vec<u8>)) -> bool {
        key >= start.as_slice() && key < end.as_slice()
    }

    #[test]
    fn stale_keys_become_few_ranges_that_spare_the_kept_keys() {
        let p = "t/http/routers/n/";
        let keep = keys(&[
            &format!("{p}entrypoints/0"),
            &format!("{p}rule"),
            &format!("{p}service"),
        ]);
        let mut existing: BTreeSet<Vec<u8>> = (1..=300)
            .map(|i| format!("{p}entrypoints/{i}").into_bytes())
            .collect();
        existing.extend(keys(&[
            &format!("{p}entrypoints/0"),
            &format!("{p}middlewares/0"),
            &format!("{p}rule"),
            &format!("{p}tls/certresolver"),
            &format!("{p}zzz"),
        ]));
        let ranges = stale_ranges(&existing, &keep);
        assert!(ranges.len() <= keep.len() + 1, "{ranges:?}");
        for key in &existing {
            let covered = ranges.iter().any(|r| in_range(key, r));
            assert_eq!(
                covered,
                !keep.contains(key),
                "{}",
                String::from_utf8_lossy(key)
            );
        }
        for key in &keep {
            assert!(!ranges.iter().any(|r| in_range(key, r)));
        }
        // Nothing stale: nothing to delete; nothing kept: one range.
        assert!(stale_ranges(&keep, &keep).is_empty());
        assert_eq!(stale_ranges(&existing, &BTreeSet::new()).len(), 1);
    }

    #[test]
    fn prefix_ends_cover_exactly_the_prefix() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), [0]);
    }

    #[test]
    fn the_password_is_never_debug_printed() {
        let mut options = EtcdOptions::plaintext(vec!["127.0.0.1:2379".into()], "traefik");
        options.username = Some("operator".into());
        options.password = Some(Password::new("s3cret-pw"));
        let printed = format!("{options:?}");
        assert!(!printed.contains("s3cret-pw"), "{printed}");
        assert!(printed.contains("operator"), "{printed}");
        let kv = TraefikKv::connect_with(&options).unwrap();
        let printed = format!("{kv:?}");
        assert!(
            !printed.contains("s3cret-pw") && !printed.contains("127.0.0.1"),
            "{printed}"
        );
    }

    fn temp_file(name: &str, contents: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        path
    }

    #[test]
    fn unusable_tls_and_auth_settings_are_clear_errors() {
        let base = || EtcdOptions::plaintext(vec!["10.9.8.7:2379".into()], "traefik");
        let error = |options: &EtcdOptions| TraefikKv::connect_with(options).unwrap_err();

        let mut missing = base();
        missing.ca_file = Some("/nonexistent/etcd-ca.crt".into());
        let err = error(&missing);
        assert!(matches!(err, EtcdConfigError::Read { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("cannot read the etcd CA file /nonexistent/etcd-ca.crt"),
            "{err}"
        );

        let garbage = temp_file("garbage.pem", "not a certificate\n");
        let mut bad_pem = base();
        bad_pem.ca_file = Some(garbage.clone());
        let err = error(&bad_pem);
        assert!(matches!(err, EtcdConfigError::Pem { .. }), "{err}");
        assert!(
            err.to_string().contains("holds no valid PEM certificate"),
            "{err}"
        );

        let truncated = temp_file(
            "truncated.pem",
            "-----BEGIN CERTIFICATE-----\nMIIB!!!not base64\n",
        );
        bad_pem.ca_file = Some(truncated.clone());
        assert!(matches!(error(&bad_pem), EtcdConfigError::Pem { .. }));

        let mut half = base();
        half.cert_file = Some(garbage.clone());
        assert_eq!(
            error(&half).to_string(),
            "--etcd-cert-file needs --etcd-key-file"
        );

        let mut no_ca = base();
        no_ca.endpoints = vec!["https://10.9.8.7:2379".into()];
        assert!(matches!(error(&no_ca), EtcdConfigError::TlsWithoutCa));

        let mut plain = base();
        plain.endpoints = vec!["127.0.0.1:2379".into(), "http://10.9.8.7:2379".into()];
        plain.ca_file = Some(garbage.clone());
        let err = error(&plain);
        assert!(
            matches!(err, EtcdConfigError::PlainEndpointWithTls { index: 1 }),
            "{err}"
        );
        assert!(!err.to_string().contains("10.9.8.7"), "{err}");

        let mut user_only = base();
        user_only.username = Some("operator".into());
        assert_eq!(
            error(&user_only).to_string(),
            "--etcd-username needs --etcd-password"
        );

        let mut no_endpoints = base();
        no_endpoints.endpoints.clear();
        assert!(matches!(error(&no_endpoints), EtcdConfigError::NoEndpoints));

        let mut tiny = base();
        tiny.max_txn_ops = 3;
        assert!(matches!(
            error(&tiny),
            EtcdConfigError::MaxTxnOps { value: 3 }
        ));

        for path in [garbage, truncated] {
            let _ = std::fs::remove_file(path);
        }
    }

    #[test]
    fn messages_redact_endpoint_addresses() {
        let kv = TraefikKv::new(
            vec!["https://10.9.8.7:2379".into(), "etcd-1.example:2379".into()],
            "traefik",
        );
        let text = kv.redact(
            "dial 10.9.8.7:2379 failed; etcd-1.example:2379 too; certificate not valid for \
             name \"10.9.8.7\"; etcdserver: too many requests",
        );
        assert!(
            !text.contains("10.9.8.7") && !text.contains("etcd-1.example"),
            "{text}"
        );
        assert!(text.contains("etcd endpoint #0") && text.contains("etcd endpoint #1"));
        assert!(text.contains("etcdserver: too many requests"), "{text}");
    }

    /// A real failed connection: neither the message (for statuses) nor the detail (for
    /// logs) names the address.
    #[tokio::test]
    async fn an_unreachable_etcd_is_reported_without_its_address() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = closed.local_addr().unwrap().to_string();
        drop(closed);
        let kv = TraefikKv::new(vec![endpoint.clone()], "traefik");
        let err = kv.dump().await.unwrap_err();
        assert!(matches!(err, KvError::Unreachable { .. }), "{err:?}");
        let port = endpoint.rsplit(':').next().unwrap();
        for text in [err.to_string(), err.detail(), format!("{err:?}")] {
            assert!(!text.contains(&endpoint) && !text.contains(port), "{text}");
        }
        assert!(err.to_string().starts_with("etcd is unreachable"), "{err}");
    }
}
