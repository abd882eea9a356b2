//! object-tutorials: the client-go tutorial's controller, in Rust.
//!
//! Two controllers, one for Pods and one for Services, share one sync
//! function that knows nothing of either type: it reads the object back from
//! the informer's cache by key and logs every label (or that there are none,
//! or that the object is gone). It reads metadata only, so both informers
//! cache `LazyObject`s: the Pods' and Services' metadata is decoded as it
//! arrives, and nothing else of them ever is.
//!
//! ```text
//! cargo run -p examples --bin object-tutorials -- --demo
//! ```
//! runs the whole tutorial: with no cluster configured it starts a local
//! control plane, applies `nginx-deployment-service.yaml`, runs both
//! controllers, and then adds a label to the Service and to one Pod so the
//! update shows in the log. Ctrl-C stops everything.

mod cluster;
mod demo;
mod labels;

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube_client::{Api, Client, Resource};
use kube_informer::{
    ApiListWatch, Controller, ControllerConfig, LazyObject, ObjectKey, SharedInformer,
};
use labels::log_labels;
use serde::{Serialize, de::DeserializeOwned};
use tokio_util::sync::CancellationToken;

/// Logs the labels of Pods and Services in one namespace, the client-go
/// tutorial's controller.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Args {
    /// The namespace to watch.
    #[arg(long, default_value = "client-go-tutorials")]
    namespace: String,
    /// Workers per controller.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// The kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or the
    /// in-cluster service account).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    context: Option<String>,
    /// Run the tutorial end to end: start a local control plane if no
    /// cluster is configured, apply the tutorial's manifests, then edit
    /// labels so updates show.
    #[arg(long)]
    demo: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    examples::init_tracing();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    // Ctrl-C or SIGTERM stops gracefully; a second one exits at once.
    let cancel = kube_informer::cancel_on_signals();

    let cluster = cluster::Cluster::connect(&args).await?;
    if args.demo {
        demo::apply_manifests(&cluster, &args.namespace).await?;
    }
    let client = cluster.client().await?;

    let pods = label_logging_controller::<LazyObject<Pod>>(client.clone(), &args);
    let services = label_logging_controller::<LazyObject<Service>>(client, &args);
    let demo_edits = args.demo.then(|| {
        tokio::spawn(demo::edit_labels(
            cluster.clone(),
            args.namespace.clone(),
            pods.store(),
            services.store(),
            cancel.clone(),
        ))
    });

    let (pods, services) = tokio::join!(
        run_until_cancelled(pods, &cancel),
        run_until_cancelled(services, &cancel)
    );
    if let Some(task) = demo_edits {
        task.abort();
    }
    pods.and(services)
}

/// A controller whose sync function is [`log_labels`]: the same code for
/// every resource type.
fn label_logging_controller<K>(client: Client, args: &Args) -> Controller<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::namespaced(client, &args.namespace);
    let informer = SharedInformer::builder(ApiListWatch::new(api)).build();
    let name = K::plural(&()).into_owned();
    Controller::new(
        informer,
        ControllerConfig::named(name).workers(args.workers),
    )
}

async fn run_until_cancelled<K>(
    controller: Controller<K>,
    cancel: &CancellationToken,
) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
{
    let kind = K::kind(&());
    let store = controller.store();
    let result = controller
        .run(cancel.clone(), move |key: ObjectKey| {
            log_labels(&store, &key);
            std::future::ready(Ok::<(), std::convert::Infallible>(()))
        })
        .await;
    // One controller failing (say, forbidden to list) stops the other too.
    cancel.cancel();
    result.with_context(|| format!("the {kind} controller failed"))
}
