//! Server-side apply from a controller: the object it wants, and its status, written with
//! the controller as field manager.
//!
//! Apply sends only the fields the controller owns; the API server merges them, tracks
//! who owns what (`managedFields`), and answers a write that would take a field another
//! manager owns with a conflict. An apply that changes nothing does not change the
//! object's resourceVersion, so a controller that applies the same status on every
//! reconcile causes no watch event and no reconcile loop.
//!
//! A reconcile applies through the controller's client
//! ([`ControllerClient::apply`](crate::ControllerClient::apply) and
//! [`apply_status`](crate::ControllerClient::apply_status)), whose reads then wait for what
//! it applied; this module holds what those calls take and return, and [`install_crd`].
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_informer::{
//!     ControllerClient,
//!     apply::{ApplyError, Conflicts},
//! };
//!
//! # async fn doc(client: &ControllerClient) -> Result<(), kube_informer::ClientError> {
//! let mut desired = ConfigMap::default();
//! desired.metadata.name = Some("settings".into());
//! desired.metadata.namespace = Some("web".into());
//! desired.data = Some([("mode".to_owned(), "fast".to_owned())].into());
//! let written = client.apply(&desired, Conflicts::Refuse).await?;
//! # Ok(()) }
//! ```

use std::{fmt::Debug, time::Duration};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::{
    Api, Client,
    api::{Patch, PatchParams, WatchEvent, WatchParams},
};
use kube_core::Resource;
use serde::{Serialize, de::DeserializeOwned};
use tokio::time::Instant;

use crate::{error::server_says, informer::FactoryScope};

/// What an apply does with fields another manager owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conflicts {
    /// Fail with [`ApplyError::Conflict`], leaving them to their owner.
    Refuse,
    /// Take them over (`force=true`): for a controller that is the only rightful owner
    /// of what it writes.
    TakeOwnership,
}

/// A field another manager owns, which an apply would have changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldConflict {
    /// The manager that owns it (e.g. `kubectl-edit`).
    pub manager: String,
    /// The field, as the API server names it (e.g. `.data.mode`).
    pub field: String,
}

/// Why an apply failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// Fields the apply would change belong to other managers; nothing was written.
    #[error("apply as {manager} conflicts with {}", describe(.conflicts))]
    Conflict {
        /// The applying field manager.
        manager: String,
        /// The fields and their owners.
        conflicts: Vec<FieldConflict>,
    },
    /// The object has no name.
    #[error("cannot apply an object without a name")]
    NoName,
    /// The API server refused or did not answer.
    #[error("apply as {manager} failed: {}", server_says(source))]
    Api {
        /// The applying field manager.
        manager: String,
        /// The client's error.
        #[source]
        source: kube_client::Error,
    },
    /// A CRD was applied, and the API server did not report it `Established` in time.
    #[error("CustomResourceDefinition {name} not established after {waited:?}: {conditions}")]
    NotEstablished {
        /// The CRD's name.
        name: String,
        /// How long [`install_crd`] waited.
        waited: Duration,
        /// The conditions the server last reported, as `Type=Status (reason)`.
        conditions: String,
    },
}

/// Applies the CustomResourceDefinition `crd` as the field manager `field_manager` (with
/// [`Conflicts::TakeOwnership`]: an operator owns its CRDs) and waits, for at most
/// `timeout`, until the API server reports it `Established`, so objects of its kind can be
/// listed, watched and written at once. Returns the CRD as stored then.
///
/// ```no_run
/// use std::time::Duration;
/// use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
/// use kube_informer::apply::install_crd;
///
/// # async fn doc(client: kube_client::Client, crd: CustomResourceDefinition) -> Result<(), kube_informer::apply::ApplyError> {
/// install_crd(&client, "example.com/operator", &crd, Duration::from_secs(30)).await?;
/// // Informers and controllers of the new kind can start now.
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`ApplyError::Api`] when the server refuses the CRD or does not answer;
/// [`ApplyError::NotEstablished`] when `timeout` passes first (a name conflict with another
/// CRD, say: its conditions tell).
pub async fn install_crd(
    client: &Client,
    field_manager: &str,
    crd: &CustomResourceDefinition,
    timeout: Duration,
) -> Result<CustomResourceDefinition, ApplyError> {
    Applier::new(client.clone(), field_manager)
        .install_crd(crd, timeout)
        .await
}

/// Whether the server reports `crd` `Established`.
fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

fn describe_conditions(crd: &CustomResourceDefinition) -> String {
    let conditions = crd
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref());
    match conditions {
        Some(conditions) if !conditions.is_empty() => conditions
            .iter()
            .map(|c| match c.reason.as_deref() {
                Some(reason) => format!("{}={} ({reason})", c.type_, c.status),
                None => format!("{}={}", c.type_, c.status),
            })
            .collect::<Vec<_>>()
            .join(", "),
        _ => "no conditions reported".to_owned(),
    }
}

fn describe(conflicts: &[FieldConflict]) -> String {
    conflicts
        .iter()
        .map(|c| format!("{} (owned by {})", c.field, c.manager))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What an [`Applier`] writes: a kind with a static type, namespaced or cluster-scoped,
/// that serializes (for the patch) and deserializes (the stored object it answers with).
pub(crate) trait Appliable:
    Resource<DynamicType = (), Scope: FactoryScope> + Serialize + DeserializeOwned + Clone + Debug
{
}

impl<K> Appliable for K where
    K: Resource<DynamicType = (), Scope: FactoryScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug
{
}

/// Applies objects and their status as one field manager; the controller's client applies
/// through one. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Applier {
    client: Client,
    manager: String,
}

impl Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier")
            .field("manager", &self.manager)
            .finish_non_exhaustive()
    }
}

impl Applier {
    /// Applies with `client` as the field manager `manager` (a controller's name).
    pub(crate) fn new(client: Client, manager: impl Into<String>) -> Self {
        Self {
            client,
            manager: manager.into(),
        }
    }

    /// The field manager's name.
    pub(crate) fn manager(&self) -> &str {
        &self.manager
    }

    /// Applies `desired`: the fields it sets become this manager's, and fields this
    /// manager set before and `desired` leaves out are removed. Returns the object as
    /// the server stored it.
    ///
    /// # Errors
    ///
    /// [`ApplyError::Conflict`] naming the other managers and their fields (with
    /// [`Conflicts::Refuse`]); [`ApplyError::NoName`]; [`ApplyError::Api`].
    pub(crate) async fn apply<K: Appliable>(
        &self,
        desired: &K,
        conflicts: Conflicts,
    ) -> Result<K, ApplyError> {
        let (api, name) = self.api_for(desired)?;
        api.patch(&name, &self.params(conflicts), &Patch::Apply(desired))
            .await
            .map_err(|e| self.error(e))
    }

    /// Applies the status `desired` holds (its other fields are not written): the status
    /// fields it sets become this manager's.
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply).
    pub(crate) async fn apply_status<K: Appliable>(
        &self,
        desired: &K,
        conflicts: Conflicts,
    ) -> Result<K, ApplyError> {
        let (api, name) = self.api_for(desired)?;
        api.patch_status(&name, &self.params(conflicts), &Patch::Apply(desired))
            .await
            .map_err(|e| self.error(e))
    }

    /// Applies `crd` (see [`install_crd`]) and waits until it is established.
    async fn install_crd(
        &self,
        crd: &CustomResourceDefinition,
        timeout: Duration,
    ) -> Result<CustomResourceDefinition, ApplyError> {
        let applied = self.apply(crd, Conflicts::TakeOwnership).await?;
        let name = applied.metadata.name.clone().unwrap_or_default();
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let started = Instant::now();
        let mut last = applied;
        let waited = tokio::time::timeout(timeout, async {
            loop {
                if established(&last) {
                    return Ok(());
                }
                // Each change of the CRD is looked at; a watch that ends is opened again
                // from the last version seen.
                let version = last.metadata.resource_version.clone().unwrap_or_default();
                let params = WatchParams::default().fields(&format!("metadata.name={name}"));
                let mut events = api
                    .watch(&params, &version)
                    .await
                    .map_err(|e| self.error(e))?
                    .boxed();
                while let Some(event) = events.next().await {
                    match event.map_err(|e| self.error(e))? {
                        WatchEvent::Added(crd) | WatchEvent::Modified(crd) => {
                            last = crd;
                            if established(&last) {
                                return Ok(());
                            }
                        }
                        WatchEvent::Bookmark(_) | WatchEvent::Deleted(_) => {}
                        // The version is too old (or the watch failed): read it afresh.
                        WatchEvent::Error(_) => break,
                    }
                }
                last = api.get(&name).await.map_err(|e| self.error(e))?;
            }
        })
        .await;
        match waited {
            Ok(Ok(())) => Ok(last),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(ApplyError::NotEstablished {
                name,
                waited: started.elapsed(),
                conditions: describe_conditions(&last),
            }),
        }
    }

    fn api_for<K: Appliable>(&self, object: &K) -> Result<(Api<K>, String), ApplyError> {
        let meta = object.meta();
        let name = meta.name.clone().ok_or(ApplyError::NoName)?;
        // A namespaced object without a namespace goes where the client's config points.
        let namespace = match meta.namespace.as_deref() {
            None if <K::Scope as FactoryScope>::NAMESPACED => Some(self.client.default_namespace()),
            namespace => namespace,
        };
        Ok((
            <K::Scope as FactoryScope>::api(self.client.clone(), namespace),
            name,
        ))
    }

    fn params(&self, conflicts: Conflicts) -> PatchParams {
        let params = PatchParams::apply(&self.manager);
        match conflicts {
            Conflicts::Refuse => params,
            Conflicts::TakeOwnership => params.force(),
        }
    }

    fn error(&self, error: kube_client::Error) -> ApplyError {
        match &error {
            kube_client::Error::Api(status) if status.code == 409 => {
                let conflicts: Vec<FieldConflict> = status
                    .details
                    .iter()
                    .flat_map(|d| &d.causes)
                    .filter(|c| c.reason == "FieldManagerConflict")
                    .map(|c| FieldConflict {
                        manager: owner(&c.message),
                        field: c.field.clone(),
                    })
                    .collect();
                if conflicts.is_empty() {
                    return ApplyError::Api {
                        manager: self.manager.clone(),
                        source: error,
                    };
                }
                ApplyError::Conflict {
                    manager: self.manager.clone(),
                    conflicts,
                }
            }
            _ => ApplyError::Api {
                manager: self.manager.clone(),
                source: error,
            },
        }
    }
}

/// The manager a conflict cause names: `conflict with "kubectl-edit" using v1` →
/// `kubectl-edit`; the whole message when it is not in that form.
fn owner(message: &str) -> String {
    message
        .split('"')
        .nth(1)
        .filter(|name| !name.is_empty())
        .unwrap_or(message)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_read_from_the_conflict_message() {
        assert_eq!(
            owner(r#"conflict with "kubectl-edit" using v1"#),
            "kubectl-edit"
        );
        assert_eq!(owner("conflict with someone"), "conflict with someone");
    }
}
