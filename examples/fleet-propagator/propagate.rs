//! What runs for each member cluster the fleet engages: a controller over the hub's
//! `PropagatedConfig`s that keeps the member's copy of each, reports it in the object's
//! status (the member's own entry), publishes an Event on the hub object when a copy
//! fails, and removes the copy when the object is deleted or no longer names the member.
//!
//! Every member's controller shares the one hub informer of `PropagatedConfig`s and
//! watches its own member's copies (selected by [`COPY_LABEL`]), so a copy deleted or
//! edited in a member is put back.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube_client::{Client, api::Patch};
use kube_informer::{
    Action, ClientError, Controller, ControllerClient, FinalizerError, FinalizerEvent,
    InformerHandle, ObjectKey, ReconcileRequest, Reconciler, Scope,
    apply::Conflicts,
    conditions::{ConditionStatus, NewCondition, set_condition},
    events::{Event, Recorder},
    finalizer,
    fleet::Engaged,
};
use serde_json::json;

use crate::crd::{
    COPY_LABEL, MemberStatus, PROPAGATED, PropagatedConfig, PropagatedConfigStatus,
    SOURCE_ANNOTATION, member_finalizer,
};

/// What every member's controller shares: the hub, its informer of `PropagatedConfig`s,
/// and the recorder of Events on them.
#[derive(Clone)]
pub struct Hub {
    /// A client of the hub.
    pub client: Client,
    /// The hub's `PropagatedConfig`s.
    pub configs: InformerHandle<PropagatedConfig>,
    /// Events about `PropagatedConfig`s, written to the hub.
    pub recorder: Recorder,
}

/// Why a member's copy could not be made or removed.
#[derive(Debug, thiserror::Error)]
pub enum PropagateError {
    /// Writing the copy in the member, or removing it, failed.
    #[error("in cluster {cluster}: {source}")]
    Member {
        /// The member.
        cluster: String,
        /// The client's error.
        #[source]
        source: ClientError,
    },
    /// Writing the hub object's status or finalizers failed.
    #[error("on the hub: {0}")]
    Hub(#[source] ClientError),
}

/// One member's propagation: the [`Reconciler`] of its controller.
pub struct Member {
    cluster: String,
    finalizer: String,
    hub: ControllerClient,
    member: ControllerClient,
    recorder: Recorder,
}

/// Runs the propagation to `cluster` until the fleet ends its engagement.
///
/// # Errors
///
/// When the controller stops with an error (an informer stopped, or missing RBAC in the
/// member); the fleet starts the member again after a backoff.
pub async fn engage(hub: Arc<Hub>, cluster: Engaged) -> Result<(), kube_informer::Error> {
    let name = cluster.cluster().name().to_string();
    let copies = cluster
        .factory()
        .informer::<ConfigMap>(Scope::all().labels(COPY_LABEL));
    let controller = Controller::new(format!("fleet-propagator/{name}"), hub.configs.clone())
        .watches(copies, |copy: &ConfigMap| {
            ObjectKey::from_object(copy).ok().into_iter().collect()
        })
        .workers(cluster.workers())
        .share_workers(cluster.tenant());
    let member = Member {
        finalizer: member_finalizer(&name),
        hub: controller.client(hub.client.clone()),
        member: controller.client(cluster.client()),
        recorder: hub.recorder.clone(),
        cluster: name,
    };
    controller.run(member, cluster.cancel()).await
}

impl Reconciler<PropagatedConfig> for Member {
    type Error = FinalizerError<PropagateError>;

    async fn reconcile(
        &self,
        request: ReconcileRequest<PropagatedConfig>,
    ) -> Result<Action, Self::Error> {
        // A deleted object held this member's finalizer until its copy was gone.
        let ReconcileRequest::Present(config) = request else {
            return Ok(Action::done());
        };
        if !config.targets(&self.cluster) {
            return self
                .withdraw(&config)
                .await
                .map_err(FinalizerError::Cleanup);
        }
        finalizer(&self.hub, &self.finalizer, config, |event| async move {
            match event {
                FinalizerEvent::Apply(config) => self.propagate(&config).await,
                FinalizerEvent::Cleanup(config) => {
                    self.remove_copy(&config).await?;
                    Ok(Action::done())
                }
            }
        })
        .await
    }
}

impl Member {
    /// Writes the member's copy and reports how it went in the status; a failure is also
    /// an Event on the hub object, and fails the reconcile, so it is retried.
    async fn propagate(&self, config: &PropagatedConfig) -> Result<Action, PropagateError> {
        let written = self.member.apply(&copy_of(config), Conflicts::Refuse).await;
        let condition = match &written {
            Ok(_) => NewCondition::new(
                PROPAGATED,
                ConditionStatus::True,
                "Propagated",
                "the copy holds the current data",
            ),
            Err(error) => NewCondition::new(
                PROPAGATED,
                ConditionStatus::False,
                "PropagationFailed",
                error.to_string(),
            ),
        }
        .observed_from(config);
        self.report(config, Some(condition)).await?;
        match written {
            Ok(_) => Ok(Action::done()),
            Err(source) => {
                self.recorder.publish_for(
                    Event::warning("PropagationFailed", "Propagate")
                        .note(format!("cluster {}: {source}", self.cluster)),
                    config,
                );
                Err(PropagateError::Member {
                    cluster: self.cluster.clone(),
                    source,
                })
            }
        }
    }

    /// The object no longer names this member: its copy, status entry and finalizer go.
    async fn withdraw(&self, config: &PropagatedConfig) -> Result<Action, PropagateError> {
        self.remove_copy(config).await?;
        self.report(config, None).await?;
        let finalizers = config.metadata.finalizers.clone().unwrap_or_default();
        if finalizers.contains(&self.finalizer) {
            let rest: Vec<&String> = finalizers
                .iter()
                .filter(|f| **f != self.finalizer)
                .collect();
            let patch = json!({
                "metadata": {
                    "finalizers": rest,
                    "resourceVersion": config.metadata.resource_version,
                }
            });
            match self
                .hub
                .patch::<PropagatedConfig, _>(&key_of(config), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(error) if error.is_not_found() => {}
                Err(error) => return Err(PropagateError::Hub(error)),
            }
        }
        Ok(Action::done())
    }

    /// Deletes the member's copy, if it has one (a ConfigMap without [`COPY_LABEL`] is
    /// not in the member's cache, so never a copy).
    async fn remove_copy(&self, config: &PropagatedConfig) -> Result<(), PropagateError> {
        let key = key_of(config);
        let member_error = |source| PropagateError::Member {
            cluster: self.cluster.clone(),
            source,
        };
        if self
            .member
            .get::<ConfigMap>(&key)
            .await
            .map_err(member_error)?
            .is_none()
        {
            return Ok(());
        }
        match self.member.delete::<ConfigMap>(&key).await {
            Ok(()) => Ok(()),
            Err(error) if error.is_not_found() => Ok(()),
            Err(error) => Err(member_error(error)),
        }
    }

    /// Applies this member's entry of the status (`condition`), or removes it (`None`):
    /// each member is its own field manager, so entries of other members stay. Nothing is
    /// written when the entry already says so.
    async fn report(
        &self,
        config: &PropagatedConfig,
        condition: Option<NewCondition>,
    ) -> Result<(), PropagateError> {
        let current = config.member_status(&self.cluster);
        let entry = condition.map(|condition| {
            let mut conditions = current.map(|c| c.conditions.clone()).unwrap_or_default();
            set_condition(&mut conditions, condition);
            MemberStatus {
                cluster: self.cluster.clone(),
                conditions,
            }
        });
        if entry.as_ref() == current {
            return Ok(());
        }
        let mut desired = PropagatedConfig::new(
            config.metadata.name.as_deref().unwrap_or_default(),
            config.spec.clone(),
        );
        desired
            .metadata
            .namespace
            .clone_from(&config.metadata.namespace);
        desired.status = Some(PropagatedConfigStatus {
            clusters: entry.into_iter().collect(),
        });
        match self
            .hub
            .apply_status(&desired, Conflicts::TakeOwnership)
            .await
        {
            Ok(_) => Ok(()),
            Err(error) if error.is_not_found() => Ok(()),
            Err(error) => Err(PropagateError::Hub(error)),
        }
    }
}

/// The copy a member keeps of `config`.
fn copy_of(config: &PropagatedConfig) -> ConfigMap {
    let namespace = config.metadata.namespace.clone().unwrap_or_default();
    let name = config.metadata.name.clone().unwrap_or_default();
    ConfigMap {
        metadata: ObjectMeta {
            annotations: Some(BTreeMap::from([(
                SOURCE_ANNOTATION.to_owned(),
                format!("{namespace}/{name}"),
            )])),
            labels: Some(BTreeMap::from([(COPY_LABEL.to_owned(), "true".to_owned())])),
            name: Some(name),
            namespace: Some(namespace),
            ..ObjectMeta::default()
        },
        data: Some(config.spec.data.clone()),
        ..ConfigMap::default()
    }
}

/// The key of `config`, which is also its copies' key.
fn key_of(config: &PropagatedConfig) -> ObjectKey {
    ObjectKey::new(
        config.metadata.namespace.as_deref(),
        config.metadata.name.as_deref().unwrap_or_default(),
    )
}
