//! What the tutorial's `main.go` sets up with controller-runtime, wired on kube-informer's
//! [`Manager`]: controllers on shared informers, probes, metrics, leader election.

use std::{error::Error as StdError, sync::Arc};

use k8s_openapi::{
    NamespaceResourceScope,
    api::core::v1::{Pod, Service},
};
use kube_client::Client;
use kube_core::Resource;
use kube_informer::{
    Controller, InformerHandle, Manager, ObjectKey, retry_with_backoff, strip_managed_fields,
    sync_by_key,
};
use serde::{Serialize, de::DeserializeOwned};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

pub use super::cli::{Cli, Command, ControllerKind, Options};
use super::{
    crd::TraefikService,
    etcd::EtcdConfigError,
    kv::TraefikKv,
    ownership::Ownership,
    pods,
    preflight::{self, PreflightError},
    services::{self, UrlTemplate},
    sweep::{Routes, Sweeps},
    traefik_service as tsvc,
};

/// Why the operator could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// A flag's value is unusable.
    #[error("invalid flags: {0}")]
    Flags(String),
    /// The etcd settings are unusable (a missing or unparsable certificate, ...).
    #[error(transparent)]
    EtcdConfig(#[from] EtcdConfigError),
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
            .probe_address(options.probe_address().map_err(ManagerError::Flags)?)
            .metrics_address(options.metrics_address().map_err(ManagerError::Flags)?)
            .shutdown_timeout(options.graceful_shutdown_timeout);
        if options.leader_elect {
            let config = options.leader_election();
            info!(lease = %format!("{}/{}", config.namespace, config.name), identity = %config.identity, "leader election enabled");
            manager = manager.leader_election(config);
        }
        wire(&mut manager, &options, &client)?;
        manager.bind().await?.run(cancel).await?;
        Ok(())
    }
    .await;
    // The manager logs its own failures, with their causes.
    if let Err(err) = &result
        && !matches!(err, ManagerError::Manager(_))
    {
        error!(error = %err, "the operator cannot start");
    }
    result
}

/// Adds the selected controllers, and the etcd placeholder, to `manager`.
fn wire(manager: &mut Manager, options: &Options, client: &Client) -> Result<(), ManagerError> {
    let policy = Arc::new(options.policy().map_err(ManagerError::Flags)?);
    let kv = Arc::new(TraefikKv::connect_with(&options.etcd)?);
    // A task, so that a standby replica writes nothing to etcd.
    let placeholder = kv.clone();
    manager.add("etcd-placeholder", move |_| {
        placeholder.write_placeholder_at_start()
    });
    let ownership = Ownership::new(kv, &options.owner_prefix(), &options.instance);
    let routes = Arc::new(ownership.map_err(ManagerError::Flags)?);
    let namespace = options.namespace.as_deref();
    let sweeps = Sweeps::new(manager.registry(), routes.clone(), namespace);
    let mut wiring = Wiring { manager, options };
    for kind in &options.controllers {
        match kind {
            ControllerKind::Traefikservices => {
                let informer = wiring.informer::<TraefikService>();
                let sweep =
                    sweeps.routes(tsvc::ROUTE_PREFIX, tsvc::key_of_route, "traefikservices");
                let reconciler = tsvc::Reconciler {
                    client: client.clone(),
                    routes: routes.clone(),
                    store: informer.store(),
                    policy: policy.clone(),
                };
                let sync = |r: Arc<tsvc::Reconciler>, key| async move { r.sync(key).await };
                wiring.add("traefikservices", informer, Some(sweep), reconciler, sync);
            }
            ControllerKind::Services => {
                let informer = wiring.informer::<Service>();
                let sweep =
                    sweeps.routes(services::ROUTE_PREFIX, services::key_of_route, "services");
                let reconciler = services::Reconciler {
                    routes: routes.clone(),
                    store: informer.store(),
                    template: UrlTemplate(options.service_url_template.clone()),
                    policy: policy.clone(),
                };
                let sync = |r: Arc<services::Reconciler>, key| async move { r.sync(key).await };
                wiring.add("services", informer, Some(sweep), reconciler, sync);
            }
            ControllerKind::Pods => {
                let informer = wiring.informer::<Pod>();
                let reconciler = pods::Reconciler::new(informer.store());
                let sync = |r: Arc<pods::Reconciler>, key| async move { r.sync(key).await };
                wiring.add("pods", informer, None, reconciler, sync);
            }
        }
    }
    Ok(())
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
        K: Clone + Serialize + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let resync = self.options.resync_period;
        self.manager
            .factory()
            .informer_with(self.options.scope(), move |b| {
                b.resync_period(resync).transform(strip_managed_fields)
            })
    }

    /// Runs a controller of `informer`'s objects, calling the tutorial-shaped
    /// `sync(reconciler, key)`, and with `routes`, sweeping their leftovers. Failures are
    /// outages (etcd, the API server) that end: retried with backoff until they do.
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
        let mut controller = Controller::new(name, informer.clone())
            .workers(self.options.workers)
            .rate_limiter(self.options.retry_limiter());
        if let Some(routes) = routes {
            let store = informer.store();
            let scan = move || {
                let (routes, store) = (routes.clone(), store.clone());
                async move { routes.vanished(&store).await }
            };
            controller = controller.reconcile_every(self.options.resync_period, scan);
        }
        let reconcile = sync_by_key(move |key, reconciler| sync(reconciler, key));
        self.manager.add_controller(
            controller,
            reconcile,
            retry_with_backoff(),
            Arc::new(reconciler),
        );
    }
}
