//! What both config-reloaders share (the one on kube-informer, `config-reloader`, and the
//! same controller on kube-runtime, `config-reloader-kube-runtime`): the annotations and
//! the hash of a ConfigMap's data.

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::api::ObjectMeta;

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
