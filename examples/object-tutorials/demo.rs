//! The tutorial's manual steps, done by the demo: create the namespace,
//! apply the manifests, and later edit labels as the tutorial does with
//! `kubectl edit`.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube_client::{
    Api,
    api::{Patch, PatchParams},
};
use kube_informer::{Store, list_watch::LazyObject};
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;

/// The tutorial's manifests, shipped beside this file.
pub const MANIFESTS: &str = include_str!("nginx-deployment-service.yaml");

/// The label the demo adds to show updates being logged.
const DEMO_LABEL: &str = "demo-edited";

/// Creates the namespace and applies the manifests into it.
pub async fn apply_manifests(cluster: &Cluster, namespace: &str) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    examples::ensure_namespace(&client, namespace).await?;
    let applied = examples::apply_yaml(&client, MANIFESTS, Some(namespace), "object-tutorials")
        .await
        .context("applying nginx-deployment-service.yaml")?;
    tracing::info!(%namespace, ?applied, "applied the tutorial's manifests");
    Ok(())
}

/// Once the three nginx Pods are in the cache, adds a label to the Service
/// and to one Pod, as the tutorial does by hand.
pub async fn edit_labels(
    cluster: Cluster,
    namespace: String,
    pods: Store<LazyObject<Pod>>,
    services: Store<LazyObject<Service>>,
    cancel: CancellationToken,
) {
    // The controller-manager creates the Pods a moment after the Deployment.
    let ready = async {
        loop {
            if pods.len() >= 3 && !services.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::select! {
        () = cancel.cancelled() => return,
        () = ready => {}
    }
    if let Err(err) = label_service_and_one_pod(&cluster, &namespace, &pods).await {
        tracing::error!("demo: editing labels failed: {err:#}");
    }
}

async fn label_service_and_one_pod(
    cluster: &Cluster,
    namespace: &str,
    pods: &Store<LazyObject<Pod>>,
) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    let patch =
        Patch::Merge(serde_json::json!({ "metadata": { "labels": { DEMO_LABEL: "true" } } }));
    let params = PatchParams::default();
    tracing::info!("demo: adding label {DEMO_LABEL}=true to Service nginx-service");
    Api::<Service>::namespaced(client.clone(), namespace)
        .patch("nginx-service", &params, &patch)
        .await?;
    let mut names: Vec<String> = pods
        .list()
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    if let Some(pod) = names.first() {
        tracing::info!("demo: adding label {DEMO_LABEL}=true to Pod {pod}");
        Api::<Pod>::namespaced(client, namespace)
            .patch(pod, &params, &patch)
            .await?;
    }
    tracing::info!("demo: done; the controllers keep running until Ctrl-C");
    Ok(())
}
