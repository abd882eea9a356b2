//! config-reloader on kube-runtime: the same controller as `config-reloader`, written the
//! way kube-rs documents it, for comparison (its end-to-end test runs both). A Deployment
//! that names a ConfigMap in `config-reloader.example.com/configmap` gets a hash of the
//! ConfigMap's data in its pod template.
//!
//! ```text
//! cargo run -p examples --bin config-reloader-kube-runtime -- --namespace web
//! ```

use std::{sync::Arc, time::Duration};

use clap::Parser;
use examples::config_reloader::{Args, NAMES, annotation, roll_out_through};
use futures::StreamExt;
use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube_client::{
    Api, Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};
use kube_runtime::{
    Controller,
    controller::Action,
    reflector::{ObjectRef, Store},
    watcher,
};

/// What every reconcile shares.
struct Context {
    deployments: Api<Deployment>,
    config_maps: Api<ConfigMap>,
    resync: Duration,
}

async fn reconcile(
    deployment: Arc<Deployment>,
    ctx: Arc<Context>,
) -> Result<Action, kube_client::Error> {
    let Some(config_map) = annotation(&deployment.metadata, NAMES) else {
        return Ok(Action::await_change());
    };
    // kube-runtime's controller caches only its primaries: the ConfigMap is read live.
    let live = ctx.config_maps.get_opt(config_map).await?;
    roll_out_through(&ctx.deployments, &deployment, live.as_ref()).await?;
    Ok(Action::requeue(ctx.resync))
}

fn error_policy(_: Arc<Deployment>, error: &kube_client::Error, _: Arc<Context>) -> Action {
    tracing::warn!(%error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// The Deployments of `store` that name the ConfigMap `cm`.
fn naming(store: &Store<Deployment>, cm: &ConfigMap) -> Vec<ObjectRef<Deployment>> {
    let name = cm.metadata.name.as_deref();
    store
        .state()
        .iter()
        .filter(|d| annotation(&d.metadata, NAMES) == name)
        .map(|d| ObjectRef::from_obj(&**d))
        .collect()
}

async fn client(args: &Args) -> anyhow::Result<Client> {
    let options = KubeConfigOptions {
        context: args.operator.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &args.operator.kubeconfig {
        Some(path) => {
            Config::from_custom_kubeconfig(Kubeconfig::read_from(path)?, &options).await?
        }
        None if args.operator.context.is_some() => Config::from_kubeconfig(&options).await?,
        None => Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    examples::init_tracing();
    let args = Args::parse();
    let client = client(&args).await?;
    let namespace = args.operator.namespace.as_deref().unwrap_or("default");
    let deployments = Api::<Deployment>::namespaced(client.clone(), namespace);
    let config_maps = Api::<ConfigMap>::namespaced(client, namespace);
    let controller = Controller::new(deployments.clone(), watcher::Config::default());
    let store = controller.store();
    let context = Arc::new(Context {
        deployments,
        config_maps: config_maps.clone(),
        resync: Duration::from_secs(args.resync),
    });
    tracing::info!(namespace, "watching Deployments and ConfigMaps");
    controller
        .watches(config_maps, watcher::Config::default(), move |cm| {
            naming(&store, &cm)
        })
        .shutdown_on_signal()
        .run(reconcile, error_policy, context)
        .for_each(|_| futures::future::ready(()))
        .await;
    Ok(())
}
