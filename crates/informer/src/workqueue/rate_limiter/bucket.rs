//! An overall token bucket, on governor's GCRA.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use governor::Quota;
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use tokio::time::Instant;

use super::RateLimiter;

type Gcra = governor::RateLimiter<NotKeyed, InMemoryState, ReservationClock, NoOpMiddleware<Nanos>>;

/// A token bucket shared by all items: `burst` retries at once, then `qps` per second.
/// Client-go's `TypedBucketRateLimiter`.
///
/// Every [`when`](RateLimiter::when) takes a token, even one that is not there yet, and
/// returns how long until it is: as Go's `rate.Limiter.Reserve().Delay()`, so retries are
/// spread out at `1/qps` instead of all being told to come back at the same instant. Items
/// are not tracked: [`forget`](RateLimiter::forget) does nothing and
/// [`num_requeues`](RateLimiter::num_requeues) is always 0.
///
/// Time is tokio's, so paused time in tests drives the bucket too.
///
/// ```
/// use std::time::Duration;
/// use kube_informer::workqueue::{Bucket, RateLimiter};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let bucket = Bucket::new(10.0, 2);
/// assert_eq!(RateLimiter::<u8>::when(&bucket, &1), Duration::ZERO);
/// assert_eq!(RateLimiter::<u8>::when(&bucket, &2), Duration::ZERO);
/// assert_eq!(RateLimiter::<u8>::when(&bucket, &3), Duration::from_millis(100));
/// assert_eq!(RateLimiter::<u8>::when(&bucket, &4), Duration::from_millis(200));
/// # }
/// ```
pub struct Bucket {
    qps: f64,
    burst: u32,
    origin: Instant,
    /// The lock makes "set the clock, then take a token" one step.
    gcra: Mutex<Gcra>,
}

/// A clock that reads whatever instant the bucket sets before asking governor.
///
/// Governor only grants tokens that are available at its clock's "now". Taking a future
/// token is the same as asking at the instant that token becomes available, so the bucket
/// sets the clock to that instant, lets governor's GCRA account for it, and returns the
/// distance. The state stays governor's alone: there is no second bookkeeping to drift.
#[derive(Debug, Default)]
struct ReservationClock {
    /// Nanoseconds since [`Bucket::origin`].
    at: AtomicU64,
}

impl Clock for ReservationClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        self.at.load(Ordering::Relaxed).into()
    }
}

impl Bucket {
    /// A bucket holding `burst` tokens, refilled at `qps` tokens per second.
    ///
    /// # Panics
    ///
    /// If `qps` is not a positive, finite number of at most 10^9, or `burst` is 0.
    pub fn new(qps: f64, burst: u32) -> Self {
        assert!(
            qps.is_finite() && qps > 0.0 && qps <= 1e9,
            "qps must be positive and at most 1e9, got {qps}"
        );
        let burst_tokens = NonZeroU32::new(burst).expect("burst must be at least 1");
        let quota = Quota::with_period(Duration::from_secs_f64(1.0 / qps))
            .expect("a period of at least 1 ns")
            .allow_burst(burst_tokens);
        Self {
            qps,
            burst,
            origin: Instant::now(),
            gcra: Mutex::new(governor::RateLimiter::direct_with_clock(
                quota,
                ReservationClock::default(),
            )),
        }
    }

    /// Takes the next token and returns how long until it is available.
    fn reserve(&self) -> Duration {
        let elapsed = Instant::now().saturating_duration_since(self.origin);
        let now = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let gcra = self.gcra.lock().unwrap_or_else(PoisonError::into_inner);
        gcra.clock().at.store(now, Ordering::Relaxed);
        match gcra.check() {
            Ok(()) => Duration::ZERO,
            Err(not_until) => {
                let available = not_until.earliest_possible();
                gcra.clock().at.store(available.as_u64(), Ordering::Relaxed);
                let granted = gcra.check();
                debug_assert!(
                    granted.is_ok(),
                    "a token must be available when governor says"
                );
                Duration::from_nanos(available.as_u64().saturating_sub(now))
            }
        }
    }
}

impl<T> RateLimiter<T> for Bucket {
    fn when(&self, _item: &T) -> Duration {
        self.reserve()
    }

    fn forget(&self, _item: &T) {}

    fn num_requeues(&self, _item: &T) -> u32 {
        0
    }
}

impl fmt::Debug for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bucket")
            .field("qps", &self.qps)
            .field("burst", &self.burst)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn when(bucket: &Bucket) -> Duration {
        RateLimiter::<()>::when(bucket, &())
    }

    #[tokio::test(start_paused = true)]
    async fn burst_is_free_then_waits_grow_by_one_over_qps() {
        let bucket = Bucket::new(10.0, 100);
        for i in 0..100 {
            assert_eq!(when(&bucket), Duration::ZERO, "call {i}");
        }
        for n in 1..=20 {
            assert_eq!(when(&bucket), n * 100 * MS, "call {}", 100 + n);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn elapsed_time_refills_the_bucket() {
        let bucket = Bucket::new(10.0, 3);
        for _ in 0..3 {
            assert_eq!(when(&bucket), Duration::ZERO);
        }
        assert_eq!(when(&bucket), 100 * MS);
        assert_eq!(when(&bucket), 200 * MS);
        // 250 ms later: the two reserved slots are at 100 and 200 ms, so the next free
        // slot is at 300 ms, 50 ms from now.
        tokio::time::advance(250 * MS).await;
        assert_eq!(when(&bucket), 50 * MS);
        // Long idle: the bucket is full again, but never more than `burst`.
        tokio::time::advance(Duration::from_secs(60)).await;
        for _ in 0..3 {
            assert_eq!(when(&bucket), Duration::ZERO);
        }
        assert_eq!(when(&bucket), 100 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn burst_of_one_spaces_every_call() {
        let bucket = Bucket::new(2.0, 1);
        assert_eq!(when(&bucket), Duration::ZERO);
        assert_eq!(when(&bucket), 500 * MS);
        assert_eq!(when(&bucket), 1000 * MS);
    }

    #[test]
    fn does_not_track_items() {
        let bucket = Bucket::new(1.0, 1);
        RateLimiter::<u8>::when(&bucket, &1);
        assert_eq!(RateLimiter::<u8>::num_requeues(&bucket, &1), 0);
        RateLimiter::<u8>::forget(&bucket, &1);
    }

    #[test]
    #[should_panic(expected = "burst must be at least 1")]
    fn zero_burst_is_rejected() {
        Bucket::new(1.0, 0);
    }

    #[test]
    #[should_panic(expected = "qps must be positive")]
    fn zero_qps_is_rejected() {
        Bucket::new(0.0, 1);
    }
}
