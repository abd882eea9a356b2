//! config-reloader end to end: the real binary against the real control plane (and the
//! same controller on kube-runtime, for comparison). A Deployment that names a ConfigMap
//! gets the hash of its data in its pod template, and a new hash when the ConfigMap
//! changes; a Deployment that names none is left alone.

use std::{process::Stdio, time::Duration};

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube_client::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use kube_testenv::TestEnv;
use serde_json::json;
use tokio::process::Command;

const PATIENCE: Duration = Duration::from_secs(90);
const HASH: &str = "config-reloader.example.com/config-hash";

fn deployment(name: &str, config_map: Option<&str>) -> Deployment {
    let annotations = config_map
        .map(|cm| json!({ "config-reloader.example.com/configmap": cm }))
        .unwrap_or(json!({}));
    serde_json::from_value(json!({
        "metadata": { "name": name, "annotations": annotations },
        "spec": {
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{ "name": "app", "image": "nginx" }] }
            }
        }
    }))
    .unwrap()
}

fn template_hash(d: &Deployment) -> Option<String> {
    d.spec
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(HASH)
        .cloned()
}

/// Waits until the Deployment's template hash satisfies `condition`; returns it.
async fn hash_when(
    api: &Api<Deployment>,
    name: &str,
    what: &str,
    condition: impl Fn(&Option<String>) -> bool,
) -> Option<String> {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let hash = template_hash(&api.get(name).await.unwrap());
            if condition(&hash) {
                return hash;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_change_rolls_out_the_deployments_that_name_it() {
    rolls_out(env!("CARGO_BIN_EXE_config-reloader")).await;
}

/// The same controller on kube-runtime passes the same test (it is there to compare how
/// much each library leaves to write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kube_runtime_config_reloader_does_the_same() {
    rolls_out(env!("CARGO_BIN_EXE_config-reloader-kube-runtime")).await;
}

async fn rolls_out(reloader: &str) {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("reloader").await.unwrap();
    let client = env.client().await.unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let deployments: Api<Deployment> = Api::namespaced(client, &namespace);
    let settings: ConfigMap = serde_json::from_value(
        json!({ "metadata": { "name": "settings" }, "data": { "level": "info" } }),
    )
    .unwrap();
    config_maps
        .create(&PostParams::default(), &settings)
        .await
        .unwrap();
    for d in [
        deployment("app", Some("settings")),
        deployment("other", None),
    ] {
        deployments
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
    }

    let _reloader = Command::new(reloader)
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .args(["--namespace", &namespace])
        .args([
            "--metrics-bind-address",
            "0",
            "--health-probe-bind-address",
            "0",
        ])
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting config-reloader");

    let first = hash_when(&deployments, "app", "the first hash", Option::is_some).await;
    config_maps
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "level": "debug" } })),
        )
        .await
        .unwrap();
    let second = hash_when(&deployments, "app", "a new hash", |h| {
        h.is_some() && *h != first
    })
    .await;
    assert_ne!(first, second);
    // The same data again gives the same hash: nothing rolls out twice for one state.
    config_maps
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "level": "info" } })),
        )
        .await
        .unwrap();
    hash_when(&deployments, "app", "the first hash again", |h| *h == first).await;
    assert_eq!(
        template_hash(&deployments.get("other").await.unwrap()),
        None
    );
}
