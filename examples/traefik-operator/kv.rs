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
//! [`TraefikKv::sync`] reads every key under `routers/n/` and `services/n/`, then in one
//! transaction puts the keys that differ and deletes, one by one, those the route no
//! longer has (etcd refuses a transaction that deletes a prefix and puts a key under it).
//! The transaction only commits if nothing under those prefixes changed since the read.
//!
//! It also keeps one unused middleware key ([`PLACEHOLDER_KEY`]) under the root: Traefik's
//! etcd watch fails and backs off while nothing is under the root, and with only non-route
//! keys left it would keep serving the last deleted route (traefik#8092).

use std::{collections::BTreeMap, fmt, time::Duration};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp, TxnOpResponse,
};
use tokio::sync::Mutex;
use tracing::{debug, info};

/// The unused middleware key that keeps Traefik's watch alive (relative to the root).
pub const PLACEHOLDER_KEY: &str = "http/middlewares/traefik-operator-placeholder/headers/customResponseHeaders/X-Traefik-Operator";

/// How often [`TraefikKv::sync`] retries a transaction that lost a race before giving up.
const ATTEMPTS: usize = 5;

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

/// Why talking to etcd failed. The messages are stable (no addresses of the moment, no
/// timings), because they end up in object statuses.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// No answer: etcd is down, unreachable, or too slow.
    #[error("etcd at {endpoints} is unreachable ({kind}); retrying")]
    Unreachable {
        /// The configured endpoints.
        endpoints: String,
        /// The kind of failure, e.g. `Unavailable`, `DeadlineExceeded`, `transport`.
        kind: String,
        /// The client's full error, for logs.
        detail: String,
    },
    /// etcd answered with an error.
    #[error("etcd at {endpoints} refused the request: {reason}")]
    Refused {
        /// The configured endpoints.
        endpoints: String,
        /// etcd's message.
        reason: String,
    },
    /// Someone else kept changing the route's keys between read and write.
    #[error("the keys of route {name} kept changing during the update ({ATTEMPTS} attempts)")]
    Contended {
        /// The route.
        name: String,
    },
}

impl KvError {
    /// The client's full error text, for logs.
    pub fn detail(&self) -> String {
        match self {
            KvError::Unreachable { detail, .. } => detail.clone(),
            other => other.to_string(),
        }
    }
}

/// A connection to the etcd that Traefik's KV provider reads. Cheap to share behind an
/// `Arc`; connects lazily and reconnects after failures.
pub struct TraefikKv {
    endpoints: Vec<String>,
    root: String,
    client: Mutex<Option<Client>>,
}

impl fmt::Debug for TraefikKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraefikKv")
            .field("endpoints", &self.endpoints)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl TraefikKv {
    /// A writer for Traefik's provider at `endpoints` (`host:port` or URLs) under `root`
    /// (Traefik's `--providers.etcd.rootkey`, by default `traefik`). Nothing is contacted yet.
    pub fn new(endpoints: Vec<String>, root: impl Into<String>) -> Self {
        Self {
            endpoints,
            root: root.into().trim_end_matches('/').to_owned(),
            client: Mutex::new(None),
        }
    }

    /// The root key.
    pub fn root(&self) -> &str {
        &self.root
    }

    fn unreachable(&self, kind: impl Into<String>, detail: String) -> KvError {
        KvError::Unreachable {
            endpoints: self.endpoints.join(","),
            kind: kind.into(),
            detail,
        }
    }

    fn classify(&self, err: etcd_client::Error) -> KvError {
        match err {
            etcd_client::Error::GRpcStatus(status) => {
                // tonic's `Code`, by name: etcd-client does not re-export the type.
                let code = format!("{:?}", status.code());
                match code.as_str() {
                    "Unavailable" | "DeadlineExceeded" | "Unknown" | "Cancelled" => {
                        self.unreachable(code, status.to_string())
                    }
                    _ => KvError::Refused {
                        endpoints: self.endpoints.join(","),
                        reason: status.message().to_owned(),
                    },
                }
            }
            etcd_client::Error::TransportError(e) => self.unreachable("transport", e.to_string()),
            etcd_client::Error::IoError(e) => self.unreachable("io", e.to_string()),
            other => KvError::Refused {
                endpoints: self.endpoints.join(","),
                reason: other.to_string(),
            },
        }
    }

    async fn client(&self) -> Result<Client, KvError> {
        let mut slot = self.client.lock().await;
        if let Some(client) = &*slot {
            return Ok(client.clone());
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5));
        let client = Client::connect(&self.endpoints, Some(options))
            .await
            .map_err(|e| self.classify(e))?;
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Forgets the connection after an unreachable etcd, so the next call dials afresh.
    async fn reset(&self, err: &KvError) {
        if matches!(err, KvError::Unreachable { .. }) {
            *self.client.lock().await = None;
        }
    }

    /// Runs `txn`, dialling again after an unreachable etcd.
    pub(crate) async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, KvError> {
        let result = match self.client().await {
            Ok(client) => client
                .kv_client()
                .txn(txn)
                .await
                .map_err(|e| self.classify(e)),
            Err(err) => Err(err),
        };
        if let Err(err) = &result {
            self.reset(err).await;
        }
        result
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
        let desired = route.map(|r| r.keys(&self.root)).unwrap_or_default();
        for _ in 0..ATTEMPTS {
            let read = Txn::new().and_then(vec![
                TxnOp::get(prefixes[0].as_str(), Some(GetOptions::new().with_prefix())),
                TxnOp::get(prefixes[1].as_str(), Some(GetOptions::new().with_prefix())),
                TxnOp::get(
                    placeholder.as_str(),
                    Some(GetOptions::new().with_keys_only()),
                ),
            ]);
            let response = self.txn(read).await?;
            let revision = response.header().map_or(0, |h| h.revision());
            let mut existing = BTreeMap::new();
            let mut has_placeholder = false;
            for (i, op) in response.op_responses().into_iter().enumerate() {
                if let TxnOpResponse::Get(get) = op {
                    for kv in get.kvs() {
                        if i == 2 {
                            has_placeholder = true;
                        } else {
                            existing.insert(
                                String::from_utf8_lossy(kv.key()).into_owned(),
                                String::from_utf8_lossy(kv.value()).into_owned(),
                            );
                        }
                    }
                }
            }

            let mut ops = Vec::new();
            let mut changes = Changes::default();
            for (key, value) in &desired {
                if existing.get(key) != Some(value) {
                    ops.push(TxnOp::put(key.as_str(), value.as_str(), None));
                    changes.put += 1;
                }
            }
            for key in existing.keys().filter(|k| !desired.contains_key(*k)) {
                ops.push(TxnOp::delete(key.as_str(), None));
                changes.deleted += 1;
            }
            if !has_placeholder {
                ops.push(TxnOp::put(placeholder.as_str(), "unused", None));
            }
            if ops.is_empty() {
                debug!(route = name, "etcd already up to date");
                return Ok(changes);
            }
            let guard: Vec<Compare> = prefixes
                .iter()
                .map(|p| {
                    Compare::mod_revision(p.as_str(), CompareOp::Less, revision + 1).with_prefix()
                })
                .collect();
            let write = self.txn(Txn::new().when(guard).and_then(ops)).await?;
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
        self.txn(txn).await.map(|_| ())
    }

    /// The names of the routers under the root whose names start with `prefix`, for
    /// finding routes whose objects are gone.
    ///
    /// # Errors
    ///
    /// [`KvError`] when etcd is unreachable or refuses.
    pub async fn route_names(&self, prefix: &str) -> Result<Vec<String>, KvError> {
        let mut names = Vec::new();
        for kind in ["routers", "services"] {
            let dir = format!("{}/http/{kind}/", self.root);
            let read = Txn::new().and_then(vec![TxnOp::get(
                format!("{dir}{prefix}"),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )]);
            for op in self.txn(read).await?.op_responses() {
                if let TxnOpResponse::Get(get) = op {
                    for kv in get.kvs() {
                        let key = String::from_utf8_lossy(kv.key());
                        if let Some(name) = key
                            .strip_prefix(&dir)
                            .and_then(|rest| rest.split('/').next())
                        {
                            names.push(name.to_owned());
                        }
                    }
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Every key and value under the root, for diagnostics and tests.
    ///
    /// # Errors
    ///
    /// [`KvError`] when etcd is unreachable or refuses.
    pub async fn dump(&self) -> Result<BTreeMap<String, String>, KvError> {
        let read = Txn::new().and_then(vec![TxnOp::get(
            format!("{}/", self.root),
            Some(GetOptions::new().with_prefix()),
        )]);
        let mut all = BTreeMap::new();
        for op in self.txn(read).await?.op_responses() {
            if let TxnOpResponse::Get(get) = op {
                for kv in get.kvs() {
                    all.insert(
                        String::from_utf8_lossy(kv.key()).into_owned(),
                        String::from_utf8_lossy(kv.value()).into_owned(),
                    );
                }
            }
        }
        Ok(all)
    }
}
