//! What both config-reloaders share (the one on kube-informer, `config-reloader`, and the
//! same controller on kube-runtime, `config-reloader-kube-runtime`): the annotations and
//! the hash of a ConfigMap's data, and the command line.

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube_client::{
    Api,
    api::{ObjectMeta, Patch, PatchParams},
};
use kube_informer::{ClientError, ControllerClient, ObjectKey, cli::OperatorArgs};
use serde_json::{Value, json};

/// Rolls Deployments out when the ConfigMap they name changes.
#[derive(Debug, clap::Parser)]
#[command(version, about)]
pub struct Args {
    /// The cluster, the namespace watched (default: all), metrics, probes, leases.
    #[command(flatten)]
    pub operator: OperatorArgs,
    /// How often each Deployment is checked even when nothing changes, in seconds.
    #[arg(long, default_value_t = 300)]
    pub resync: u64,
}

/// The annotation on a Deployment that names its ConfigMap.
pub const NAMES: &str = "config-reloader.example.com/configmap";
/// The pod-template annotation that carries the hash of the ConfigMap's data.
pub const HASH: &str = "config-reloader.example.com/config-hash";

/// The value of the annotation `key`, if `meta` has it.
pub fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// FNV-1a of the ConfigMap's data as JSON (maps in key order): the same in every run, so a
/// restart rolls nothing out.
pub fn hash_of(cm: &ConfigMap) -> String {
    let json = serde_json::to_vec(&(&cm.data, &cm.binary_data)).unwrap_or_default();
    let hash = json.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// The key of the ConfigMap `deployment` names, if it names one.
pub fn config_map_of(deployment: &Deployment) -> Option<ObjectKey> {
    let name = annotation(&deployment.metadata, NAMES)?;
    Some(ObjectKey::new(
        deployment.metadata.namespace.as_deref(),
        name,
    ))
}

/// The patch that puts the hash of `config_map`'s data (`absent` for none) in
/// `deployment`'s pod template, unless it is there already: the one write that rolls the
/// Deployment out.
fn roll_out_patch(deployment: &Deployment, config_map: Option<&ConfigMap>) -> Option<Value> {
    let hash = config_map.map_or_else(|| "absent".to_owned(), hash_of);
    let template = deployment.spec.template.metadata.as_ref();
    if template.and_then(|m| annotation(m, HASH)) == Some(hash.as_str()) {
        return None;
    }
    let name = deployment.metadata.name.as_deref().unwrap_or_default();
    tracing::info!(deployment = name, config_map = ?annotation(&deployment.metadata, NAMES), %hash, "rolling out");
    Some(json!({ "spec": { "template": { "metadata": { "annotations": { HASH: hash } } } } }))
}

/// Rolls `deployment` out through the controller's client if `config_map`'s data changed.
///
/// # Errors
///
/// The API server's, when the patch fails.
pub async fn roll_out(
    client: &ControllerClient,
    deployment: &Deployment,
    config_map: Option<&ConfigMap>,
) -> Result<(), ClientError> {
    let (Some(patch), Ok(key)) = (
        roll_out_patch(deployment, config_map),
        ObjectKey::from_object(deployment),
    ) else {
        return Ok(());
    };
    client
        .patch::<Deployment, _>(&key, &Patch::Merge(&patch))
        .await
        .map(drop)
}

/// [`roll_out`] through a plain `Api`, for the kube-runtime twin.
///
/// # Errors
///
/// The API server's, when the patch fails.
pub async fn roll_out_through(
    deployments: &Api<Deployment>,
    deployment: &Deployment,
    config_map: Option<&ConfigMap>,
) -> Result<(), kube_client::Error> {
    let Some(patch) = roll_out_patch(deployment, config_map) else {
        return Ok(());
    };
    let name = deployment.metadata.name.as_deref().unwrap_or_default();
    deployments
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
}
