//! Server-side apply from a controller: the object it wants, and its status, written with
//! the controller as field manager.
//!
//! Apply sends only the fields the controller owns; the API server merges them, tracks
//! who owns what (`managedFields`), and answers a write that would take a field another
//! manager owns with a conflict. An apply that changes nothing does not change the
//! object's resourceVersion, so a controller that applies the same status on every
//! reconcile causes no watch event and no reconcile loop.
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_informer::apply::{Applier, Conflicts};
//!
//! # async fn doc(client: kube_client::Client) -> Result<(), kube_informer::apply::ApplyError> {
//! let applier = Applier::new(client, "example.com/config-writer");
//! let mut desired = ConfigMap::default();
//! desired.metadata.name = Some("settings".into());
//! desired.metadata.namespace = Some("web".into());
//! desired.data = Some([("mode".to_owned(), "fast".to_owned())].into());
//! let written = applier.apply(&desired, Conflicts::Refuse).await?;
//! # Ok(()) }
//! ```

use std::fmt::Debug;

use kube_client::{
    Api, Client,
    api::{Patch, PatchParams},
};
use kube_core::{NamespaceResourceScope, Resource};
use serde::{Serialize, de::DeserializeOwned};

use crate::error::server_says;

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
}

fn describe(conflicts: &[FieldConflict]) -> String {
    conflicts
        .iter()
        .map(|c| format!("{} (owned by {})", c.field, c.manager))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What an [`Applier`] writes: a namespaced kind with a static type, that serializes
/// (for the patch) and deserializes (the stored object it answers with).
pub trait Appliable:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Serialize
    + DeserializeOwned
    + Clone
    + Debug
{
}

impl<K> Appliable for K where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug
{
}

/// Applies objects and their status as one field manager. Cheap to clone.
#[derive(Clone)]
pub struct Applier {
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
    pub fn new(client: Client, manager: impl Into<String>) -> Self {
        Self {
            client,
            manager: manager.into(),
        }
    }

    /// The field manager's name.
    pub fn manager(&self) -> &str {
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
    pub async fn apply<K: Appliable>(
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
    pub async fn apply_status<K: Appliable>(
        &self,
        desired: &K,
        conflicts: Conflicts,
    ) -> Result<K, ApplyError> {
        let (api, name) = self.api_for(desired)?;
        api.patch_status(&name, &self.params(conflicts), &Patch::Apply(desired))
            .await
            .map_err(|e| self.error(e))
    }

    fn api_for<K>(&self, object: &K) -> Result<(Api<K>, String), ApplyError>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        let meta = object.meta();
        let name = meta.name.clone().ok_or(ApplyError::NoName)?;
        let api = match meta.namespace.as_deref() {
            Some(namespace) => Api::namespaced(self.client.clone(), namespace),
            None => Api::default_namespaced(self.client.clone()),
        };
        Ok((api, name))
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
