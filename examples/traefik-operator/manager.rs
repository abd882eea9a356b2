//! The manager: what the tutorial's `main.go` sets up with controller-runtime, as wiring of
//! kube-informer's [`Manager`]: the selected controllers on shared informers, probes,
//! metrics, optional leader election, bounded shutdown.

use std::{convert::Infallible, error::Error as StdError, sync::Arc, time::Duration};

use futures::TryFutureExt;
use k8s_openapi::{
    NamespaceResourceScope,
    api::core::v1::{Pod, Service},
};
use kube_client::Client;
use kube_core::Resource;
use kube_informer::{
    Action, ControllerBuilder, InformerHandle, Manager, ObjectKey, retry_with_backoff,
    strip_managed_fields,
    workqueue::{Bucket, ItemExponentialFailure, MaxOf},
};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use super::cli::{Cli, Command, ControllerKind, Options};
use super::{
    crd::TraefikService,
    kv::TraefikKv,
    pods,
    preflight::{self, PreflightError},
    services::{self, UrlTemplate},
    sweep::Routes,
    traefik_service as tsvc,
};

/// Why the operator could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// A bind-address flag is not an address.
    #[error("invalid address: {0}")]
    Address(String),
    /// An install step is missing (the CRD, RBAC).
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    /// The manager failed: an address in use, a controller that cannot sync, lost
    /// leadership (a replica that lost the Lease exits, as controller-runtime's do, and is
    /// restarted as a candidate).
    #[error(transparent)]
    Manager(#[from] kube_informer::ManagerError),
}

/// Runs the operator until `cancel` fires (then stops gracefully and returns `Ok`).
///
/// # Errors
///
/// [`ManagerError`], also logged with its causes.
pub async fn run(
    options: Options,
    client: Client,
    cancel: CancellationToken,
) -> Result<(), ManagerError> {
    let result = async {
        preflight::check(&client, options.namespace.as_deref(), &options.controllers).await?;
        let mut manager = Manager::new(client.clone())
            .probe_address(options.probe_address().map_err(ManagerError::Address)?)
            .metrics_address(options.metrics_address().map_err(ManagerError::Address)?)
            .shutdown_timeout(options.graceful_shutdown_timeout);
        if options.leader_elect {
            let config = options.leader_election();
            info!(lease = %format!("{}/{}", config.namespace, config.name), identity = %config.identity, "leader election enabled");
            manager = manager.leader_election(config);
        }
        wire(&mut manager, &options, &client);
        manager.bind().await?.run(cancel).await?;
        Ok(())
    }
    .await;
    // The manager logs its own failures, with their causes.
    if let Err(err @ (ManagerError::Address(_) | ManagerError::Preflight(_))) = &result {
        error!(error = %err, "the operator cannot start");
    }
    result
}

/// Adds the selected controllers, and the etcd placeholder, to `manager`.
fn wire(manager: &mut Manager, options: &Options, client: &Client) {
    let kv = Arc::new(TraefikKv::new(
        options.etcd_endpoints.clone(),
        options.etcd_root_key.clone(),
    ));
    let placeholder = kv.clone();
    // A task, so that a standby replica writes nothing to etcd.
    manager.add("etcd-placeholder", move |_| async move {
        if let Err(err) = placeholder.ensure_placeholder().await {
            warn!(error = %err, detail = %err.detail(), "etcd not reachable at start; syncs will retry");
        }
        Ok::<_, Infallible>(())
    });
    let mut wiring = Wiring { manager, options };
    for kind in &options.controllers {
        match kind {
            ControllerKind::Traefikservices => {
                let informer = wiring.informer::<TraefikService>();
                let routes = Routes::new(&kv, tsvc::ROUTE_PREFIX, tsvc::key_of_route);
                let reconciler = tsvc::Reconciler {
                    client: client.clone(),
                    kv: kv.clone(),
                    store: informer.store(),
                };
                let sync = |r: Arc<tsvc::Reconciler>, key| async move { r.sync(key).await };
                wiring.add("traefikservices", informer, Some(routes), reconciler, sync);
            }
            ControllerKind::Services => {
                let informer = wiring.informer::<Service>();
                let routes = Routes::new(&kv, services::ROUTE_PREFIX, services::key_of_route);
                let reconciler = services::Reconciler {
                    kv: kv.clone(),
                    store: informer.store(),
                    template: UrlTemplate(options.service_url_template.clone()),
                };
                let sync = |r: Arc<services::Reconciler>, key| async move { r.sync(key).await };
                wiring.add("services", informer, Some(routes), reconciler, sync);
            }
            ControllerKind::Pods => {
                let informer = wiring.informer::<Pod>();
                let reconciler = pods::Reconciler::new(informer.store());
                let sync = |r: Arc<pods::Reconciler>, key| async move { r.sync(key).await };
                wiring.add("pods", informer, None, reconciler, sync);
            }
        }
    }
}

/// The manager being wired, and the flags it is wired by.
struct Wiring<'a> {
    manager: &'a mut Manager,
    options: &'a Options,
}

impl Wiring<'_> {
    /// The factory's informer of `K` in the operator's scope, without managed fields.
    fn informer<K>(&self) -> InformerHandle<K>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
        K: Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let resync = self.options.resync_period;
        self.manager
            .factory()
            .informer_with(self.options.scope(), move |b| {
                b.resync_period(resync).transform(strip_managed_fields)
            })
    }

    /// Runs a controller of `informer`'s objects under the manager, calling the
    /// tutorial-shaped `sync(reconciler, key)`; with `routes`, it also sweeps their leftovers. Failures are outages
    /// (etcd, the API server) that end: they are retried with backoff, up to
    /// `--max-retry-delay` apart, until they do.
    fn add<K, R, S, Fut, E>(
        &mut self,
        name: &str,
        informer: InformerHandle<K>,
        routes: Option<Routes>,
        reconciler: R,
        sync: S,
    ) where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Send + Sync + 'static,
        R: Send + Sync + 'static,
        S: Fn(Arc<R>, ObjectKey) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: StdError + Send + Sync + 'static,
    {
        let limiter: MaxOf<ObjectKey> = MaxOf::new(vec![
            Box::new(ItemExponentialFailure::new(
                Duration::from_millis(5),
                self.options.max_retry_delay,
            )),
            Box::new(Bucket::new(10.0, 100)),
        ]);
        let mut controller = ControllerBuilder::new(name, informer.clone())
            .workers(self.options.workers)
            .rate_limiter(limiter)
            .metrics(self.manager.workqueue_metrics())
            .reconcile_metrics(self.manager.controller_metrics());
        if let Some(routes) = routes {
            controller =
                controller.reconcile_on(routes.vanished(informer, self.options.resync_period));
        }
        self.manager.add(name, move |cancel| {
            controller.run(
                move |request, reconciler, _| {
                    sync(reconciler, request.key()).map_ok(|()| Action::done())
                },
                retry_with_backoff(),
                Arc::new(reconciler),
                cancel,
            )
        });
    }
}
