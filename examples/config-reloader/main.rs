//! config-reloader: a Deployment that names a ConfigMap in the annotation
//! `config-reloader.example.com/configmap` gets a hash of that ConfigMap's data in its pod
//! template, so editing the ConfigMap rolls the Deployment out.
//!
//! ```text
//! cargo run -p examples --bin config-reloader -- --namespace web
//! ```

use std::time::Duration;

use clap::Parser;
use examples::config_reloader::{Args, config_map_of, roll_out};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube_informer::{Action, ClientError, ControllerClient, Manager, ReconcileRequest, Reconciler};

/// Rolls a Deployment out when the ConfigMap it names changes.
struct ConfigReloader {
    client: ControllerClient,
    resync: Duration,
}

impl Reconciler<Deployment> for ConfigReloader {
    type Error = ClientError;

    async fn reconcile(
        &self,
        request: ReconcileRequest<Deployment>,
    ) -> Result<Action, ClientError> {
        let ReconcileRequest::Present(deployment) = request else {
            return Ok(Action::done());
        };
        let Some(config_map) = config_map_of(&deployment) else {
            return Ok(Action::done());
        };
        // From the cache, as it stands after this controller's own writes.
        let cached = self.client.get::<ConfigMap>(&config_map).await?;
        roll_out(&self.client, &deployment, cached.as_deref()).await?;
        Ok(Action::requeue_after(self.resync))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    examples::init_tracing();
    let args = Args::parse();
    let mut manager = Manager::from_args(&args.operator).await?;
    let config_maps = manager.factory().informer::<ConfigMap>(manager.scope());
    // A ConfigMap's change reconciles every Deployment that names it.
    let controller = manager
        .controller::<Deployment>("config-reloader", manager.scope())
        .watches_referenced(config_maps, |d| config_map_of(d).into_iter().collect());
    let reloader = ConfigReloader {
        client: manager.client_for(&controller),
        resync: Duration::from_secs(args.resync),
    };
    manager.add_controller(controller, reloader);
    tracing::info!(scope = ?manager.scope(), "watching Deployments and ConfigMaps");
    manager.run().await?;
    Ok(())
}
