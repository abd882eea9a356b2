//! A delaying queue whose retries are paced by a [`RateLimiter`].

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use super::{
    config::QueueConfig, delaying::DelayingQueue, queue::DoneGuard, rate_limiter::RateLimiter,
};

/// A [`DelayingQueue`] plus a [`RateLimiter`]: client-go's `TypedRateLimitingInterface`,
/// the queue controllers use.
///
/// Cloning is cheap and every clone is the same queue, sharing one limiter.
///
/// # Example
///
/// The controller pattern: retry a failing key with backoff, give up after 5 retries,
/// forget a key once it succeeds.
///
/// ```
/// use kube_informer::workqueue::{RateLimitingQueue, default_controller_rate_limiter};
///
/// # async fn reconcile(_key: &str) -> Result<(), String> { Err("not yet".into()) }
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let queue = RateLimitingQueue::new(default_controller_rate_limiter());
/// queue.add("default/web".to_string());
///
/// let mut attempts = 0;
/// while let Some(key) = queue.get().await {
///     attempts += 1;
///     match reconcile(&key).await {
///         Ok(()) => queue.forget(&key),
///         Err(_) if queue.num_requeues(&key) < 5 => queue.add_rate_limited(key.clone()),
///         Err(_) => {
///             queue.forget(&key); // dropped: report it
///             queue.shutdown(); // just to end this example
///         }
///     }
///     queue.done(&key);
/// }
/// assert_eq!(attempts, 6);
/// # }
/// ```
pub struct RateLimitingQueue<T> {
    queue: DelayingQueue<T>,
    limiter: Arc<dyn RateLimiter<T>>,
}

impl<T> RateLimitingQueue<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// An unnamed queue without metrics, paced by `limiter`.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, which must run the timer task.
    pub fn new(limiter: impl RateLimiter<T> + 'static) -> Self {
        Self::with_config(limiter, QueueConfig::default())
    }

    /// A queue paced by `limiter`, named and instrumented as `config` says.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, which must run the timer task.
    pub fn with_config(limiter: impl RateLimiter<T> + 'static, config: QueueConfig) -> Self {
        Self {
            queue: DelayingQueue::with_config(config),
            limiter: Arc::new(limiter),
        }
    }

    /// Adds `item` after the delay the limiter gives it, counting one more retry of it.
    pub fn add_rate_limited(&self, item: T) {
        let delay = self.limiter.when(&item);
        self.queue.add_after(item, delay);
    }

    /// Tells the limiter to stop tracking `item`, typically once it was processed
    /// successfully. The item stays in the queue if it is there.
    pub fn forget(&self, item: &T) {
        self.limiter.forget(item);
    }

    /// How many times `item` was rate-limited since it was last forgotten.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.limiter.num_requeues(item)
    }

    /// See [`DelayingQueue::add_after`].
    pub fn add_after(&self, item: T, delay: Duration) {
        self.queue.add_after(item, delay);
    }

    /// See [`Queue::name`](super::Queue::name).
    pub fn name(&self) -> &str {
        self.queue.name()
    }

    /// See [`Queue::add`](super::Queue::add).
    pub fn add(&self, item: T) {
        self.queue.add(item);
    }

    /// See [`Queue::add_with_priority`](super::Queue::add_with_priority).
    pub fn add_with_priority(&self, item: T, priority: super::Priority) {
        self.queue.add_with_priority(item, priority);
    }

    /// See [`Queue::get`](super::Queue::get).
    pub async fn get(&self) -> Option<T> {
        self.queue.get().await
    }

    /// See [`Queue::get_guarded`](super::Queue::get_guarded).
    pub async fn get_guarded(&self) -> Option<DoneGuard<T>> {
        self.queue.get_guarded().await
    }

    /// See [`Queue::done`](super::Queue::done).
    pub fn done(&self, item: &T) {
        self.queue.done(item);
    }

    /// See [`DelayingQueue::items`].
    pub(crate) fn items(&self) -> Vec<T> {
        self.queue.items()
    }

    /// See [`DelayingQueue::len`].
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// See [`DelayingQueue::is_empty`].
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// See [`DelayingQueue::shutdown`].
    pub fn shutdown(&self) {
        self.queue.shutdown();
    }

    /// See [`DelayingQueue::shutdown_with_drain`].
    pub async fn shutdown_with_drain(&self) {
        self.queue.shutdown_with_drain().await;
    }

    /// See [`Queue::is_shutting_down`](super::Queue::is_shutting_down).
    pub fn is_shutting_down(&self) -> bool {
        self.queue.is_shutting_down()
    }
}

impl<T> Clone for RateLimitingQueue<T> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<T> fmt::Debug for RateLimitingQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitingQueue")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;
    use crate::workqueue::rate_limiter::item_exponential_failure::ItemExponentialFailure;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn retries_wait_as_the_limiter_says() {
        let queue = RateLimitingQueue::new(ItemExponentialFailure::new(10 * MS, Duration::MAX));
        let start = Instant::now();
        let mut ready_at = Vec::new();
        queue.add("a");
        for _ in 0..4 {
            let item = queue.get().await.unwrap();
            ready_at.push(start.elapsed());
            queue.add_rate_limited(item);
            queue.done(&item);
        }
        assert_eq!(queue.num_requeues(&"a"), 4);
        // Added at 0, then retried after 10, 20 and 40 ms: ready at 0, 10, 30, 70 ms.
        for (got, want) in ready_at.into_iter().zip([0, 10, 30, 70]) {
            assert!(
                got >= want * MS && got <= want * MS + 2 * MS,
                "{got:?} vs {want} ms"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn forget_resets_the_backoff() {
        let queue = RateLimitingQueue::new(ItemExponentialFailure::new(10 * MS, Duration::MAX));
        queue.add_rate_limited(1);
        queue.add_rate_limited(1);
        assert_eq!(queue.num_requeues(&1), 2);
        queue.forget(&1);
        assert_eq!(queue.num_requeues(&1), 0);
        let start = Instant::now();
        assert_eq!(queue.get().await, Some(1));
        // The first add was at 10 ms, and the second (20 ms) could not postpone it.
        assert!(start.elapsed() <= 11 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ignores_rate_limited_adds() {
        let queue = RateLimitingQueue::new(ItemExponentialFailure::new(MS, MS));
        queue.shutdown();
        queue.add_rate_limited(1);
        assert_eq!(queue.get().await, None);
    }
}
