//! What both config-reloaders share (the one on kube-informer, `config-reloader`, and the
//! same controller on kube-runtime, `config-reloader-kube-runtime`): the annotations and
//! the hash of a ConfigMap's data, and the command line.

use std::path::PathBuf;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube_client::{
    Api,
    api::{ObjectMeta, Patch, PatchParams},
};
use serde_json::json;

/// Rolls Deployments out when the ConfigMap they name changes.
#[derive(Debug, clap::Parser)]
#[command(version, about)]
pub struct Args {
    /// The namespace to watch.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// The kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
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

/// Puts the hash of `config_map`'s data (`absent` for none) in `deployment`'s pod template,
/// unless it is there already: the one write that rolls the Deployment out.
///
/// # Errors
///
/// The API server's, when the patch fails.
pub async fn roll_out(
    deployments: &Api<Deployment>,
    deployment: &Deployment,
    config_map: Option<&ConfigMap>,
) -> Result<(), kube_client::Error> {
    let hash = config_map.map_or_else(|| "absent".to_owned(), hash_of);
    let template = deployment.spec.template.metadata.as_ref();
    if template.and_then(|m| annotation(m, HASH)) == Some(hash.as_str()) {
        return Ok(());
    }
    let name = deployment.metadata.name.as_deref().unwrap_or_default();
    tracing::info!(deployment = name, config_map = ?annotation(&deployment.metadata, NAMES), %hash, "rolling out");
    let patch =
        json!({ "spec": { "template": { "metadata": { "annotations": { HASH: hash } } } } });
    deployments
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
}
