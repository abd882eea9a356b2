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

use std::{convert::Infallible, path::PathBuf, process::ExitCode, sync::Arc};

use clap::Parser;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube_informer::{
    Manager, ObjectKey, Scope, Store, TypedResource, list_watch::LazyObject, retry_up_to,
    sync_by_key,
};
use labels::log_labels;

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
    // A tutorial serves no probes or metrics; one controller failing (say, forbidden to
    // list) stops the other too.
    let mut manager = Manager::new(cluster.client().await?)
        .probe_address(None)
        .metrics_address(None);
    let pods = add_label_logger::<LazyObject<Pod>>(&mut manager, &args);
    let services = add_label_logger::<LazyObject<Service>>(&mut manager, &args);
    if args.demo {
        let (namespace, cluster) = (args.namespace.clone(), cluster.clone());
        manager.add("demo", move |cancel| async move {
            demo::edit_labels(cluster, namespace, pods, services, cancel).await;
            Ok::<(), Infallible>(())
        });
    }
    manager.bind().await?.run(cancel).await?;
    Ok(())
}

/// Adds a controller named after `K`'s resource whose sync function is [`log_labels`]:
/// the same code for every resource type. Returns its cache.
fn add_label_logger<K>(manager: &mut Manager, args: &Args) -> Store<K>
where
    K: TypedResource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    let name = K::plural(&());
    let controller = manager
        .controller::<K>(name, Scope::namespace(&args.namespace))
        .workers(args.workers);
    let store = controller.store();
    let cache = store.clone();
    let sync = move |key: ObjectKey, _: Arc<()>| {
        log_labels(&cache, &key);
        std::future::ready(Ok::<(), Infallible>(()))
    };
    manager.add_controller(
        controller,
        (sync_by_key(sync), retry_up_to(5), Arc::new(())),
    );
    store
}
