//! The propagator's wiring on kube-informer's [`Manager`]: the CRD installed on the hub,
//! one informer of `PropagatedConfig`s shared by every member's controller, the release
//! controller, and the fleet of members announced by kubeconfig Secrets, with the fleet's
//! metrics and the members behind on the manager's endpoints. With a shard ring
//! (`--shard-ring`), the members are dealt over the replicas.

use std::{convert::Infallible, sync::Arc, time::Duration};

use anyhow::Context;
use k8s_openapi::api::core::v1::Secret;
use kube_informer::{
    CancellationToken, Manager, Scope,
    apply::install_crd,
    fleet::{Engaged, Fleet, FleetView, KUBECONFIG_SECRET_LABEL, KubeconfigSecrets},
};

use crate::{
    crd::PropagatedConfig,
    propagate::{Hub, engage},
    release,
};

/// The field manager of the CRD, and the Events' reporting controller.
pub const MANAGER: &str = "fleet.kube-informer.dev/propagator";

/// How the propagator runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// The hub's namespace holding the members' kubeconfig Secrets.
    pub secrets_namespace: String,
    /// The reconciles run at once over every member, shared fairly.
    pub workers: usize,
}

/// Installs the CRD on the hub (`manager`'s cluster) and propagates until `cancel`;
/// `on_start` gets the fleet's view (for a test).
///
/// # Errors
///
/// When the CRD cannot be installed on the hub, the manager's addresses cannot be bound,
/// or one of its tasks fails.
pub async fn run(
    mut manager: Manager,
    options: Options,
    cancel: CancellationToken,
    on_start: impl FnOnce(FleetView),
) -> anyhow::Result<()> {
    use kube_core::CustomResourceExt;
    let hub = manager.factory().client();
    install_crd(
        &hub,
        MANAGER,
        &PropagatedConfig::crd(),
        Duration::from_secs(30),
    )
    .await
    .context("installing the PropagatedConfig CRD on the hub")?;
    let hub_state = Arc::new(Hub {
        client: hub.clone(),
        configs: manager.factory().informer::<PropagatedConfig>(Scope::all()),
        recorder: manager.recorder(MANAGER),
    });
    let members = manager.factory().informer::<Secret>(
        Scope::namespace(&options.secrets_namespace)
            .labels(format!("{KUBECONFIG_SECRET_LABEL}=true")),
    );
    let (release, releaser) = release::controller(&hub_state, members, &options.secrets_namespace);
    manager.add_controller(release, releaser);

    let mut fleet = Fleet::new(KubeconfigSecrets::new(hub, &options.secrets_namespace))
        .workers(options.workers);
    if let Some(ring) = manager.ring() {
        fleet = fleet.spread_over(ring.clone());
    }
    manager.report_fleet(fleet.view());
    on_start(fleet.view());
    tracing::info!(namespace = %options.secrets_namespace, workers = options.workers, "propagating to the members the hub's kubeconfig Secrets name");
    manager.add("fleet", move |cancel| async move {
        fleet
            .run(
                move |cluster: Engaged| engage(hub_state.clone(), cluster),
                cancel,
            )
            .await;
        Ok::<_, Infallible>(())
    });
    manager
        .bind()
        .await
        .context("binding the manager's endpoints")?
        .run(cancel)
        .await
        .context("the propagator's manager")
}
