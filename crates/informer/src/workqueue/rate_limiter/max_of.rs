//! The longest delay of several limiters.

use std::fmt;
use std::time::Duration;

use super::RateLimiter;

/// Asks every limiter and waits the longest of their delays: client-go's
/// `TypedMaxOfRateLimiter`.
///
/// Every limiter sees every call, so each keeps its own count.
///
/// ```
/// use std::time::Duration;
/// use kube_informer::workqueue::{ItemExponentialFailure, ItemFastSlow, MaxOf, RateLimiter};
///
/// let ms = Duration::from_millis(1);
/// let limiter = MaxOf::new(vec![
///     Box::new(ItemExponentialFailure::new(ms, Duration::from_secs(1))),
///     Box::new(ItemFastSlow::new(3 * ms, Duration::from_secs(1), 2)),
/// ]);
/// assert_eq!(limiter.when(&"a"), 3 * ms); // max(1 ms, 3 ms)
/// assert_eq!(limiter.when(&"a"), 3 * ms); // max(2 ms, 3 ms)
/// assert_eq!(limiter.when(&"a"), Duration::from_secs(1)); // max(4 ms, 1 s)
/// ```
pub struct MaxOf<T> {
    limiters: Vec<Box<dyn RateLimiter<T>>>,
}

impl<T> MaxOf<T> {
    /// Combines `limiters`; with none, every delay is zero.
    pub fn new(limiters: Vec<Box<dyn RateLimiter<T>>>) -> Self {
        Self { limiters }
    }
}

impl<T> RateLimiter<T> for MaxOf<T> {
    fn when(&self, item: &T) -> Duration {
        // No short-circuit: every limiter must count this retry.
        self.limiters
            .iter()
            .map(|limiter| limiter.when(item))
            .max()
            .unwrap_or_default()
    }

    fn forget(&self, item: &T) {
        for limiter in &self.limiters {
            limiter.forget(item);
        }
    }

    /// The highest count of any limiter.
    fn num_requeues(&self, item: &T) -> u32 {
        self.limiters
            .iter()
            .map(|limiter| limiter.num_requeues(item))
            .max()
            .unwrap_or(0)
    }
}

impl<T> fmt::Debug for MaxOf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaxOf")
            .field("limiters", &self.limiters.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workqueue::rate_limiter::{
        bucket::Bucket, item_exponential_failure::ItemExponentialFailure,
        item_fast_slow::ItemFastSlow,
    };

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn picks_the_longest_delay() {
        let limiter = MaxOf::new(vec![
            Box::new(ItemExponentialFailure::new(MS, Duration::from_secs(1))),
            Box::new(ItemFastSlow::new(5 * MS, 100 * MS, 2)),
            Box::new(Bucket::new(1000.0, 4)),
        ]);
        // exponential: 1 2 4 8 16 32 64 128; fast-slow: 5 5 then 100; bucket: 0 0 0 0 1 2 3 4
        let expected = [5, 5, 100, 100, 100, 100, 100, 128];
        for (n, ms) in expected.into_iter().enumerate() {
            assert_eq!(limiter.when(&"a"), ms * MS, "retry {n}");
        }
        assert_eq!(limiter.num_requeues(&"a"), 8);
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(limiter.when(&"a"), 5 * MS);
    }

    #[test]
    fn empty_never_waits() {
        let limiter = MaxOf::<u8>::new(Vec::new());
        assert_eq!(limiter.when(&1), Duration::ZERO);
        assert_eq!(limiter.num_requeues(&1), 0);
    }
}
