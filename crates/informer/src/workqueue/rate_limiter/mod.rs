//! How long a failed item waits before it is retried.
//!
//! A [`RateLimiter`] answers [`when`](RateLimiter::when) an item may be processed again; the
//! [`RateLimitingQueue`](super::RateLimitingQueue) adds it after that delay. The limiters
//! are client-go's:
//!
//! * [`ItemExponentialFailure`]: per item, `base * 2^failures`, capped; protects the
//!   API server from one object that keeps failing.
//! * [`Bucket`]: a token bucket over all items; bounds the overall retry rate when many
//!   objects fail at once.
//! * [`MaxOf`]: the longest of several limiters' delays.
//! * [`ItemFastSlow`]: a short delay for the first attempts, a long one afterwards.
//!
//! [`default_controller_rate_limiter`] combines the first two the way client-go's
//! `DefaultTypedControllerRateLimiter` does.

pub(super) mod bucket;
mod failures;
pub(super) mod item_exponential_failure;
pub(super) mod item_fast_slow;
pub(super) mod max_of;

use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use bucket::Bucket;
use item_exponential_failure::ItemExponentialFailure;
use max_of::MaxOf;

/// Decides how long an item waits before it is retried: client-go's `TypedRateLimiter`.
pub trait RateLimiter<T>: Send + Sync {
    /// How long `item` should wait before it is processed again. Each call counts as one
    /// more retry of `item`.
    fn when(&self, item: &T) -> Duration;

    /// Stops tracking `item`, typically after it was processed successfully, so that its
    /// next failure starts from the shortest delay again.
    fn forget(&self, item: &T);

    /// How many times `item` has been retried since it was last forgotten.
    fn num_requeues(&self, item: &T) -> u32;
}

impl<T, R: RateLimiter<T> + ?Sized> RateLimiter<T> for Box<R> {
    fn when(&self, item: &T) -> Duration {
        (**self).when(item)
    }

    fn forget(&self, item: &T) {
        (**self).forget(item);
    }

    fn num_requeues(&self, item: &T) -> u32 {
        (**self).num_requeues(item)
    }
}

impl<T, R: RateLimiter<T> + ?Sized> RateLimiter<T> for Arc<R> {
    fn when(&self, item: &T) -> Duration {
        (**self).when(item)
    }

    fn forget(&self, item: &T) {
        (**self).forget(item);
    }

    fn num_requeues(&self, item: &T) -> u32 {
        (**self).num_requeues(item)
    }
}

/// The limiter client-go gives controllers by default: per item, exponential from 5 ms to
/// 1000 s; overall, 10 retries per second with bursts of 100; whichever is longer.
///
/// ```
/// use std::time::Duration;
/// use kube_informer::workqueue::{RateLimiter, default_controller_rate_limiter};
///
/// let limiter = default_controller_rate_limiter::<&str>();
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(5));
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(10));
/// assert_eq!(limiter.num_requeues(&"a"), 2);
/// ```
pub fn default_controller_rate_limiter<T>() -> MaxOf<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    MaxOf::new(vec![
        Box::new(ItemExponentialFailure::new(
            Duration::from_millis(5),
            Duration::from_secs(1000),
        )),
        Box::new(Bucket::new(10.0, 100)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn default_controller_limiter_one_item_backs_off_exponentially() {
        let limiter = default_controller_rate_limiter();
        let expected = [5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560];
        for ms in expected {
            assert_eq!(limiter.when(&"a"), ms * MS);
        }
        assert_eq!(limiter.num_requeues(&"a"), 10);
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(limiter.when(&"a"), 5 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn default_controller_limiter_many_items_hit_the_bucket_after_100() {
        let limiter = default_controller_rate_limiter();
        for i in 0..100 {
            assert_eq!(limiter.when(&i), 5 * MS, "item {i}");
        }
        // The burst is spent: each further retry waits one more 1/10 s slot.
        assert_eq!(limiter.when(&100), 100 * MS);
        assert_eq!(limiter.when(&101), 200 * MS);
        assert_eq!(limiter.when(&102), 300 * MS);
        // Time refills the bucket: a second later it has ten more tokens, three of which
        // were promised above.
        tokio::time::advance(Duration::from_secs(1)).await;
        for i in 103..110 {
            assert_eq!(limiter.when(&i), 5 * MS, "item {i}");
        }
        assert_eq!(limiter.when(&110), 100 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn boxed_and_shared_limiters_delegate() {
        let boxed: Box<dyn RateLimiter<u8>> = Box::new(default_controller_rate_limiter());
        let shared: Arc<dyn RateLimiter<u8>> = Arc::new(boxed);
        assert_eq!(shared.when(&1), 5 * MS);
        assert_eq!(shared.num_requeues(&1), 1);
        shared.forget(&1);
        assert_eq!(shared.num_requeues(&1), 0);
    }
}
