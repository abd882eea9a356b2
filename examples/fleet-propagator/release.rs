//! A member that leaves the fleet (its kubeconfig Secret deleted) can no longer remove its
//! copies, nor the finalizer it holds on each `PropagatedConfig`: without this controller,
//! deleting such an object would wait forever. It releases, on objects being deleted, the
//! finalizers of members the hub no longer has a Secret for; the copies in a member that
//! left stay with that member.

use k8s_openapi::api::core::v1::Secret;
use kube_client::api::Patch;
use kube_informer::{
    Action, ClientError, Controller, ControllerClient, InformerHandle, ObjectKey, ReconcileRequest,
    Reconciler, Store,
};
use serde_json::json;

use crate::{
    crd::{PropagatedConfig, member_finalizer},
    propagate::Hub,
};

/// The [`Reconciler`] releasing the finalizers of members gone from the fleet.
pub struct Release {
    hub: ControllerClient,
    members: Store<Secret>,
    namespace: String,
}

/// The controller, over the hub's `PropagatedConfig`s and the members' Secrets (`members`:
/// the same Secrets the fleet follows, all in `namespace`): a Secret deleted brings every
/// object being deleted that holds its member's finalizer.
pub fn controller(
    hub: &Hub,
    members: InformerHandle<Secret>,
    namespace: &str,
) -> (Controller<PropagatedConfig>, Release) {
    let configs = hub.configs.store();
    let controller = Controller::new("fleet-propagator/release", hub.configs.clone()).watches(
        members.clone(),
        move |secret: &Secret| {
            let finalizer = member_finalizer(secret.metadata.name.as_deref().unwrap_or_default());
            configs
                .list()
                .into_iter()
                .filter(|config| {
                    holds(config, &finalizer) && config.metadata.deletion_timestamp.is_some()
                })
                .filter_map(|config| ObjectKey::from_object(&*config).ok())
                .collect()
        },
    );
    let release = Release {
        hub: controller.client(hub.client.clone()),
        members: members.store(),
        namespace: namespace.to_owned(),
    };
    (controller, release)
}

fn holds(config: &PropagatedConfig, finalizer: &str) -> bool {
    config
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|all| all.iter().any(|f| f == finalizer))
}

impl Reconciler<PropagatedConfig> for Release {
    type Error = ClientError;

    async fn reconcile(
        &self,
        request: ReconcileRequest<PropagatedConfig>,
    ) -> Result<Action, ClientError> {
        let ReconcileRequest::Present(config) = request else {
            return Ok(Action::done());
        };
        if config.metadata.deletion_timestamp.is_none() {
            return Ok(Action::done());
        }
        let prefix = member_finalizer("");
        let finalizers = config.metadata.finalizers.clone().unwrap_or_default();
        let kept: Vec<&String> = finalizers
            .iter()
            .filter(|finalizer| {
                finalizer.strip_prefix(&prefix).is_none_or(|member| {
                    self.members
                        .contains_key(ObjectKey::new(Some(&self.namespace), member))
                })
            })
            .collect();
        if kept.len() == finalizers.len() {
            return Ok(Action::done());
        }
        let Ok(key) = ObjectKey::from_object(&*config) else {
            return Ok(Action::done());
        };
        tracing::info!(object = %key, released = finalizers.len() - kept.len(), "releasing the finalizers of members gone from the fleet");
        let patch = json!({
            "metadata": {
                "finalizers": kept,
                "resourceVersion": config.metadata.resource_version,
            }
        });
        match self
            .hub
            .patch::<PropagatedConfig, _>(&key, &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(Action::done()),
            Err(error) if error.is_not_found() => Ok(Action::done()),
            Err(error) => Err(error),
        }
    }
}
