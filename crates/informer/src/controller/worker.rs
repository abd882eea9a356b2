//! The workers: take a key, call the sync function, apply the error rule.

use std::{
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
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::config::ControllerConfig;
use crate::{error::panic_message, key::ObjectKey, workqueue::RateLimitingQueue};

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

    pub(super) fn record_synced(&self) {
        self.synced.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn record_failed(&self, panicked: bool) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        if panicked {
            self.panicked.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) fn record_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// The next key to work on, or `None` once the queue is shut down or `cancel` fired: no
/// new key is taken once cancelled, even with keys still queued.
pub(super) async fn next_key(
    queue: &RateLimitingQueue<ObjectKey>,
    cancel: &CancellationToken,
) -> Option<ObjectKey> {
    tokio::select! {
        biased;
        () = cancel.cancelled() => None,
        key = queue.get() => key,
    }
}

/// Waits up to `timeout` for every task in `tasks` to end, handing each result to `ended`;
/// then aborts those still running. Returns how many were aborted.
pub(crate) async fn join_within<T: 'static>(
    tasks: &mut JoinSet<T>,
    timeout: Duration,
    mut ended: impl FnMut(Result<T, JoinError>),
) -> usize {
    let all = async {
        while let Some(done) = tasks.join_next().await {
            ended(done);
        }
    };
    if tokio::time::timeout(timeout, all).await.is_ok() {
        return 0;
    }
    let aborted = tasks.len();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    aborted
}

pub(super) async fn run_worker<F, Fut, E>(
    worker: usize,
    queue: RateLimitingQueue<ObjectKey>,
    sync: Arc<F>,
    config: ControllerConfig,
    stats: Arc<ControllerStats>,
    cancel: CancellationToken,
) where
    F: Fn(ObjectKey) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    while let Some(key) = next_key(&queue, &cancel).await {
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
