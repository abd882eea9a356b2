//! config-reloader: a Deployment that names a ConfigMap in the annotation
//! `config-reloader.example.com/configmap` gets a hash of that ConfigMap's data in its pod
//! template, so editing the ConfigMap rolls the Deployment out.
//!
//! ```text
//! cargo run -p examples --bin config-reloader -- --namespace web
//! ```

use std::time::Duration;

use clap::Parser;
use examples::config_reloader::{Args, NAMES, annotation, roll_out};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube_client::Api;
use kube_informer::{
    Action, CancellationToken, ClusterSource, Controller, InformerHandle, Manager, Predicate,
    ReconcileRequest, Reconciler, Scope,
};

/// Rolls a Deployment out when the ConfigMap it names changes.
struct ConfigReloader {
    deployments: Api<Deployment>,
    config_maps: InformerHandle<ConfigMap>,
    resync: Duration,
}

impl Reconciler<Deployment> for ConfigReloader {
    type Error = kube_client::Error;

    async fn reconcile(
        &self,
        request: ReconcileRequest<Deployment>,
        _cancel: CancellationToken,
    ) -> Result<Action, kube_client::Error> {
        let ReconcileRequest::Present(deployment) = request else {
            return Ok(Action::done());
        };
        let Some(config_map) = annotation(&deployment.metadata, NAMES) else {
            return Ok(Action::done());
        };
        let namespace = deployment.metadata.namespace.as_deref().unwrap_or_default();
        let cached = self
            .config_maps
            .store()
            .get_by_key(format!("{namespace}/{config_map}"));
        roll_out(&self.deployments, &deployment, cached.as_deref()).await?;
        Ok(Action::requeue_after(self.resync))
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let cluster = ClusterSource {
        kubeconfig: args.kubeconfig,
        context: args.context,
    };
    let client = cluster.client().await?;
    let mut manager = Manager::new(client.clone())
        .probe_address(None)
        .metrics_address(None);
    let scope = Scope::namespace(&args.namespace);
    // Each Deployment indexed by the ConfigMap it names, so a ConfigMap change finds them.
    let deployments = manager
        .factory()
        .informer_with::<Deployment>(scope.clone(), |builder| {
            builder.indexer("configmap", |d: &Deployment| {
                let namespace = d.metadata.namespace.as_deref().unwrap_or_default();
                annotation(&d.metadata, NAMES)
                    .map(|cm| vec![format!("{namespace}/{cm}")])
                    .unwrap_or_default()
            })
        });
    let config_maps = manager.factory().informer::<ConfigMap>(scope);
    let controller = Controller::new("config-reloader", deployments)
        .predicate(Predicate::generation_changed().or(Predicate::annotations_changed()))
        .watches_by_index(config_maps.clone(), "configmap");
    let reloader = ConfigReloader {
        deployments: Api::namespaced(client, &args.namespace),
        config_maps,
        resync: Duration::from_secs(args.resync),
    };
    manager.add_controller(controller, reloader);
    tracing::info!(namespace = %args.namespace, "watching Deployments and ConfigMaps");
    manager
        .bind()
        .await?
        .run(kube_informer::cancel_on_signals())
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    examples::init_tracing();
    run(Args::parse()).await
}
