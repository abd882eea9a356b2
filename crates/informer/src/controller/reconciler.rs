//! What a controller does with each key: the [`Reconciler`] on the user's own type, or
//! the closure form, a `(reconcile, error_policy, context)` tuple.

use std::{error::Error as StdError, future::Future, sync::Arc};

use super::request::{Action, ErrorAction, Failure, ReconcileRequest};

/// What a controller does with each primary it takes from its queue (controller-runtime's
/// `Reconciler`): make the world match the object, or its absence, and say what to do when
/// that fails. Implement it on your own type; the type holds what a reconcile needs (the
/// controller's client, configuration, outside systems), so it is the context too, and
/// [`Manager::add_controller`](crate::Manager::add_controller)`(controller, reconciler)`
/// is all the wiring.
///
/// ```no_run
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{Action, ClientError, ControllerClient, ReconcileRequest, Reconciler};
///
/// struct Labeller {
///     client: ControllerClient,
/// }
///
/// impl Reconciler<ConfigMap> for Labeller {
///     type Error = ClientError;
///
///     async fn reconcile(&self, request: ReconcileRequest<ConfigMap>) -> Result<Action, ClientError> {
///         let ReconcileRequest::Present(cm) = request else {
///             return Ok(Action::done());
///         };
///         let mut labelled = (*cm).clone();
///         labelled.metadata.labels.get_or_insert_default().insert("seen".into(), "yes".into());
///         self.client.replace(&labelled).await?;
///         Ok(Action::done())
///     }
/// }
/// ```
///
/// The closure form is a tuple of a reconcile function, an error policy (such as
/// [`retry_with_backoff`](crate::retry_with_backoff)) and a shared context:
/// `(reconcile, retry_with_backoff(), Arc::new(context))`.
pub trait Reconciler<K>: Send + Sync + 'static {
    /// Why a reconcile fails.
    type Error: StdError + Send + Sync + 'static;

    /// Reconciles one primary: [present](ReconcileRequest::Present) as the cache holds it
    /// (once the cache has observed the controller's own writes to it), or
    /// [deleted](ReconcileRequest::Deleted). A reconcile is cancelled as any future is, by
    /// dropping it: at its [timeout](crate::Controller::reconcile_timeout) and when the
    /// controller stops.
    ///
    /// # Errors
    ///
    /// Whatever keeps the world from matching the object; the
    /// [error policy](Self::error_policy) decides what follows.
    fn reconcile(
        &self,
        request: ReconcileRequest<K>,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send;

    /// What follows a failed reconcile; by default it is retried with backoff for as long
    /// as it fails (an outage that ends is always recovered from).
    fn error_policy(&self, failure: &Failure<'_, Self::Error>) -> ErrorAction {
        let _ = failure;
        ErrorAction::Backoff
    }
}

impl<K, Ctx, R, Fut, E, P> Reconciler<K> for (R, P, Arc<Ctx>)
where
    K: 'static,
    Ctx: Send + Sync + 'static,
    R: Fn(ReconcileRequest<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: StdError + Send + Sync + 'static,
    P: Fn(&Failure<'_, E>, &Ctx) -> ErrorAction + Send + Sync + 'static,
{
    type Error = E;

    fn reconcile(
        &self,
        request: ReconcileRequest<K>,
    ) -> impl Future<Output = Result<Action, E>> + Send {
        (self.0)(request, self.2.clone())
    }

    fn error_policy(&self, failure: &Failure<'_, E>) -> ErrorAction {
        (self.1)(failure, &self.2)
    }
}
