//! The `TraefikService` custom resource (group `traefik.kube-informer.dev`, version `v1`):
//! one HTTP route through Traefik, from an entrypoint and a rule to one backend URL.
//!
//! The CRD manifest in `config/crd/` is generated from these types
//! (`traefik-operator crd > config/crd/traefik.kube-informer.dev_traefikservices.yaml`);
//! a test fails when the checked-in file and the types disagree.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the operator's resources, annotations and finalizer.
pub const GROUP: &str = "traefik.kube-informer.dev";

/// The finalizer that keeps a `TraefikService` until its keys are gone from etcd.
pub const FINALIZER: &str = "traefik.kube-informer.dev/cleanup";

/// Where the generated CRD manifest is checked in, relative to this package.
pub const CRD_PATH: &str = "config/crd/traefik.kube-informer.dev_traefikservices.yaml";

/// An absolute `http` or `https` URL with a host: what the API server accepts in `spec.url`.
/// The controller checks the same again (objects stored before the CRD said so).
pub const URL_PATTERN: &str = r"^https?://[^/?#\s:@]+(:[0-9]{1,5})?([/?#]\S*)?$";

/// A backend registered with Traefik: requests that enter through `entrypoint` and match
/// `rule` are forwarded to `url`.
// The printer columns repeat `type_ = ...` by design; clippy reads them as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[kube(
    group = "traefik.kube-informer.dev",
    version = "v1",
    kind = "TraefikService",
    namespaced,
    status = "TraefikServiceStatus",
    shortname = "tsvc",
    doc = "TraefikService registers one backend URL with Traefik's etcd (KV) provider: the \
           operator writes a Traefik router (entrypoint, rule) and a load-balancer service \
           (url) under the provider's root key.",
    printcolumn(name = "Entrypoint", type_ = "string", json_path = ".spec.entrypoint"),
    printcolumn(name = "URL", type_ = "string", json_path = ".spec.url"),
    printcolumn(name = "Active", type_ = "boolean", json_path = ".status.active"),
    printcolumn(name = "Updated", type_ = "date", json_path = ".status.lastUpdateTime"),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.message",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    crates(
        kube_core = "::kube_core",
        k8s_openapi = "::k8s_openapi",
        schemars = "::schemars",
        serde = "::serde",
        serde_json = "::serde_json"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TraefikServiceSpec {
    /// The Traefik entrypoint (a name from Traefik's static configuration, e.g. `web`)
    /// whose requests this route takes.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    )]
    pub entrypoint: String,

    /// The backend: an absolute `http` or `https` URL, e.g. `http://web.shop.svc:8080`.
    #[schemars(
        length(max = 2048),
        regex(pattern = r"^https?://[^/?#\s:@]+(:[0-9]{1,5})?([/?#]\S*)?$")
    )]
    pub url: String,

    /// Traefik's router rule. Defaults to ``Host(`<name>.<namespace>`)``, so
    /// `curl -H 'Host: <name>.<namespace>' http://<traefik>/` reaches the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub rule: Option<String>,
}

/// What the operator last did with a `TraefikService`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraefikServiceStatus {
    /// Whether the route is in etcd as the spec says.
    #[serde(default)]
    pub active: bool,

    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "date_time_schema")]
    pub last_update_time: Option<Time>,

    /// Why the route is not active (empty when it is).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`: whether the route is in etcd as the spec says, since when, and why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// `metav1.Condition`s, one per type (a map-list, so each type is merged on its own).
fn conditions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "lastTransitionTime", "reason", "message"],
            "properties": {
                "type": { "type": "string", "maxLength": 316 },
                "status": { "type": "string", "enum": ["True", "False", "Unknown"] },
                "observedGeneration": { "type": "integer", "format": "int64", "minimum": 0 },
                "lastTransitionTime": { "type": "string", "format": "date-time" },
                "reason": { "type": "string", "maxLength": 1024 },
                "message": { "type": "string", "maxLength": 32768 }
            }
        }
    })
}

fn date_time_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "string", "format": "date-time" })
}

/// The CRD manifest as YAML, exactly as checked in under `config/crd/`.
///
/// # Errors
///
/// Only if the CRD cannot be serialised (a bug).
pub fn crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube_core::CustomResourceExt;
    let crd = TraefikService::crd();
    let body = serde_saphyr::to_string(&crd)?;
    Ok(format!(
        "# Generated from examples/traefik-operator/crd.rs by `traefik-operator crd`; do not edit.\n\
         ---\n{body}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_in_crd_matches_the_types() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(CRD_PATH);
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        let generated = crd_yaml().unwrap();
        assert!(
            checked_in == generated,
            "{} is stale; regenerate it with `cargo run -p traefik-operator -- crd > examples/traefik-operator/{CRD_PATH}`",
            path.display()
        );
    }

    #[test]
    fn the_url_pattern_in_the_schema_is_the_documented_one() {
        let crd =
            serde_json::to_value(<TraefikService as kube_core::CustomResourceExt>::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["properties"]["url"]["pattern"], URL_PATTERN);
        assert_eq!(spec["required"], serde_json::json!(["entrypoint", "url"]));
    }
}
