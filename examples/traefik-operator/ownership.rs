//! Who owns which route and host, recorded in etcd beside Traefik's keys, so that several
//! operators (one per namespace, or per tenant) can share one Traefik root.
//!
//! Under the owner prefix (`--etcd-owner-prefix`, outside Traefik's root, so Traefik never
//! reads it):
//!
//! | key | value |
//! |---|---|
//! | `<prefix>routes/<route>` | [`RouteOwner`] as JSON: instance, namespace, hosts |
//! | `<prefix>hosts/<host>/<route>` | the namespace the host is routed for |
//!
//! A route is written only while its record names this operator's instance (or there is
//! none yet); a host only while no other namespace holds it. Both are checked and claimed
//! in one guarded transaction, so two operators racing for a host cannot both win. The
//! sweep of leftover routes lists this instance's records in its namespace scope, never
//! the rest of the root.

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};
use tracing::debug;

use super::kv::{Changes, KvError, Route, TraefikKv};

/// How often a claim that lost a race is retried.
const ATTEMPTS: usize = 5;

/// The record of one route's owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteOwner {
    /// The operator instance (`--instance`).
    pub instance: String,
    /// The namespace of the object the route is for.
    pub namespace: String,
    /// The hosts its rule claims.
    pub hosts: BTreeSet<String>,
}

/// Why a route may not be written.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Another operator instance owns the route.
    #[error("route {route} belongs to operator instance {instance:?}; not touched")]
    OwnedElsewhere {
        /// The route.
        route: String,
        /// Its owner.
        instance: String,
    },
    /// Another namespace holds a host of the rule.
    #[error("host {host:?} is already routed for namespace {holder:?}")]
    HostTaken {
        /// The host.
        host: String,
        /// The namespace holding it.
        holder: String,
    },
    /// The records kept changing.
    #[error("the ownership records of route {0} kept changing during the claim")]
    Contended(String),
    /// etcd failed.
    #[error(transparent)]
    Etcd(#[from] KvError),
}

/// The ownership records of one operator instance.
#[derive(Debug)]
pub struct Ownership {
    kv: std::sync::Arc<TraefikKv>,
    prefix: String,
    instance: String,
}

/// A route this instance owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRoute {
    /// The route's name.
    pub route: String,
    /// Its record.
    pub owner: RouteOwner,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

impl Ownership {
    /// The records of `instance` under `prefix`.
    ///
    /// # Errors
    ///
    /// A message when `prefix` lies under Traefik's root key (Traefik would read the
    /// records as configuration and reject it) or `instance` is empty.
    pub fn new(
        kv: std::sync::Arc<TraefikKv>,
        prefix: &str,
        instance: &str,
    ) -> Result<Self, String> {
        let prefix = format!("{}/", prefix.trim_end_matches('/'));
        if prefix.starts_with(&format!("{}/", kv.root())) || prefix == "/" {
            return Err(format!(
                "--etcd-owner-prefix {prefix:?} must lie outside Traefik's root key {:?}",
                kv.root()
            ));
        }
        if instance.is_empty() {
            return Err("--instance must not be empty".into());
        }
        Ok(Self {
            kv,
            prefix,
            instance: instance.to_owned(),
        })
    }

    fn record_key(&self, route: &str) -> String {
        format!("{}routes/{route}", self.prefix)
    }

    fn host_prefix(&self, host: &str) -> String {
        format!("{}hosts/{host}/", self.prefix)
    }

    /// In one read: the record of `route` with its mod revision, the namespaces claiming
    /// each of `hosts`, and the revision read at.
    async fn read(
        &self,
        route: &str,
        hosts: &BTreeSet<String>,
    ) -> Result<(Option<(RouteOwner, i64)>, Vec<Vec<String>>, i64), KvError> {
        let mut reads = vec![TxnOp::get(self.record_key(route), None)];
        reads.extend(
            hosts
                .iter()
                .map(|h| TxnOp::get(self.host_prefix(h), Some(GetOptions::new().with_prefix()))),
        );
        let response = self.kv.txn(Txn::new().and_then(reads)).await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let mut gets = response.op_responses().into_iter().map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().to_vec(),
            _ => Vec::new(),
        });
        // A record that does not parse is nobody's: it is claimed anew.
        let record = gets.next().unwrap_or_default().first().and_then(|kv| {
            serde_json::from_slice::<RouteOwner>(kv.value())
                .ok()
                .map(|owner| (owner, kv.mod_revision()))
        });
        let claims = gets
            .map(|kvs| kvs.iter().map(|kv| text(kv.value())).collect())
            .collect();
        Ok((record, claims, revision))
    }

    fn owned_elsewhere(&self, route: &str, owner: &RouteOwner) -> Option<ClaimError> {
        (owner.instance != self.instance).then(|| ClaimError::OwnedElsewhere {
            route: route.to_owned(),
            instance: owner.instance.clone(),
        })
    }

    /// Records `route` as this instance's, for `namespace`, holding `hosts`: refused when
    /// another instance owns the route or another namespace holds one of the hosts; hosts
    /// the route held before and no longer claims are released.
    ///
    /// # Errors
    ///
    /// [`ClaimError`].
    pub async fn claim(
        &self,
        route: &str,
        namespace: &str,
        hosts: &BTreeSet<String>,
    ) -> Result<(), ClaimError> {
        let record_key = self.record_key(route);
        let wanted = RouteOwner {
            instance: self.instance.clone(),
            namespace: namespace.to_owned(),
            hosts: hosts.clone(),
        };
        for _ in 0..ATTEMPTS {
            let (record, claims, revision) = self.read(route, hosts).await?;
            if let Some(refused) = record
                .as_ref()
                .and_then(|(o, _)| self.owned_elsewhere(route, o))
            {
                return Err(refused);
            }
            let held = record
                .as_ref()
                .map(|(owner, _)| owner.hosts.clone())
                .unwrap_or_default();
            for (host, holders) in hosts.iter().zip(claims) {
                if let Some(holder) = holders.into_iter().find(|h| h != namespace) {
                    return Err(ClaimError::HostTaken {
                        host: host.clone(),
                        holder,
                    });
                }
            }
            if record.as_ref().is_some_and(|(owner, _)| *owner == wanted) {
                return Ok(());
            }
            let mut ops = vec![TxnOp::put(
                record_key.as_str(),
                serde_json::to_vec(&wanted).unwrap_or_default(),
                None,
            )];
            for host in hosts.difference(&held) {
                let key = format!("{}{route}", self.host_prefix(host));
                ops.push(TxnOp::put(key, namespace, None));
            }
            for host in held.difference(hosts) {
                let key = format!("{}{route}", self.host_prefix(host));
                ops.push(TxnOp::delete(key, None));
            }
            // Nothing read may have changed: the record, and every wanted host's claims.
            let mut guard = vec![match &record {
                Some((_, modified)) => {
                    Compare::mod_revision(record_key.as_str(), CompareOp::Equal, *modified)
                }
                None => Compare::version(record_key.as_str(), CompareOp::Equal, 0),
            }];
            guard.extend(hosts.iter().map(|h| {
                Compare::mod_revision(self.host_prefix(h), CompareOp::Less, revision + 1)
                    .with_prefix()
            }));
            if self
                .kv
                .txn(Txn::new().when(guard).and_then(ops))
                .await?
                .succeeded()
            {
                debug!(route, namespace, hosts = ?hosts, "route claimed");
                return Ok(());
            }
        }
        Err(ClaimError::Contended(route.to_owned()))
    }

    /// Writes `route` for `namespace` if this instance may: claims it and `hosts`, then
    /// makes its keys `route`'s. When a host is taken, the route this instance had under
    /// that name is removed (its rule no longer holds).
    ///
    /// # Errors
    ///
    /// [`ClaimError`]: refused, or etcd failed.
    pub async fn write(
        &self,
        route: &Route,
        namespace: &str,
        hosts: &BTreeSet<String>,
    ) -> Result<Changes, ClaimError> {
        match self.claim(&route.name, namespace, hosts).await {
            Ok(()) => Ok(self.kv.sync(&route.name, Some(route)).await?),
            Err(taken @ ClaimError::HostTaken { .. }) => {
                self.remove(&route.name).await?;
                Err(taken)
            }
            Err(other) => Err(other),
        }
    }

    /// Removes the keys of `route` and its record, unless another instance owns it.
    ///
    /// # Errors
    ///
    /// etcd's error.
    pub async fn remove(&self, route: &str) -> Result<Changes, KvError> {
        let (record, _, _) = self.read(route, &BTreeSet::new()).await?;
        if let Some(refused) = record
            .as_ref()
            .and_then(|(o, _)| self.owned_elsewhere(route, o))
        {
            debug!(route, reason = %refused, "not removing another instance's route");
            return Ok(Changes::default());
        }
        let changes = self.kv.sync(route, None).await?;
        // With its keys gone, the record and the host claims go too (a route from before
        // records has none).
        if let Some((owner, modified)) = record {
            let record_key = self.record_key(route);
            let mut ops = vec![TxnOp::delete(record_key.as_str(), None)];
            for host in &owner.hosts {
                ops.push(TxnOp::delete(
                    format!("{}{route}", self.host_prefix(host)),
                    None,
                ));
            }
            let guard = Compare::mod_revision(record_key.as_str(), CompareOp::Equal, modified);
            // Lost to a concurrent claim of the same route: that claim now owns it.
            self.kv
                .txn(Txn::new().when(vec![guard]).and_then(ops))
                .await?;
        }
        Ok(changes)
    }

    /// The routes this instance owns whose names start with `route_prefix`, in `namespace`
    /// (every namespace for `None`).
    ///
    /// # Errors
    ///
    /// etcd's error.
    pub async fn owned(
        &self,
        route_prefix: &str,
        namespace: Option<&str>,
    ) -> Result<Vec<OwnedRoute>, KvError> {
        let dir = format!("{}routes/", self.prefix);
        let read = TxnOp::get(
            format!("{dir}{route_prefix}"),
            Some(GetOptions::new().with_prefix()),
        );
        let response = self.kv.txn(Txn::new().and_then(vec![read])).await?;
        let mut owned = BTreeMap::new();
        for op in response.op_responses() {
            let TxnOpResponse::Get(get) = op else {
                continue;
            };
            for kv in get.kvs() {
                let Ok(owner) = serde_json::from_slice::<RouteOwner>(kv.value()) else {
                    continue;
                };
                let route = text(kv.key()).trim_start_matches(&dir).to_owned();
                if owner.instance == self.instance
                    && namespace.is_none_or(|ns| ns == owner.namespace)
                {
                    owned.insert(route.clone(), OwnedRoute { route, owner });
                }
            }
        }
        Ok(owned.into_values().collect())
    }
}
