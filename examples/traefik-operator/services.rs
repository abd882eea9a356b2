//! Service mode, the tutorial's real goal: Kubernetes Services opted in with an annotation
//! are routed by Traefik, with no CRD and no change to the service's code.
//!
//! A Service with [`ENTRYPOINT_ANNOTATION`] gets a route named `svc_<namespace>_<name>` on
//! that entrypoint, to its in-cluster URL (by default `http://<name>.<namespace>.svc:<port>`,
//! see [`UrlTemplate`]). Removing the annotation or deleting the Service removes the route.
//! Optional annotations: [`RULE_ANNOTATION`] (default ``Host(`<name>.<namespace>`)``),
//! [`PORT_ANNOTATION`] (a port name or number; default the first port) and
//! [`SCHEME_ANNOTATION`] (`http` or `https`; default `https` for port 443 or a port named
//! `https`, else `http`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube_informer::{Action, ObjectKey, ReconcileRequest, Store};
use tracing::{info, warn};

use super::{
    kv::Route,
    ownership::{ClaimError, Ownership},
    policy::{Policy, redact_url},
    traefik_service::{Desired, SpecError, check_entrypoint, check_url},
};

/// Opts a Service in; its value is the Traefik entrypoint.
pub const ENTRYPOINT_ANNOTATION: &str = "traefik.kube-informer.dev/entrypoint";
/// The router rule (optional).
pub const RULE_ANNOTATION: &str = "traefik.kube-informer.dev/rule";
/// The port, by name or number (optional).
pub const PORT_ANNOTATION: &str = "traefik.kube-informer.dev/port";
/// `http` or `https` (optional).
pub const SCHEME_ANNOTATION: &str = "traefik.kube-informer.dev/scheme";

/// The prefix of the Traefik names of Service routes.
pub const ROUTE_PREFIX: &str = "svc_";

/// The Traefik name of the Service `namespace/name`: `svc_<namespace>_<name>`.
pub fn route_name(namespace: &str, name: &str) -> String {
    format!("{ROUTE_PREFIX}{namespace}_{name}")
}

/// The object key a route name of this controller came from.
pub fn key_of_route(route: &str) -> Option<ObjectKey> {
    let (namespace, name) = route.strip_prefix(ROUTE_PREFIX)?.split_once('_')?;
    Some(ObjectKey::new(Some(namespace), name))
}

/// How a Service's URL is built: `{scheme}`, `{name}`, `{namespace}`, `{port}` and
/// `{clusterIP}` are replaced. The default, [`UrlTemplate::IN_CLUSTER`], is the DNS name
/// Pods use; an operator running outside the cluster can use e.g. `http://{clusterIP}:{port}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlTemplate(pub String);

impl UrlTemplate {
    /// `{scheme}://{name}.{namespace}.svc:{port}`.
    pub const IN_CLUSTER: &str = "{scheme}://{name}.{namespace}.svc:{port}";

    fn render(
        &self,
        scheme: &str,
        name: &str,
        namespace: &str,
        port: i32,
        cluster_ip: &str,
    ) -> String {
        self.0
            .replace("{scheme}", scheme)
            .replace("{name}", name)
            .replace("{namespace}", namespace)
            .replace("{port}", &port.to_string())
            .replace("{clusterIP}", cluster_ip)
    }
}

impl Default for UrlTemplate {
    fn default() -> Self {
        Self(Self::IN_CLUSTER.to_owned())
    }
}

/// Why an opted-in Service cannot be routed. Logged; not retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceRouteError {
    /// The Service has no ports.
    #[error("the Service has no ports")]
    NoPorts,
    /// The port annotation names no port of the Service.
    #[error("annotation {PORT_ANNOTATION}={0:?} names no port of the Service")]
    UnknownPort(String),
    /// The scheme annotation is neither `http` nor `https`.
    #[error("annotation {SCHEME_ANNOTATION}={0:?} is neither http nor https")]
    BadScheme(String),
    /// Entrypoint or URL rejected.
    #[error(transparent)]
    Spec(#[from] super::traefik_service::SpecError),
}

/// The route a Service asks for: `Ok(None)` when it is not opted in (or being deleted).
///
/// # Errors
///
/// [`ServiceRouteError`] when it is opted in but cannot be routed.
pub fn desired_route(
    svc: &Service,
    template: &UrlTemplate,
    policy: &Policy,
) -> Result<Option<Desired>, ServiceRouteError> {
    let annotations = svc.metadata.annotations.clone().unwrap_or_default();
    let Some(entrypoint) = annotations.get(ENTRYPOINT_ANNOTATION) else {
        return Ok(None);
    };
    if svc.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    check_entrypoint(entrypoint, policy)?;
    let namespace = svc.metadata.namespace.as_deref().unwrap_or_default();
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let spec = svc.spec.clone().unwrap_or_default();
    let ports = spec.ports.unwrap_or_default();
    let port = match annotations.get(PORT_ANNOTATION) {
        None => ports.first().ok_or(ServiceRouteError::NoPorts)?,
        Some(wanted) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(wanted.as_str()) || p.port.to_string() == *wanted)
            .ok_or_else(|| ServiceRouteError::UnknownPort(wanted.clone()))?,
    };
    let scheme = match annotations.get(SCHEME_ANNOTATION).map(String::as_str) {
        Some(s @ ("http" | "https")) => s,
        Some(other) => return Err(ServiceRouteError::BadScheme(other.to_owned())),
        None if port.port == 443 || port.name.as_deref() == Some("https") => "https",
        None => "http",
    };
    let cluster_ip = spec.cluster_ip.unwrap_or_default();
    let url = template.render(scheme, name, namespace, port.port, &cluster_ip);
    check_url(&url, policy)?;
    let rule = annotations
        .get(RULE_ANNOTATION)
        .filter(|r| !r.trim().is_empty());
    let allowed = policy
        .check_rule(namespace, name, rule.map(String::as_str))
        .map_err(SpecError::from)?;
    Ok(Some(Desired {
        route: Route {
            name: route_name(namespace, name),
            entrypoint: entrypoint.clone(),
            rule: allowed.rule,
            url,
        },
        hosts: allowed.hosts,
    }))
}

/// What the Service sync function needs.
#[derive(Clone, Debug)]
pub struct Reconciler {
    /// The routes in the etcd Traefik reads, and who owns them.
    pub routes: Arc<Ownership>,
    /// The controller's cache of Services.
    pub store: Store<Service>,
    /// How Service URLs are built.
    pub template: UrlTemplate,
    /// What may be routed.
    pub policy: Arc<Policy>,
}

impl Reconciler {
    /// Registers, updates or unregisters the Service `key`.
    ///
    /// # Errors
    ///
    /// [`ClaimError`] when etcd fails, or a host of the rule is held by another namespace;
    /// the controller retries.
    pub async fn sync(&self, key: ObjectKey) -> Result<(), ClaimError> {
        let namespace = key.namespace().unwrap_or_default();
        let route = route_name(namespace, key.name());
        let desired = match self.store.get_by_key(&key) {
            None => None,
            Some(svc) => match desired_route(&svc, &self.template, &self.policy) {
                Ok(desired) => desired,
                Err(err) => {
                    warn!(%key, error = %err, "annotated Service cannot be routed; unregistering it");
                    None
                }
            },
        };
        let written = match &desired {
            Some(d) => self.routes.write(&d.route, namespace, &d.hosts).await,
            None => self.routes.remove(&route).await.map_err(ClaimError::from),
        };
        let changes = match written {
            Ok(changes) => changes,
            Err(refused @ ClaimError::OwnedElsewhere { .. }) => {
                warn!(%key, reason = %refused, "annotated Service refused");
                return Ok(());
            }
            // Retried with backoff (a taken host may become free).
            Err(error) => return Err(error),
        };
        let desired = desired.map(|d| d.route);
        if !changes.is_empty() {
            match &desired {
                Some(r) => {
                    info!(%key, url = %redact_url(&r.url), entrypoint = %r.entrypoint, rule = %r.rule, "Service registered")
                }
                None => info!(%key, "Service unregistered"),
            }
        }
        Ok(())
    }
}

impl kube_informer::Reconciler<Service> for Reconciler {
    type Error = ClaimError;

    async fn reconcile(&self, request: ReconcileRequest<Service>) -> Result<Action, ClaimError> {
        self.sync(request.key()).await.map(|()| Action::done())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(annotations: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "web", "namespace": "shop", "annotations": annotations },
            "spec": { "clusterIP": "10.0.0.7", "ports": [
                { "name": "metrics", "port": 9090 }, { "name": "https", "port": 8443 }
            ] }
        }))
        .unwrap()
    }

    #[test]
    fn services_opt_in_with_the_annotation() {
        let template = UrlTemplate::default();
        let policy = Policy::default();
        let route = |annotations, template: &UrlTemplate| {
            desired_route(&service(annotations), template, &policy).map(|d| d.map(|d| d.route))
        };
        assert_eq!(route(serde_json::json!({}), &template), Ok(None));
        let web = route(
            serde_json::json!({ ENTRYPOINT_ANNOTATION: "web" }),
            &template,
        )
        .unwrap()
        .unwrap();
        assert_eq!(web.name, "svc_shop_web");
        assert_eq!(web.url, "http://web.shop.svc:9090");
        assert_eq!(web.rule, "Host(`web.shop`)");
        let https = route(
            serde_json::json!({ ENTRYPOINT_ANNOTATION: "web", PORT_ANNOTATION: "https" }),
            &UrlTemplate("{scheme}://{clusterIP}:{port}".into()),
        )
        .unwrap()
        .unwrap();
        assert_eq!(https.url, "https://10.0.0.7:8443");
        assert_eq!(
            route(
                serde_json::json!({ ENTRYPOINT_ANNOTATION: "web", PORT_ANNOTATION: "grpc" }),
                &template
            ),
            Err(ServiceRouteError::UnknownPort("grpc".into()))
        );
        // The rule annotation is held to the same policy as a TraefikService's rule.
        assert!(matches!(
            route(
                serde_json::json!({ ENTRYPOINT_ANNOTATION: "web", RULE_ANNOTATION: "PathPrefix(`/`)" }),
                &template
            ),
            Err(ServiceRouteError::Spec(SpecError::Policy(_)))
        ));
        assert_eq!(
            key_of_route("svc_shop_web"),
            Some(ObjectKey::new(Some("shop"), "web"))
        );
    }
}
