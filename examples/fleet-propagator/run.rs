//! The propagator's wiring: the CRD installed on the hub, one informer of
//! `PropagatedConfig`s shared by every member's controller, and the fleet of members
//! announced by kubeconfig Secrets.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use k8s_openapi::api::core::v1::Secret;
use kube_client::Client;
use kube_informer::{
    CancellationToken, InformerFactory, Scope,
    apply::install_crd,
    events::{Recorder, Reporter},
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

/// Installs the CRD on the hub and propagates until `cancel`; `on_start` gets the fleet's
/// view (for a readiness probe, or a test).
///
/// # Errors
///
/// When the CRD cannot be installed on the hub.
pub async fn run(
    hub: Client,
    options: Options,
    cancel: CancellationToken,
    on_start: impl FnOnce(FleetView),
) -> anyhow::Result<()> {
    use kube_core::CustomResourceExt;
    install_crd(
        &hub,
        MANAGER,
        &PropagatedConfig::crd(),
        Duration::from_secs(30),
    )
    .await
    .context("installing the PropagatedConfig CRD on the hub")?;
    let factory = InformerFactory::new(hub.clone());
    let hub_state = Arc::new(Hub {
        client: hub.clone(),
        configs: factory.informer::<PropagatedConfig>(Scope::all()),
        recorder: Recorder::new(hub.clone(), Reporter::new(MANAGER)),
    });
    let members = factory.informer::<Secret>(
        Scope::namespace(&options.secrets_namespace)
            .labels(format!("{KUBECONFIG_SECRET_LABEL}=true")),
    );
    let (release, releaser) = release::controller(&hub_state, members, &options.secrets_namespace);
    factory.start(&cancel);
    let release = tokio::spawn(release.run(releaser, cancel.clone()));
    let fleet = Fleet::new(KubeconfigSecrets::new(hub, &options.secrets_namespace))
        .workers(options.workers);
    on_start(fleet.view());
    tracing::info!(namespace = %options.secrets_namespace, workers = options.workers, "propagating to the members the hub's kubeconfig Secrets name");
    let recorder = hub_state.recorder.clone();
    fleet
        .run(
            move |cluster: Engaged| engage(hub_state.clone(), cluster),
            cancel,
        )
        .await;
    let released = release.await;
    factory.shutdown().await;
    recorder.shutdown().await;
    released
        .context("the release controller panicked")?
        .context("the release controller failed")
}
