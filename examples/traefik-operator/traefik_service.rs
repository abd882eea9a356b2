//! The `TraefikService` controller: each object becomes one Traefik route in etcd.
//!
//! The sync function follows the tutorial's `Reconcile`, made level-based and idempotent:
//!
//! 1. An object missing from the cache is gone: its keys are removed (normally the
//!    finalizer already did that), unless another operator instance owns the route.
//! 2. An object being deleted: its keys are removed, then the finalizer ([`FINALIZER`]).
//! 3. Otherwise the finalizer is added if missing, the spec checked against the
//!    [policy](super::policy) and turned into a [`Route`], its ownership and hosts claimed
//!    ([`Ownership::write`]), and its keys written with
//!    [`TraefikKv::sync`](super::kv::TraefikKv::sync), which writes only what differs
//!    (instead of the tutorial's "skip when already active", so keys changed behind our
//!    back are repaired).
//! 4. The status says whether the route is active, since when, and if not, why. It is
//!    patched only when it changes, so a status write never causes a sync loop.
//!
//! An etcd failure is reported in the status and returned as an error: the controller
//! retries the key with the rate-limited queue, forever, until etcd is back.

use std::{collections::BTreeSet, sync::Arc};

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use kube_informer::{
    Action, ClientError, ControllerClient, FinalizerError, FinalizerEvent, ObjectKey,
    ReconcileRequest, Store,
    apply::Conflicts,
    conditions::{ConditionStatus, NewCondition, set_condition},
    events::{Event, Recorder},
    finalizer,
};
use tracing::{debug, info, warn};

use super::{
    crd::{FINALIZER, TraefikService, TraefikServiceStatus},
    kv::{Changes, KvError, Route},
    ownership::{ClaimError, Ownership},
    policy::{Policy, PolicyError, redact_url},
};

/// The prefix of the Traefik names of `TraefikService` routes.
pub const ROUTE_PREFIX: &str = "tsvc_";

/// The Traefik router and service name of the `TraefikService` `namespace/name`:
/// `tsvc_<namespace>_<name>` (Kubernetes names never contain `_`, so it parses back).
pub fn route_name(namespace: &str, name: &str) -> String {
    format!("{ROUTE_PREFIX}{namespace}_{name}")
}

/// The object key a route name of this controller came from.
pub fn key_of_route(route: &str) -> Option<ObjectKey> {
    let (namespace, name) = route.strip_prefix(ROUTE_PREFIX)?.split_once('_')?;
    Some(ObjectKey::new(Some(namespace), name))
}

/// Why a spec cannot be routed. Shown in the status; not retried (a new spec is).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// `spec.url` is not an absolute http(s) URL with a host.
    #[error("spec.url {url:?} is not an absolute http or https URL: {reason}")]
    BadUrl {
        /// The URL as given, without its query (which may hold secrets).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `spec.entrypoint` is empty or holds a character Traefik keys cannot.
    #[error("spec.entrypoint {0:?} must be a non-empty name without '/' or '@'")]
    BadEntrypoint(String),
    /// `spec.rule` is empty.
    #[error("spec.rule must not be empty (leave it out for the default)")]
    EmptyRule,
    /// The operator's policy refuses the route.
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// Checks that `url` is an absolute `http`/`https` URL with a host, to an address `policy`
/// allows.
///
/// # Errors
///
/// [`SpecError::BadUrl`] saying what is wrong, [`SpecError::Policy`] for a denied address.
pub fn check_url(url: &str, policy: &Policy) -> Result<(), SpecError> {
    let bad = |reason: &str| SpecError::BadUrl {
        url: redact_url(url),
        reason: reason.to_owned(),
    };
    let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad(&format!(
            "scheme {:?} is neither http nor https",
            parsed.scheme()
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("it has no host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad("credentials in the URL are not supported"));
    }
    policy.check_backend(&parsed)?;
    Ok(())
}

/// Checks an entrypoint name, and that `policy` allows it.
///
/// # Errors
///
/// [`SpecError::BadEntrypoint`], [`SpecError::Policy`].
pub fn check_entrypoint(entrypoint: &str, policy: &Policy) -> Result<(), SpecError> {
    if entrypoint.is_empty() || entrypoint.contains(['/', '@']) || entrypoint.trim() != entrypoint {
        return Err(SpecError::BadEntrypoint(entrypoint.to_owned()));
    }
    policy.check_entrypoint(entrypoint)?;
    Ok(())
}

/// A route the policy allows, and the hosts its rule can match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// The route to write.
    pub route: Route,
    /// The hosts it claims.
    pub hosts: BTreeSet<String>,
}

/// The route an object asks for (the rule defaulting to ``Host(`<name>.<namespace>`)``,
/// with `.<domain>` when the policy has one).
///
/// # Errors
///
/// [`SpecError`] when the spec cannot be routed or the policy refuses it.
pub fn desired_route(obj: &TraefikService, policy: &Policy) -> Result<Desired, SpecError> {
    let namespace = obj.metadata.namespace.as_deref().unwrap_or_default();
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    check_entrypoint(&obj.spec.entrypoint, policy)?;
    check_url(&obj.spec.url, policy)?;
    if obj.spec.rule.as_ref().is_some_and(|r| r.trim().is_empty()) {
        return Err(SpecError::EmptyRule);
    }
    let allowed = policy.check_rule(namespace, name, obj.spec.rule.as_deref())?;
    Ok(Desired {
        route: Route {
            name: route_name(namespace, name),
            entrypoint: obj.spec.entrypoint.clone(),
            rule: allowed.rule,
            url: obj.spec.url.clone(),
        },
        hosts: allowed.hosts,
    })
}

/// Why a sync failed; the controller retries it.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// etcd could not be updated.
    #[error(transparent)]
    Etcd(#[from] KvError),
    /// A host of the rule is held by another namespace (retried until it is free).
    #[error(transparent)]
    Refused(ClaimError),
    /// The finalizer's name is unusable (a bug: it is a constant).
    #[error("{0}")]
    Finalizer(String),
    /// The API server refused a write (e.g. missing RBAC permissions) or was unreachable.
    #[error("{action}: {source}")]
    Kube {
        /// What was attempted.
        action: String,
        /// The client's error.
        source: ClientError,
    },
    /// The status could not be applied.
    #[error("applying the status of TraefikService {name}: {source}")]
    Status {
        /// The object's name.
        name: String,
        /// Why.
        source: ClientError,
    },
}

/// What the `TraefikService` sync function needs.
#[derive(Clone)]
pub struct Reconciler {
    /// The controller's client: the finalizer and the status are its own writes, which
    /// the next reconcile of the object waits for.
    pub client: ControllerClient,
    /// The routes in the etcd Traefik reads, and who owns them.
    pub routes: Arc<Ownership>,
    /// The controller's cache.
    pub store: Store<TraefikService>,
    /// What may be routed.
    pub policy: Arc<Policy>,
    /// Where the Events users see on their TraefikServices go.
    pub events: Recorder,
}

/// The `reportingController` of the operator's Events.
pub const REPORTING_CONTROLLER: &str = "traefik.kube-informer.dev/traefik-operator";

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("routes", &self.routes)
            .finish_non_exhaustive()
    }
}

impl Reconciler {
    /// Syncs the object `key` (see the [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`SyncError`]: etcd or the API server failed; the controller retries.
    pub async fn sync(&self, key: ObjectKey) -> Result<(), SyncError> {
        let namespace = key.namespace().unwrap_or_default().to_owned();
        let name = key.name().to_owned();
        let route = route_name(&namespace, &name);
        let Some(obj) = self.store.get_by_key(&key) else {
            let changes = self.routes.remove(&route).await?;
            if !changes.is_empty() {
                info!(%key, "TraefikService gone; removed its leftover route");
            }
            return Ok(());
        };
        let outcome = finalizer(&self.client, FINALIZER, obj, |event| async {
            match event {
                FinalizerEvent::Apply(obj) => self.apply(&key, &namespace, &obj).await,
                FinalizerEvent::Cleanup(obj) => {
                    self.routes.remove(&route).await?;
                    info!(%key, route, "TraefikService deleted; route removed");
                    self.events.publish_for(
                        Event::normal("Unregistered", "Unregister")
                            .note(format!("route {route} removed from etcd")),
                        &*obj,
                    );
                    Ok(Action::done())
                }
            }
        })
        .await;
        outcome.map(drop).map_err(|error| match error {
            FinalizerError::Apply(error) | FinalizerError::Cleanup(error) => error,
            FinalizerError::Add { source, .. } | FinalizerError::Remove { source, .. } => {
                SyncError::Kube {
                    action: format!("updating the finalizers of TraefikService {key}"),
                    source,
                }
            }
            invalid @ FinalizerError::InvalidName(_) => SyncError::Finalizer(invalid.to_string()),
        })
    }

    /// Routes a live object (holding the finalizer) and reports the outcome in its status.
    async fn apply(
        &self,
        key: &ObjectKey,
        namespace: &str,
        obj: &TraefikService,
    ) -> Result<Action, SyncError> {
        let route = route_name(namespace, key.name());
        let (result, status) = match desired_route(obj, &self.policy) {
            Ok(Desired {
                route: desired,
                hosts,
            }) => {
                info!(%key, url = %redact_url(&desired.url), entrypoint = %desired.entrypoint, rule = %desired.rule, "syncing TraefikService");
                match self.routes.write(&desired, namespace, &hosts).await {
                    Ok(changes) => {
                        if !changes.is_empty() {
                            self.events.publish_for(
                                Event::normal("Registered", "Register").note(format!(
                                    "route {route} written to etcd for {}",
                                    redact_url(&desired.url)
                                )),
                                obj,
                            );
                        }
                        (Ok(changes), status(true, ""))
                    }
                    Err(ClaimError::Etcd(err)) => {
                        warn!(%key, error = %err, detail = %err.detail(), "etcd update failed");
                        // One note per kind of failure, so retries add to one series.
                        self.events.publish_for(
                            Event::warning("EtcdUnavailable", "Register")
                                .note("cannot write the route to etcd; retrying"),
                            obj,
                        );
                        let message = err.to_string();
                        (Err(SyncError::Etcd(err)), status(false, &message))
                    }
                    Err(ClaimError::Contended(route)) => {
                        let error = KvError::Contended { name: route };
                        let message = error.to_string();
                        (Err(SyncError::Etcd(error)), status(false, &message))
                    }
                    // Retried with backoff: the route waits for the host to be free.
                    Err(taken @ ClaimError::HostTaken { .. }) => {
                        let message = taken.to_string();
                        self.events.publish_for(
                            Event::warning("HostTaken", "Register").note(message.clone()),
                            obj,
                        );
                        (Err(SyncError::Refused(taken)), status(false, &message))
                    }
                    Err(refused) => {
                        warn!(%key, reason = %refused, "TraefikService refused");
                        self.events.publish_for(
                            Event::warning("Refused", "Register").note(refused.to_string()),
                            obj,
                        );
                        (Ok(Changes::default()), status(false, &refused.to_string()))
                    }
                }
            }
            Err(spec_error) => {
                warn!(%key, error = %spec_error, "TraefikService cannot be routed");
                self.events.publish_for(
                    Event::warning("InvalidSpec", "Register").note(spec_error.to_string()),
                    obj,
                );
                let removed = self.routes.remove(&route).await;
                match removed {
                    Ok(changes) => (Ok(changes), status(false, &spec_error.to_string())),
                    Err(err) => {
                        let message = format!("{spec_error}; also {err}");
                        (Err(SyncError::Etcd(err)), status(false, &message))
                    }
                }
            }
        };
        let changed_etcd = result.as_ref().is_ok_and(|c| !c.is_empty());
        self.update_status(obj, status, changed_etcd).await?;
        result.map(|_| Action::done())
    }

    async fn update_status(
        &self,
        obj: &TraefikService,
        mut new: TraefikServiceStatus,
        changed_etcd: bool,
    ) -> Result<(), SyncError> {
        let name = obj.metadata.name.as_deref().unwrap_or_default();
        new.observed_generation = obj.metadata.generation;
        let old = obj.status.clone().unwrap_or_default();
        new.conditions = old.conditions.clone();
        let ready = if new.active {
            NewCondition::new("Ready", ConditionStatus::True, "Routed", "route in etcd")
        } else {
            NewCondition::new("Ready", ConditionStatus::False, "NotRouted", &new.message)
        };
        let conditions_changed = set_condition(&mut new.conditions, ready.observed_from(obj));
        let same = old.active == new.active
            && old.message == new.message
            && old.observed_generation == new.observed_generation
            && old.last_update_time.is_some()
            && !conditions_changed;
        if same && !changed_etcd {
            return Ok(());
        }
        new.last_update_time = Some(Time(Timestamp::now()));
        let desired = TraefikService {
            metadata: ObjectMeta {
                name: obj.metadata.name.clone(),
                namespace: obj.metadata.namespace.clone(),
                ..ObjectMeta::default()
            },
            spec: obj.spec.clone(),
            status: Some(new),
        };
        // The operator alone writes the status: fields an older operator wrote by merge
        // patch become its applied ones.
        match self
            .client
            .apply_status(&desired, Conflicts::TakeOwnership)
            .await
        {
            Ok(written) => {
                let status = written.status.unwrap_or_default();
                debug!(name, active = status.active, message = %status.message, "status applied");
                Ok(())
            }
            Err(gone) if gone.is_not_found() => Ok(()),
            Err(source) => Err(SyncError::Status {
                name: name.to_owned(),
                source,
            }),
        }
    }
}

impl kube_informer::Reconciler<TraefikService> for Reconciler {
    type Error = SyncError;

    async fn reconcile(
        &self,
        request: ReconcileRequest<TraefikService>,
    ) -> Result<Action, SyncError> {
        self.sync(request.key()).await.map(|()| Action::done())
    }
}

fn status(active: bool, message: &str) -> TraefikServiceStatus {
    TraefikServiceStatus {
        active,
        message: message.to_owned(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_names_parse_back() {
        let route = route_name("shop", "web-1");
        assert_eq!(route, "tsvc_shop_web-1");
        assert_eq!(
            key_of_route(&route),
            Some(ObjectKey::new(Some("shop"), "web-1"))
        );
        assert_eq!(key_of_route("svc_shop_web"), None);
    }

    #[test]
    fn urls_are_checked() {
        let policy = Policy::default();
        assert!(check_url("http://127.0.0.1:8080/x", &policy).is_ok());
        assert!(check_url("https://web.shop.svc", &policy).is_ok());
        for bad in [
            "",
            "web:80",
            "ftp://host/",
            "http://",
            "/relative",
            "http://u:p@host/",
        ] {
            let err = check_url(bad, &policy).unwrap_err();
            assert!(
                err.to_string()
                    .contains("is not an absolute http or https URL"),
                "{err}"
            );
        }
    }

    #[test]
    fn the_rule_defaults_to_the_host_name() {
        let mut obj = TraefikService::new(
            "web",
            super::super::crd::TraefikServiceSpec {
                entrypoint: "web".into(),
                url: "http://127.0.0.1:1".into(),
                rule: None,
            },
        );
        obj.metadata.namespace = Some("shop".into());
        let policy = Policy::default();
        let desired = desired_route(&obj, &policy).unwrap();
        assert_eq!(desired.route.rule, "Host(`web.shop`)");
        assert_eq!(desired.hosts, ["web.shop".to_owned()].into());
        obj.spec.rule = Some("PathPrefix(`/`)".into());
        assert!(matches!(
            desired_route(&obj, &policy),
            Err(SpecError::Policy(PolicyError::Unbounded { .. }))
        ));
        obj.spec.entrypoint = "a/b".into();
        assert_eq!(
            desired_route(&obj, &policy),
            Err(SpecError::BadEntrypoint("a/b".into()))
        );
    }
}
