//! Per-item exponential backoff.

use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use super::failures::Failures;

use super::RateLimiter;

/// Waits `base * 2^n` before the `n`-th retry of an item (counting from 0), capped at `max`:
/// client-go's `ItemExponentialFailureRateLimiter`.
///
/// Each item backs off on its own; [`forget`](RateLimiter::forget) resets it.
///
/// ```
/// use std::time::Duration;
/// use kube_informer::workqueue::{ItemExponentialFailure, RateLimiter};
///
/// let limiter = ItemExponentialFailure::new(Duration::from_millis(5), Duration::from_millis(15));
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(5));
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(10));
/// assert_eq!(limiter.when(&"a"), Duration::from_millis(15)); // capped
/// assert_eq!(limiter.when(&"b"), Duration::from_millis(5)); // per item
/// ```
pub struct ItemExponentialFailure<T> {
    base: Duration,
    max: Duration,
    failures: Failures<T>,
}

impl<T: Eq + Hash> ItemExponentialFailure<T> {
    /// Starts at `base` and doubles per retry up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Failures::new(),
        }
    }

    fn backoff(&self, exponent: u32) -> Duration {
        // In nanoseconds as u128: base (< 2^94 ns) shifted by < 64 cannot overflow the shift,
        // and the multiplication saturates, so any failure count stays at `max`.
        if exponent >= 64 {
            return self.max;
        }
        let nanos = self.base.as_nanos().saturating_mul(1_u128 << exponent);
        if nanos >= self.max.as_nanos() {
            return self.max;
        }
        // Below `max`, which is a `Duration`, so it fits.
        let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
        Duration::new(secs, (nanos % 1_000_000_000) as u32)
    }
}

impl<T> RateLimiter<T> for ItemExponentialFailure<T>
where
    T: Clone + Eq + Hash + Send + Sync,
{
    fn when(&self, item: &T) -> Duration {
        self.backoff(self.failures.record(item))
    }

    fn forget(&self, item: &T) {
        self.failures.forget(item);
    }

    fn num_requeues(&self, item: &T) -> u32 {
        self.failures.count(item)
    }
}

impl<T: Eq + Hash> fmt::Debug for ItemExponentialFailure<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ItemExponentialFailure")
            .field("base", &self.base)
            .field("max", &self.max)
            .field("tracked", &self.failures.tracked())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_per_failure_up_to_max() {
        let limiter = ItemExponentialFailure::new(5 * MS, 1000 * MS);
        let expected = [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000];
        for (n, ms) in expected.into_iter().enumerate() {
            assert_eq!(limiter.num_requeues(&"a"), n as u32);
            assert_eq!(limiter.when(&"a"), ms * MS, "failure {n}");
        }
        assert_eq!(limiter.num_requeues(&"a"), 10);
    }

    #[test]
    fn items_back_off_independently() {
        let limiter = ItemExponentialFailure::new(MS, Duration::from_secs(1));
        assert_eq!(limiter.when(&1), MS);
        assert_eq!(limiter.when(&1), 2 * MS);
        assert_eq!(limiter.when(&2), MS);
        assert_eq!(limiter.num_requeues(&1), 2);
        assert_eq!(limiter.num_requeues(&2), 1);
    }

    #[test]
    fn forget_resets_the_item() {
        let limiter = ItemExponentialFailure::new(5 * MS, Duration::from_secs(1));
        limiter.when(&"a");
        limiter.when(&"a");
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(limiter.when(&"a"), 5 * MS);
    }

    #[test]
    fn huge_failure_counts_stay_at_max() {
        let max = Duration::from_secs(1000);
        let limiter = ItemExponentialFailure::new(5 * MS, max);
        for _ in 0..1000 {
            limiter.when(&"a");
        }
        assert_eq!(limiter.when(&"a"), max);
        assert_eq!(limiter.num_requeues(&"a"), 1001);
        // Exponents right at and beyond every width boundary.
        for exponent in [30, 31, 32, 62, 63, 64, 65, 127, 128, u32::MAX] {
            assert_eq!(limiter.backoff(exponent), max, "exponent {exponent}");
        }
        let huge = ItemExponentialFailure::<u8>::new(Duration::MAX, Duration::MAX);
        assert_eq!(huge.backoff(63), Duration::MAX);
    }

    #[test]
    fn failure_count_saturates() {
        let limiter = ItemExponentialFailure::new(MS, Duration::from_secs(1));
        limiter.failures.set("a", u32::MAX - 1);
        limiter.when(&"a");
        limiter.when(&"a");
        assert_eq!(limiter.num_requeues(&"a"), u32::MAX);
        assert_eq!(limiter.when(&"a"), Duration::from_secs(1));
    }
}
