//! What the tutorial's `main.go` sets up with controller-runtime, wired on kube-informer's
//! [`Manager`]: controllers on shared informers, probes, metrics, leader election.

use std::sync::Arc;

use k8s_openapi::{NamespaceResourceScope, api::core::v1::Pod};
use kube_client::Client;
use kube_informer::{Controller, FactoryDefaults, InformerFactory, Manager, TypedResource};
use tokio_util::sync::CancellationToken;
use tracing::error;

pub use super::cli::{Cli, Command, ControllerKind, Options};
use super::{
    etcd::EtcdConfigError,
    kv::TraefikKv,
    ownership::Ownership,
    pods,
    preflight::{self, PreflightError},
    services::{self, UrlTemplate},
    sweep::Sweeps,
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
        let operator = &options.operator;
        preflight::check(&client, operator.namespace.as_deref(), &options.controllers).await?;
        // Every informer resyncs (so routes changed in etcd behind the operator's back are
        // repaired) and keeps no managed fields.
        let defaults = FactoryDefaults::default()
            .resync_period(options.resync_period)
            .strip_managed_fields();
        let factory = InformerFactory::with_defaults(client, defaults);
        let mut manager = Manager::with_factory(factory)
            .configure(operator)?
            .shutdown_timeout(options.graceful_shutdown_timeout);
        wire(&mut manager, &options)?;
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
fn wire(manager: &mut Manager, options: &Options) -> Result<(), ManagerError> {
    let policy = Arc::new(options.policy().map_err(ManagerError::Flags)?);
    let kv = Arc::new(TraefikKv::connect_with(&options.etcd)?);
    // A task, so that a standby replica writes nothing to etcd.
    let placeholder = kv.clone();
    manager.add("etcd-placeholder", move |_| {
        placeholder.write_placeholder_at_start()
    });
    let ownership = Ownership::new(kv, &options.owner_prefix(), &options.instance);
    let routes = Arc::new(ownership.map_err(ManagerError::Flags)?);
    let namespace = options.operator.namespace.as_deref();
    let sweeps = Sweeps::new(manager.registry(), routes.clone(), namespace);
    let period = options.resync_period;
    for kind in &options.controllers {
        match kind {
            ControllerKind::Traefikservices => {
                let name = "traefikservices";
                let swept = sweeps.routes(tsvc::ROUTE_PREFIX, tsvc::key_of_route, name);
                let controller = swept.swept_by(controller(manager, options, name), period);
                let reconciler = tsvc::Reconciler {
                    client: manager.client_for(&controller),
                    routes: routes.clone(),
                    store: controller.store(),
                    policy: policy.clone(),
                    events: manager.recorder(tsvc::REPORTING_CONTROLLER),
                };
                manager.add_controller(controller, reconciler);
            }
            ControllerKind::Services => {
                let name = "services";
                let swept = sweeps.routes(services::ROUTE_PREFIX, services::key_of_route, name);
                let controller = swept.swept_by(controller(manager, options, name), period);
                let reconciler = services::Reconciler {
                    routes: routes.clone(),
                    store: controller.store(),
                    template: UrlTemplate(options.service_url_template.clone()),
                    policy: policy.clone(),
                };
                manager.add_controller(controller, reconciler);
            }
            ControllerKind::Pods => {
                let controller = controller::<Pod>(manager, options, "pods");
                let reconciler = pods::Reconciler::new(controller.store());
                manager.add_controller(controller, reconciler);
            }
        }
    }
    Ok(())
}

/// A controller of the manager's informer of `K` in the operator's scope, with its workers
/// and retries. Failures are outages (etcd, the API server) that end: retried with backoff
/// until they do.
fn controller<K>(manager: &Manager, options: &Options, name: &str) -> Controller<K>
where
    K: TypedResource<Scope = NamespaceResourceScope>,
{
    manager
        .controller(name, manager.scope())
        .workers(options.workers)
        .rate_limiter(options.retry_limiter())
}
