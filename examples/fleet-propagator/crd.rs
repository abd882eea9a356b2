//! The `PropagatedConfig` custom resource (group `fleet.kube-informer.dev`, version
//! `v1`), which lives on the hub: a ConfigMap's data and the member clusters it goes to.
//! `fleet-propagator crd` prints its CRD; the propagator installs it on the hub at start.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the resource, its labels, annotations and finalizers.
pub const GROUP: &str = "fleet.kube-informer.dev";

/// The label every copy in a member carries; the propagator's informers of the members
/// select on it, so a ConfigMap of the same name that is not a copy is never touched.
pub const COPY_LABEL: &str = "fleet.kube-informer.dev/propagated";

/// The annotation on a copy naming the hub's `PropagatedConfig` (`namespace/name`).
pub const SOURCE_ANNOTATION: &str = "fleet.kube-informer.dev/source";

/// The condition type each member's entry in the status carries.
pub const PROPAGATED: &str = "Propagated";

/// The finalizer a member's controller holds on a `PropagatedConfig` while the member
/// has a copy: `propagation.fleet.kube-informer.dev/<cluster>`. One per member, so the
/// object goes only once every member's copy is gone.
pub fn member_finalizer(cluster: &str) -> String {
    format!("propagation.{GROUP}/{cluster}")
}

/// A ConfigMap to keep in member clusters: each named member (every member, when none is
/// named) gets a ConfigMap of the same namespace and name holding `data`.
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[kube(
    group = "fleet.kube-informer.dev",
    version = "v1",
    kind = "PropagatedConfig",
    namespaced,
    status = "PropagatedConfigStatus",
    shortname = "pcfg",
    doc = "PropagatedConfig keeps a ConfigMap of the same namespace and name, holding \
           spec.data, in each member cluster named in spec.clusters (every member when the \
           list is empty). status.clusters says, per member, whether its copy is current.",
    printcolumn(name = "Clusters", type_ = "string", json_path = ".spec.clusters"),
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
pub struct PropagatedConfigSpec {
    /// The data of the ConfigMap each member gets.
    #[serde(default)]
    pub data: BTreeMap<String, String>,

    /// The member clusters, by their names in the fleet (the kubeconfig Secret's name).
    /// Empty: every member.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
}

/// Where the copies stand, one entry per member cluster.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PropagatedConfigStatus {
    /// One entry per member the object goes to, each written by that member's controller
    /// alone (server-side apply, one field manager per member; a map-list keyed by
    /// `cluster`, so the members never overwrite each other's entries).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "members_schema")]
    pub clusters: Vec<MemberStatus>,
}

/// One member's copy (its schema is [`members_schema`]'s items).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// The member cluster's name in the fleet.
    pub cluster: String,
    /// `Propagated`: whether the member's copy holds the current data, and why not.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A map-list keyed by `cluster`, each entry a list of `metav1.Condition`s keyed by type.
fn members_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["cluster"],
        "items": {
            "type": "object",
            "required": ["cluster"],
            "properties": {
                "cluster": { "type": "string", "maxLength": 253 },
                "conditions": {
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
                }
            }
        }
    })
}

impl PropagatedConfig {
    /// Whether the object goes to `cluster`.
    pub fn targets(&self, cluster: &str) -> bool {
        self.spec.clusters.is_empty() || self.spec.clusters.iter().any(|c| c == cluster)
    }

    /// `cluster`'s entry in the status, if it has one.
    pub fn member_status(&self, cluster: &str) -> Option<&MemberStatus> {
        self.status
            .as_ref()?
            .clusters
            .iter()
            .find(|entry| entry.cluster == cluster)
    }
}

/// The CRD manifest as YAML.
///
/// # Errors
///
/// Only if the CRD cannot be serialised (a bug).
pub fn crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube_core::CustomResourceExt;
    let body = serde_saphyr::to_string(&PropagatedConfig::crd())?;
    Ok(format!(
        "# Generated from examples/fleet-propagator/crd.rs by `fleet-propagator crd`.\n---\n{body}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_list_of_clusters_targets_every_member() {
        let mut config = PropagatedConfig::new(
            "settings",
            PropagatedConfigSpec {
                data: BTreeMap::new(),
                clusters: Vec::new(),
            },
        );
        assert!(config.targets("a") && config.targets("b"));
        config.spec.clusters = vec!["a".into()];
        assert!(config.targets("a") && !config.targets("b"));
    }

    #[test]
    fn the_status_is_a_map_list_by_cluster() {
        let crd = serde_json::to_value(<PropagatedConfig as kube_core::CustomResourceExt>::crd())
            .expect("the CRD serialises");
        let status =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
        let clusters = &status["properties"]["clusters"];
        assert_eq!(clusters["x-kubernetes-list-type"], "map");
        assert_eq!(
            clusters["x-kubernetes-list-map-keys"],
            serde_json::json!(["cluster"])
        );
        assert!(
            crd_yaml()
                .expect("YAML")
                .contains("kind: CustomResourceDefinition")
        );
    }
}
