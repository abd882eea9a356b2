//! What a reconcile is given and what it answers: [`ReconcileRequest`], [`Action`], and for
//! failures [`ReconcileError`], [`Failure`] and the error policy's [`ErrorAction`].

use std::{
    error::Error as StdError,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use kube_core::Resource;
use pin_project_lite::pin_project;

use crate::key::ObjectKey;

/// What a reconcile is about: the primary object as cached now, or the news that it is
/// gone.
#[derive(Debug)]
pub enum ReconcileRequest<K> {
    /// The object exists; this is its cached state.
    Present(Arc<K>),
    /// The object was deleted.
    Deleted {
        /// Its key.
        key: ObjectKey,
        /// Its last state, when the informer saw it (not after a restart of the controller,
        /// or for a key enqueued by hand for an object that never existed).
        last_known: Option<Arc<K>>,
        /// Its UID, when known: from its last state, or, for a sharded controller, from the
        /// replica that saw the deletion in a slot it lost and forwarded it here (which
        /// then comes without a last state).
        uid: Option<String>,
    },
}

impl<K: Resource> ReconcileRequest<K> {
    /// The object's UID, when known (see [`Deleted::uid`](ReconcileRequest::Deleted)): a
    /// key can name one object, then, once it is deleted, another.
    pub fn uid(&self) -> Option<&str> {
        match self {
            ReconcileRequest::Present(obj) => obj.meta().uid.as_deref(),
            ReconcileRequest::Deleted { uid, .. } => uid.as_deref(),
        }
    }

    /// The object's key.
    pub fn key(&self) -> ObjectKey {
        match self {
            ReconcileRequest::Present(obj) => {
                ObjectKey::from_object(&**obj).unwrap_or_else(|_| ObjectKey::new(None, ""))
            }
            ReconcileRequest::Deleted { key, .. } => key.clone(),
        }
    }
}

/// What to do with a primary after a successful reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    pub(super) requeue_after: Option<Duration>,
}

impl Action {
    /// Nothing more until the next change.
    pub fn done() -> Self {
        Self {
            requeue_after: None,
        }
    }

    /// Reconcile again after `delay` even if nothing changes (sooner if something does).
    pub fn requeue_after(delay: Duration) -> Self {
        Self {
            requeue_after: Some(delay),
        }
    }

    /// The requeue delay, if any.
    pub fn requeue_delay(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// Why a reconcile did not succeed, for the error policy.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError<E: StdError + 'static> {
    /// The reconcile function returned an error.
    #[error(transparent)]
    Failed(E),
    /// It ran longer than the [reconcile timeout](crate::Controller::reconcile_timeout);
    /// its cancellation token was cancelled and its future dropped.
    #[error("reconcile did not finish within {0:?}")]
    TimedOut(Duration),
    /// It panicked.
    #[error("reconcile panicked: {0}")]
    Panicked(String),
}

/// What the error policy decides for a failed reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorAction {
    /// Requeue after the rate limiter's per-key backoff (growing with each failure).
    Backoff,
    /// Requeue after this delay, and reset the key's backoff.
    RequeueAfter(Duration),
    /// Do not retry: the error is one retrying cannot fix. The key is forgotten until its
    /// next change.
    GiveUp,
}

/// A failed reconcile, as the error policy sees it.
#[derive(Debug)]
pub struct Failure<'a, E: StdError + 'static> {
    /// The primary's key.
    pub key: &'a ObjectKey,
    /// What went wrong.
    pub error: &'a ReconcileError<E>,
    /// How many times this key has been requeued for failures in a row before this one.
    pub retries: u32,
}

/// The client-go samples' rule: back off while the key has been retried fewer than `max`
/// times, then give up (the tutorials use 5).
///
/// ```
/// use kube_informer::{ErrorAction, Failure, ObjectKey, ReconcileError, retry_up_to};
///
/// let policy = retry_up_to::<std::io::Error, ()>(5);
/// let key = ObjectKey::new(Some("ns"), "a");
/// let error = ReconcileError::Failed(std::io::Error::other("down"));
/// let failure = |retries| Failure { key: &key, error: &error, retries };
/// assert_eq!(policy(&failure(4), &()), ErrorAction::Backoff);
/// assert_eq!(policy(&failure(5), &()), ErrorAction::GiveUp);
/// ```
pub fn retry_up_to<E: StdError + 'static, Ctx>(
    max: u32,
) -> impl Fn(&Failure<'_, E>, &Ctx) -> ErrorAction + Send + Sync + 'static {
    move |failure, _| {
        if failure.retries < max {
            ErrorAction::Backoff
        } else {
            ErrorAction::GiveUp
        }
    }
}

/// The production default: back off and retry for as long as the reconcile fails (5 ms
/// doubling to 1000 s per key with the default rate limiter), so an outage that ends is
/// always recovered from.
pub fn retry_with_backoff<E: StdError + 'static, Ctx>()
-> impl Fn(&Failure<'_, E>, &Ctx) -> ErrorAction + Send + Sync + 'static {
    |_, _| ErrorAction::Backoff
}

pin_project! {
    /// The future [`sync_by_key`]'s reconcile returns: the sync function's, holding the
    /// request until it ends, so that the object a read of the cache decoded for the
    /// request is the one the sync function's own read by key gets back (see
    /// [`WorkingSet`](crate::store::WorkingSet)), and is freed as the reconcile ends.
    pub struct SyncFuture<Fut, K> {
        #[pin]
        sync: Fut,
        request: ReconcileRequest<K>,
    }
}

impl<Fut, K, E> Future for SyncFuture<Fut, K>
where
    Fut: Future<Output = Result<(), E>>,
{
    type Output = Result<Action, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project()
            .sync
            .poll(cx)
            .map(|result| result.map(|()| Action::done()))
    }
}

/// A reconcile made of the client-go tutorials' sync function: it gets the primary's key
/// (and the shared context) and reads what it needs from the cache itself; an absent
/// object means a deleted one. Success is [`Action::done`].
///
/// ```no_run
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::Pod;
/// use kube_informer::{CancellationToken, Controller, InformerFactory, ObjectKey, Scope, retry_up_to, sync_by_key};
///
/// # async fn doc(factory: InformerFactory) -> Result<(), kube_informer::Error> {
/// let pods = factory.informer::<Pod>(Scope::namespace("default"));
/// let store = pods.store();
/// let sync = move |key: ObjectKey, _: Arc<()>| {
///     let exists = store.contains_key(&key);
///     async move {
///         tracing::info!(%key, exists, "synced");
///         Ok::<(), std::io::Error>(())
///     }
/// };
/// let cancel = CancellationToken::new();
/// factory.start(&cancel);
/// Controller::new("pods", pods)
///     .run((sync_by_key(sync), retry_up_to(5), Arc::new(())), cancel)
///     .await
/// # }
/// ```
pub fn sync_by_key<K, Ctx, F, Fut, E>(
    sync: F,
) -> impl Fn(ReconcileRequest<K>, Arc<Ctx>) -> SyncFuture<Fut, K> + Send + Sync + 'static
where
    K: Resource,
    F: Fn(ObjectKey, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>>,
{
    move |request, context| SyncFuture {
        sync: sync(request.key(), context),
        request,
    }
}
