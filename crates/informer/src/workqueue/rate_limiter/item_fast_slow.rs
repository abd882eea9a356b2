//! A short delay for the first few retries, then a long one.

use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use super::failures::Failures;

use super::RateLimiter;

/// Waits `fast` for the first `max_fast_attempts` retries of an item and `slow` after that:
/// client-go's `TypedItemFastSlowRateLimiter`.
///
/// ```
/// use std::time::Duration;
/// use kube_informer::workqueue::{ItemFastSlow, RateLimiter};
///
/// let (fast, slow) = (Duration::from_millis(5), Duration::from_secs(10));
/// let limiter = ItemFastSlow::new(fast, slow, 2);
/// assert_eq!(limiter.when(&"a"), fast);
/// assert_eq!(limiter.when(&"a"), fast);
/// assert_eq!(limiter.when(&"a"), slow);
/// ```
pub struct ItemFastSlow<T> {
    fast: Duration,
    slow: Duration,
    max_fast_attempts: u32,
    attempts: Failures<T>,
}

impl<T: Eq + Hash> ItemFastSlow<T> {
    /// `fast` for the first `max_fast_attempts` retries of each item, `slow` afterwards.
    pub fn new(fast: Duration, slow: Duration, max_fast_attempts: u32) -> Self {
        Self {
            fast,
            slow,
            max_fast_attempts,
            attempts: Failures::new(),
        }
    }
}

impl<T> RateLimiter<T> for ItemFastSlow<T>
where
    T: Clone + Eq + Hash + Send + Sync,
{
    fn when(&self, item: &T) -> Duration {
        let attempts = self.attempts.record(item).saturating_add(1);
        if attempts <= self.max_fast_attempts {
            self.fast
        } else {
            self.slow
        }
    }

    fn forget(&self, item: &T) {
        self.attempts.forget(item);
    }

    fn num_requeues(&self, item: &T) -> u32 {
        self.attempts.count(item)
    }
}

impl<T: Eq + Hash> fmt::Debug for ItemFastSlow<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ItemFastSlow")
            .field("fast", &self.fast)
            .field("slow", &self.slow)
            .field("max_fast_attempts", &self.max_fast_attempts)
            .field("tracked", &self.attempts.tracked())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: Duration = Duration::from_millis(5);
    const SLOW: Duration = Duration::from_secs(10);

    #[test]
    fn switches_to_slow_after_max_fast_attempts() {
        let limiter = ItemFastSlow::new(FAST, SLOW, 3);
        for n in 1..=3 {
            assert_eq!(limiter.when(&"a"), FAST, "attempt {n}");
        }
        for n in 4..=6 {
            assert_eq!(limiter.when(&"a"), SLOW, "attempt {n}");
        }
        assert_eq!(limiter.num_requeues(&"a"), 6);
        // Other items start fast.
        assert_eq!(limiter.when(&"b"), FAST);
    }

    #[test]
    fn forget_starts_over_fast() {
        let limiter = ItemFastSlow::new(FAST, SLOW, 1);
        assert_eq!(limiter.when(&"a"), FAST);
        assert_eq!(limiter.when(&"a"), SLOW);
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(limiter.when(&"a"), FAST);
    }

    #[test]
    fn zero_fast_attempts_is_always_slow() {
        let limiter = ItemFastSlow::new(FAST, SLOW, 0);
        assert_eq!(limiter.when(&"a"), SLOW);
    }
}
