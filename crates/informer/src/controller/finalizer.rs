//! A finalizer held on the objects a controller reconciles, so it cleans up before an
//! object is gone (kube-runtime's `finalizer`, controller-runtime's `controllerutil`
//! finalizer helpers).

use std::{future::Future, sync::Arc};

use kube_client::api::Patch;
use serde_json::json;

use super::{
    client::{ClientError, ControllerClient, Writable},
    request::Action,
};
use crate::key::ObjectKey;

/// What [`finalizer`] asks the reconcile to do.
#[derive(Debug)]
pub enum FinalizerEvent<K> {
    /// The object lives (and holds the finalizer): make the world match it.
    Apply(Arc<K>),
    /// The object is being deleted and still holds the finalizer: remove what was made for
    /// it. The finalizer is removed once this succeeds, and the object goes.
    Cleanup(Arc<K>),
}

/// Why [`finalizer`] failed. Every variant is worth retrying; the controller's error policy
/// decides.
#[derive(Debug, thiserror::Error)]
pub enum FinalizerError<E: std::error::Error + 'static> {
    /// The reconcile's apply step failed.
    #[error("apply failed: {0}")]
    Apply(#[source] E),
    /// The reconcile's cleanup step failed; the finalizer stays.
    #[error("cleanup failed: {0}")]
    Cleanup(#[source] E),
    /// The finalizer could not be added (a 409 when the object changed since it was
    /// cached: the next reconcile sees the new state).
    #[error("adding finalizer {finalizer}: {source}")]
    Add {
        /// The finalizer.
        finalizer: String,
        /// The client's error.
        #[source]
        source: ClientError,
    },
    /// The finalizer could not be removed after the cleanup (a 409 as for
    /// [`Add`](Self::Add)); the cleanup runs again.
    #[error("removing finalizer {finalizer}: {source}")]
    Remove {
        /// The finalizer.
        finalizer: String,
        /// The client's error.
        #[source]
        source: ClientError,
    },
    /// The finalizer's name is not a qualified name with a domain (`example.com/cleanup`).
    #[error("finalizer {0:?} is not a domain-qualified name such as example.com/cleanup")]
    InvalidName(String),
}

/// Reconciles `obj` under the finalizer `name`: adds the finalizer to a live object that
/// lacks it and then [applies](FinalizerEvent::Apply) it; for an object being deleted that
/// holds it, [cleans up](FinalizerEvent::Cleanup) and then removes it, so the deletion
/// completes; an object being deleted without it is left alone.
///
/// Each change of the finalizers is a compare-and-swap on the object's resourceVersion as
/// cached: if the object changed meanwhile the write fails with a conflict (409) and
/// nothing is lost, since the change brings a new reconcile. An object already gone when
/// its finalizer is removed is not an error.
///
/// The finalizers are written through the controller's `client`, so they are its own
/// writes: a reconcile of the object that comes before the cache has seen the finalizer
/// go (a child's deletion brings one at once) waits for it, and the cleanup runs once.
///
/// ```no_run
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{
///     Action, ControllerClient, FinalizerError, FinalizerEvent, ReconcileRequest, finalizer,
/// };
///
/// async fn reconcile(
///     request: ReconcileRequest<ConfigMap>,
///     client: Arc<ControllerClient>,
///     _: kube_informer::CancellationToken,
/// ) -> Result<Action, FinalizerError<std::io::Error>> {
///     let ReconcileRequest::Present(cm) = request else {
///         return Ok(Action::done()); // gone: the finalizer made sure of the cleanup
///     };
///     finalizer(&client, "example.com/cleanup", cm, |event| async move {
///         match event {
///             FinalizerEvent::Apply(cm) => { /* create what cm asks for */ }
///             FinalizerEvent::Cleanup(cm) => { /* remove it */ }
///         }
///         Ok(Action::done())
///     })
///     .await
/// }
/// ```
///
/// # Errors
///
/// [`FinalizerError`]: the reconcile's, or the client's on writing the finalizers.
pub async fn finalizer<K, F, Fut, E>(
    client: &ControllerClient,
    name: &str,
    obj: Arc<K>,
    reconcile: F,
) -> Result<Action, FinalizerError<E>>
where
    K: Writable,
    F: FnOnce(FinalizerEvent<K>) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
    E: std::error::Error + 'static,
{
    if !is_qualified(name) {
        return Err(FinalizerError::InvalidName(name.to_owned()));
    }
    let meta = obj.meta();
    let finalizers: Vec<String> = meta.finalizers.clone().unwrap_or_default();
    let holds = finalizers.iter().any(|f| f == name);
    match (meta.deletion_timestamp.is_some(), holds) {
        (false, true) => reconcile(FinalizerEvent::Apply(obj))
            .await
            .map_err(FinalizerError::Apply),
        (false, false) => {
            let mut with_ours = finalizers;
            with_ours.push(name.to_owned());
            match set_finalizers(client, &*obj, &with_ours).await {
                Ok(()) => {}
                // Gone before the write: nothing to apply.
                Err(error) if error.status_code() == Some(404) => return Ok(Action::done()),
                Err(source) => {
                    return Err(FinalizerError::Add {
                        finalizer: name.to_owned(),
                        source,
                    });
                }
            }
            reconcile(FinalizerEvent::Apply(obj))
                .await
                .map_err(FinalizerError::Apply)
        }
        (true, true) => {
            let action = reconcile(FinalizerEvent::Cleanup(obj.clone()))
                .await
                .map_err(FinalizerError::Cleanup)?;
            let rest: Vec<String> = finalizers.into_iter().filter(|f| f != name).collect();
            match set_finalizers(client, &*obj, &rest).await {
                Ok(()) => Ok(action),
                Err(error) if error.status_code() == Some(404) => Ok(action),
                Err(source) => Err(FinalizerError::Remove {
                    finalizer: name.to_owned(),
                    source,
                }),
            }
        }
        (true, false) => Ok(Action::done()),
    }
}

/// Replaces the object's finalizers with `finalizers` if its resourceVersion is still the
/// cached one.
async fn set_finalizers<K: Writable>(
    client: &ControllerClient,
    obj: &K,
    finalizers: &[String],
) -> Result<(), ClientError> {
    let meta = obj.meta();
    let key = ObjectKey::new(
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or_default(),
    );
    let patch = json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": meta.resource_version,
        }
    });
    client
        .patch::<K, _>(&key, &Patch::Merge(&patch))
        .await
        .map(drop)
}

/// A finalizer must be a qualified name with a prefix (`example.com/name`); the API server
/// refuses others with a warning or an error.
fn is_qualified(name: &str) -> bool {
    name.split_once('/').is_some_and(|(domain, rest)| {
        domain.contains('.') && !domain.starts_with('.') && !rest.is_empty() && !rest.contains('/')
    })
}

#[cfg(test)]
mod tests {
    use super::is_qualified;

    #[test]
    fn finalizer_names_need_a_domain() {
        assert!(is_qualified("example.com/cleanup"));
        assert!(!is_qualified("cleanup"));
        assert!(!is_qualified("example/cleanup"));
        assert!(!is_qualified("example.com/"));
        assert!(!is_qualified("example.com/a/b"));
    }
}
