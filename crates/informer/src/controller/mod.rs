//! The worker loop of a controller: an informer feeds object keys into a
//! rate-limited workqueue, and workers hand each key to your sync function.
//! The full documentation is on [`Controller`].

mod config;
#[cfg(feature = "prometheus")]
mod metrics;
mod predicate;
mod reconciler;
mod worker;

use std::{fmt, future::Future, sync::Arc};

use kube_client::Resource;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::{
    error::Error,
    informer::{InformerHandle, SharedInformer, key_handler},
    key::ObjectKey,
    store::Store,
    workqueue::{QueueConfig, RateLimitingQueue, default_controller_rate_limiter},
};

pub use config::{ControllerConfig, DroppedHook};
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub use metrics::ControllerMetrics;
pub use predicate::Predicate;
#[cfg(feature = "manager")]
pub(crate) use reconciler::error_chain;
pub use reconciler::{
    Action, ControllerBuilder, ErrorAction, Failure, ReconcileError, ReconcileRequest, retry_up_to,
    retry_with_backoff,
};
pub use worker::ControllerStats;
pub(crate) use worker::join_within;
use worker::run_worker;

/// An informer wired to a rate-limited workqueue of object keys, and the
/// workers that drain it.
///
/// The worker loop of a controller: an informer feeds object keys into a
/// rate-limited workqueue, and workers hand each key to your sync function.
///
/// This is the shape of every client-go sample controller, packaged so a
/// controller author writes only the sync function:
///
/// - adds, updates and deletes (tombstones included) become keys on a
///   [`RateLimitingQueue`], so a burst of events for one object collapses to
///   one sync, and no key is ever synced by two workers at once;
/// - the workers start once the informer's cache has synced, so the sync
///   function can trust the [`Store`]: a key that is absent there means the
///   object was deleted;
/// - the error rule of client-go's samples: a failed key goes back with
///   [`add_rate_limited`](RateLimitingQueue::add_rate_limited) while it has
///   been requeued fewer than `max_requeues` times, and is then forgotten and
///   reported; a success calls [`forget`](RateLimitingQueue::forget);
/// - a panic in the sync function is caught and counted as a failure, so it
///   never takes a worker down.
///
/// ```no_run
/// use k8s_openapi::api::core::v1::Pod;
/// use kube_client::{Api, Client};
/// use kube_informer::{ApiListWatch, CancellationToken, Controller, ControllerConfig, SharedInformer};
///
/// # async fn demo(client: Client) -> Result<(), kube_informer::Error> {
/// let informer = SharedInformer::new(ApiListWatch::new(Api::<Pod>::namespaced(client, "default")));
/// let controller = Controller::new(informer, ControllerConfig::named("pods").workers(2));
/// let store = controller.store();
/// let cancel = CancellationToken::new();
/// controller
///     .run(cancel, move |key| {
///         let pod = store.get_by_key(&key);
///         async move {
///             match pod {
///                 Some(pod) => tracing::info!(%key, phase = ?pod.status.as_ref().and_then(|s| s.phase.as_deref()), "synced"),
///                 None => tracing::info!(%key, "deleted"),
///             }
///             Ok::<(), std::convert::Infallible>(())
///         }
///     })
///     .await
/// # }
/// ```
pub struct Controller<K> {
    informer: SharedInformer<K>,
    queue: RateLimitingQueue<ObjectKey>,
    config: ControllerConfig,
    stats: Arc<ControllerStats>,
}

impl<K> fmt::Debug for Controller<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<K> Controller<K>
where
    K: Resource + Send + Sync + 'static,
{
    /// A controller over `informer`, which it starts in [`run`](Self::run) (an informer that
    /// has not run yet: one that runs cannot be passed).
    pub fn new(informer: SharedInformer<K>, config: ControllerConfig) -> Self {
        let queue_config = QueueConfig {
            name: config.name.clone(),
            metrics: config.metrics.clone(),
        };
        let queue = match &config.rate_limiter {
            Some(limiter) => RateLimitingQueue::with_config(limiter.clone(), queue_config),
            None => RateLimitingQueue::with_config(default_controller_rate_limiter(), queue_config),
        };
        Self {
            informer,
            queue,
            config,
            stats: Arc::default(),
        }
    }

    /// The queue, to enqueue keys from other sources (a second informer, a
    /// timer, an external event).
    pub fn queue(&self) -> RateLimitingQueue<ObjectKey> {
        self.queue.clone()
    }

    /// The informer's cache.
    pub fn store(&self) -> Store<K> {
        self.informer.store()
    }

    /// A handle on the informer (e.g. to add handlers before [`run`](Self::run)).
    pub fn informer(&self) -> InformerHandle<K> {
        self.informer.handle()
    }

    /// What the workers have done so far.
    pub fn stats(&self) -> Arc<ControllerStats> {
        self.stats.clone()
    }

    /// Runs the informer and the workers until `cancel` fires, calling `sync`
    /// with each key taken from the queue.
    ///
    /// Workers start once the cache has synced. On cancellation the workers
    /// take no new key (keys still queued are left), the syncs running get up to
    /// the [shutdown timeout](ControllerConfig::shutdown_timeout) to finish
    /// (then they are dropped), and the informer stops; then `run` returns.
    ///
    /// # Errors
    ///
    /// [`Error::Forbidden`] (or another permanent error) when the informer's
    /// first list fails in a way retrying cannot fix, such as missing RBAC
    /// permissions, and still fails after the
    /// [startup grace](ControllerConfig::startup_grace): the controller would
    /// otherwise wait for a sync that never comes.
    pub async fn run<F, Fut, E>(self, cancel: CancellationToken, sync: F) -> Result<(), Error>
    where
        F: Fn(ObjectKey) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let Self {
            informer,
            queue,
            config,
            stats,
        } = self;
        let name = config.name.clone();
        let enqueue = queue.clone();
        let registration = informer.add_handler(key_handler::<K, _>(move |key| enqueue.add(key)));
        let informer = informer.spawn(cancel.clone());

        let synced = tokio::select! {
            () = cancel.cancelled() => Ok(false),
            result = first_sync(&informer, &config) => result.map(|()| true),
        };
        let synced = match synced {
            Ok(synced) => synced,
            Err(err) => {
                error!(controller = %name, error = %err, "cache cannot sync; stopping");
                queue.shutdown();
                informer.stop().await;
                return Err(err);
            }
        };

        let mut workers = tokio::task::JoinSet::new();
        // The handler has its initial keys queued soon after the cache syncs, unless the
        // informer stops first: cancellation must end this wait too.
        let handler_synced = synced
            && tokio::select! {
                biased;
                () = cancel.cancelled() => false,
                () = registration.wait_synced() => true,
            };
        if handler_synced {
            info!(controller = %name, workers = config.workers, objects = informer.store().len(), "cache synced; starting workers");
            let sync = Arc::new(sync);
            for worker in 0..config.workers {
                workers.spawn(run_worker(
                    worker,
                    queue.clone(),
                    sync.clone(),
                    config.clone(),
                    stats.clone(),
                    cancel.clone(),
                ));
            }
        }

        cancel.cancelled().await;
        debug!(controller = %name, "shutting down");
        queue.shutdown();
        // Workers take no new key now; the syncs running get until the deadline.
        let dropped = join_within(&mut workers, config.shutdown_timeout, |_| {}).await;
        if dropped > 0 {
            warn!(controller = %name, timeout = ?config.shutdown_timeout, running = dropped, "syncs still running at the shutdown deadline; dropped");
        }
        registration.remove();
        informer.stop().await;
        info!(controller = %name, "stopped");
        Ok(())
    }
}

/// Waits for the cache to sync; a permanent error fails it unless the cache still syncs
/// within the startup grace.
async fn first_sync<K: Resource + Send + Sync + 'static>(
    informer: &InformerHandle<K>,
    config: &ControllerConfig,
) -> Result<(), Error> {
    let Err(error) = informer.wait_synced_or_fatal().await else {
        return Ok(());
    };
    warn!(controller = %config.name, %error, grace = ?config.startup_grace, "first sync failed; retrying within the startup grace");
    tokio::time::timeout(config.startup_grace, informer.wait_synced())
        .await
        .map_err(|_| error)
}
