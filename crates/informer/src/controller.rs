//! The worker loop of a controller: an informer feeds object keys into a
//! rate-limited workqueue, and workers hand each key to your sync function.
//!
//! This is the shape of every client-go sample controller, packaged so a
//! controller author writes only the sync function:
//!
//! - adds, updates and deletes (tombstones included) become keys on a
//!   [`RateLimitingQueue`], so a burst of events for one object collapses to
//!   one sync, and no key is ever synced by two workers at once;
//! - the workers start once the informer's cache has synced, so the sync
//!   function can trust the [`Store`]: a key that is absent there means the
//!   object was deleted;
//! - the error rule of client-go's samples: a failed key goes back with
//!   [`add_rate_limited`](RateLimitingQueue::add_rate_limited) while it has
//!   been requeued fewer than `max_requeues` times, and is then forgotten and
//!   reported; a success calls [`forget`](RateLimitingQueue::forget);
//! - a panic in the sync function is caught and counted as a failure, so it
//!   never takes a worker down.
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::Pod;
//! use kube_client::{Api, Client};
//! use kube_informer::{
//!     ApiListWatch, SharedInformer,
//!     controller::{Controller, ControllerConfig},
//! };
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo(client: Client) -> Result<(), kube_informer::Error> {
//! let informer = SharedInformer::new(ApiListWatch::new(Api::<Pod>::namespaced(client, "default")));
//! let controller = Controller::new(informer, ControllerConfig::named("pods").workers(2));
//! let store = controller.store();
//! let cancel = CancellationToken::new();
//! controller
//!     .run(cancel, move |key| {
//!         let pod = store.get_by_key(&key);
//!         async move {
//!             match pod {
//!                 Some(pod) => tracing::info!(%key, phase = ?pod.status.as_ref().and_then(|s| s.phase.as_deref()), "synced"),
//!                 None => tracing::info!(%key, "deleted"),
//!             }
//!             Ok::<(), std::convert::Infallible>(())
//!         }
//!     })
//!     .await
//! # }
//! ```

use std::{
    any::Any,
    fmt,
    future::Future,
    panic::AssertUnwindSafe,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::FutureExt;
use kube_client::Resource;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::{
    Error, ObjectKey, SharedInformer, Store, key_handler,
    workqueue::{
        MetricsProvider, QueueConfig, RateLimiter, RateLimitingQueue,
        default_controller_rate_limiter,
    },
};

/// Called with a key and its last error when the key is dropped after its
/// last allowed retry.
pub type DroppedHook = Arc<dyn Fn(&ObjectKey, &str) + Send + Sync>;

/// How a [`Controller`] runs: its name, workers, retry rule and queue.
#[derive(Clone)]
pub struct ControllerConfig {
    name: String,
    workers: usize,
    max_requeues: Option<u32>,
    rate_limiter: Option<Arc<dyn RateLimiter<ObjectKey>>>,
    metrics: Option<Arc<dyn MetricsProvider>>,
    on_dropped: Option<DroppedHook>,
    startup_grace: Duration,
}

impl ControllerConfig {
    /// One worker, five requeues before a key is dropped, client-go's default
    /// controller rate limiter, no metrics. `name` labels the logs and the
    /// queue's metrics.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            workers: 1,
            max_requeues: Some(5),
            rate_limiter: None,
            metrics: None,
            on_dropped: None,
            startup_grace: Duration::from_secs(10),
        }
    }

    /// How long the first sync may keep failing with an error that retrying cannot fix
    /// (403, 401, 404) before [`Controller::run`] gives up with it (default 10 s). The grace
    /// covers permissions or CRDs applied moments before the controller starts, which the
    /// API server needs a moment to honour.
    #[must_use]
    pub fn startup_grace(mut self, grace: Duration) -> Self {
        self.startup_grace = grace;
        self
    }

    /// How many keys are synced concurrently (at least one).
    #[must_use]
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// How many times a failing key is requeued before it is dropped;
    /// `None` retries forever (for sync functions whose failures are
    /// outages that end, such as an unreachable backing store).
    #[must_use]
    pub fn max_requeues(mut self, max: Option<u32>) -> Self {
        self.max_requeues = max;
        self
    }

    /// The limiter that spaces retries (default:
    /// [`default_controller_rate_limiter`]).
    #[must_use]
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<ObjectKey> + 'static) -> Self {
        self.rate_limiter = Some(Arc::new(limiter));
        self
    }

    /// Reports the queue's metrics to `provider`.
    #[must_use]
    pub fn metrics(mut self, provider: impl MetricsProvider + 'static) -> Self {
        self.metrics = Some(Arc::new(provider));
        self
    }

    /// Calls `hook` when a key is dropped after its last retry, besides
    /// logging it.
    #[must_use]
    pub fn on_dropped(mut self, hook: impl Fn(&ObjectKey, &str) + Send + Sync + 'static) -> Self {
        self.on_dropped = Some(Arc::new(hook));
        self
    }
}

impl fmt::Debug for ControllerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerConfig")
            .field("name", &self.name)
            .field("workers", &self.workers)
            .field("max_requeues", &self.max_requeues)
            .field("metrics", &self.metrics.is_some())
            .field("startup_grace", &self.startup_grace)
            .finish_non_exhaustive()
    }
}

/// Counts of what a controller's workers did, readable while it runs.
#[derive(Debug, Default)]
pub struct ControllerStats {
    synced: AtomicU64,
    failed: AtomicU64,
    panicked: AtomicU64,
    dropped: AtomicU64,
}

impl ControllerStats {
    /// Syncs that succeeded.
    pub fn synced(&self) -> u64 {
        self.synced.load(Ordering::Relaxed)
    }

    /// Syncs that failed, panics included.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Syncs that panicked.
    pub fn panicked(&self) -> u64 {
        self.panicked.load(Ordering::Relaxed)
    }

    /// Keys dropped after their last retry.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// An informer wired to a rate-limited workqueue of object keys, and the
/// workers that drain it. See the [module docs](self).
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
    /// A controller over `informer`. The informer must not be running yet:
    /// [`run`](Self::run) starts it.
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

    /// The informer.
    pub fn informer(&self) -> &SharedInformer<K> {
        &self.informer
    }

    /// What the workers have done so far.
    pub fn stats(&self) -> Arc<ControllerStats> {
        self.stats.clone()
    }

    /// Waits for the cache to sync; a permanent error fails it unless the cache still syncs
    /// within the startup grace.
    async fn first_sync(&self) -> Result<(), Error> {
        let Err(error) = self.informer.wait_synced_or_fatal().await else {
            return Ok(());
        };
        warn!(controller = %self.config.name, %error, grace = ?self.config.startup_grace, "first sync failed; retrying within the startup grace");
        tokio::time::timeout(self.config.startup_grace, self.informer.wait_synced())
            .await
            .map_err(|_| error)
    }

    /// Runs the informer and the workers until `cancel` fires, calling `sync`
    /// with each key taken from the queue.
    ///
    /// Workers start once the cache has synced. On cancellation the queue
    /// shuts down, each worker finishes the key it holds, and the informer
    /// stops; then `run` returns.
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
        let name = self.config.name.clone();
        let queue = self.queue.clone();
        let registration = self
            .informer
            .add_handler(key_handler::<K, _>(move |key| queue.add(key)));
        let informer_task = tokio::spawn(self.informer.run(cancel.clone()));

        let synced = tokio::select! {
            () = cancel.cancelled() => Ok(false),
            result = self.first_sync() => result.map(|()| true),
        };
        let synced = match synced {
            Ok(synced) => synced,
            Err(err) => {
                error!(controller = %name, error = %err, "cache cannot sync; stopping");
                cancel.cancel();
                self.queue.shutdown();
                let _ = informer_task.await;
                return Err(err);
            }
        };

        let mut workers = Vec::new();
        if synced {
            registration.wait_synced().await;
            info!(controller = %name, workers = self.config.workers, objects = self.informer.store().len(), "cache synced; starting workers");
            let sync = Arc::new(sync);
            for worker in 0..self.config.workers {
                workers.push(tokio::spawn(run_worker(
                    worker,
                    self.queue.clone(),
                    sync.clone(),
                    self.config.clone(),
                    self.stats.clone(),
                )));
            }
        }

        cancel.cancelled().await;
        debug!(controller = %name, "shutting down");
        self.queue.shutdown();
        for worker in workers {
            let _ = worker.await;
        }
        registration.remove();
        let _ = informer_task.await;
        info!(controller = %name, "stopped");
        Ok(())
    }
}

async fn run_worker<F, Fut, E>(
    worker: usize,
    queue: RateLimitingQueue<ObjectKey>,
    sync: Arc<F>,
    config: ControllerConfig,
    stats: Arc<ControllerStats>,
) where
    F: Fn(ObjectKey) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    while let Some(key) = queue.get().await {
        // The sync function may panic while building its future or while it runs.
        let outcome = match std::panic::catch_unwind(AssertUnwindSafe(|| sync(key.clone()))) {
            Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
            Err(panic) => Err(panic),
        };
        match outcome {
            Ok(Ok(())) => {
                stats.synced.fetch_add(1, Ordering::Relaxed);
                queue.forget(&key);
            }
            Ok(Err(err)) => handle_failure(&queue, &config, &stats, &key, err.to_string()),
            Err(panic) => {
                stats.panicked.fetch_add(1, Ordering::Relaxed);
                let message = format!("sync panicked: {}", panic_message(&*panic));
                handle_failure(&queue, &config, &stats, &key, message);
            }
        }
        queue.done(&key);
    }
    debug!(controller = %config.name, worker, "worker stopped");
}

/// The error rule: requeue with the rate limit while retries remain, else
/// forget the key and report the drop.
fn handle_failure(
    queue: &RateLimitingQueue<ObjectKey>,
    config: &ControllerConfig,
    stats: &ControllerStats,
    key: &ObjectKey,
    error: String,
) {
    stats.failed.fetch_add(1, Ordering::Relaxed);
    let requeues = queue.num_requeues(key);
    match config.max_requeues {
        Some(max) if requeues >= max => {
            queue.forget(key);
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            error!(
                controller = %config.name,
                %key,
                %error,
                retries = requeues,
                "dropping key out of the queue after {max} retries"
            );
            if let Some(hook) = &config.on_dropped {
                hook(key, &error);
            }
        }
        _ => {
            warn!(controller = %config.name, %key, %error, retry = requeues + 1, "sync failed; requeued with backoff");
            queue.add_rate_limited(key.clone());
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string panic payload")
}
