//! [`ControllerConfig`]: a controller's name, workers, retry rule and queue.

use std::{fmt, sync::Arc, time::Duration};

use crate::{
    key::ObjectKey,
    workqueue::{MetricsProvider, RateLimiter},
};

/// Called with a key and its last error when the key is dropped after its
/// last allowed retry.
pub type DroppedHook = Arc<dyn Fn(&ObjectKey, &str) + Send + Sync>;

/// How a [`Controller`](crate::Controller) runs: its name, workers, retry rule and queue.
#[derive(Clone)]
pub struct ControllerConfig {
    pub(super) name: String,
    pub(super) workers: usize,
    pub(super) max_requeues: Option<u32>,
    pub(super) rate_limiter: Option<Arc<dyn RateLimiter<ObjectKey>>>,
    pub(super) metrics: Option<Arc<dyn MetricsProvider>>,
    pub(super) on_dropped: Option<DroppedHook>,
    pub(super) startup_grace: Duration,
    pub(super) shutdown_timeout: Duration,
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
            shutdown_timeout: Duration::from_secs(30),
        }
    }

    /// How long [`Controller::run`](crate::Controller::run), once cancelled, waits for the
    /// syncs running to finish before dropping them (default 30 s).
    #[must_use]
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// How long the first sync may keep failing with an error that retrying cannot fix
    /// (403, 401, 404) before [`Controller::run`](crate::Controller::run) gives up with it (default 10 s). The grace
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
    /// [`default_controller_rate_limiter`](crate::workqueue::default_controller_rate_limiter)).
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
            .field("shutdown_timeout", &self.shutdown_timeout)
            .finish_non_exhaustive()
    }
}
