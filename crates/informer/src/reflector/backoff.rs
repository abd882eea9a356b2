//! Exponential backoff with jitter and reset after a healthy period (client-go's
//! `ExponentialBackoffManager`, as the reflector configures it).
//! The full documentation is on [`Backoff`].

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

/// Parameters of a [`Backoff`]: client-go's reflector backoff by default, each setting
/// changed by the method of its name.
///
/// ```
/// use std::time::Duration;
/// use kube_informer::reflector::{Backoff, BackoffConfig};
///
/// let config = BackoffConfig::default().initial(Duration::from_millis(100)).jitter(0.0);
/// let mut backoff = Backoff::new(config);
/// assert_eq!(backoff.next_delay(), Duration::from_millis(100));
/// assert_eq!(backoff.next_delay(), Duration::from_millis(200));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct BackoffConfig {
    pub(crate) initial: Duration,
    pub(crate) max: Duration,
    pub(crate) factor: f64,
    pub(crate) jitter: f64,
    pub(crate) reset_after: Duration,
}

impl BackoffConfig {
    /// The first delay (800 ms).
    #[must_use]
    pub fn initial(mut self, delay: Duration) -> Self {
        self.initial = delay;
        self
    }

    /// The largest delay (30 s).
    #[must_use]
    pub fn max(mut self, delay: Duration) -> Self {
        self.max = delay;
        self
    }

    /// The growth factor between consecutive delays (2; less than 1 counts as 1).
    #[must_use]
    pub fn factor(mut self, factor: f64) -> Self {
        self.factor = factor;
        self
    }

    /// The fraction of each delay removed at random, in `[0, 1]` (0.25; outside values
    /// are clamped).
    #[must_use]
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// A healthy period this long starts the sequence again (2 min).
    #[must_use]
    pub fn reset_after(mut self, period: Duration) -> Self {
        self.reset_after = period;
        self
    }
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(800),
            max: Duration::from_secs(30),
            factor: 2.0,
            jitter: 0.25,
            reset_after: Duration::from_secs(120),
        }
    }
}

/// Stateful exponential backoff.
///
/// ```
/// use std::time::Duration;
/// use kube_informer::reflector::{Backoff, BackoffConfig};
///
/// let mut backoff = Backoff::new(BackoffConfig::default().jitter(0.0));
/// let now = tokio::time::Instant::now();
/// assert_eq!(backoff.next_delay_at(now), Duration::from_millis(800));
/// assert_eq!(backoff.next_delay_at(now), Duration::from_millis(1600));
/// ```
///
/// Exponential backoff with jitter and reset after a healthy period (client-go's
/// `ExponentialBackoffManager`, as the reflector configures it).
///
/// Delays start at 800 ms and double up to 30 s. Each delay is jittered *downwards*, into
/// `[base × (1 − jitter), base]`, so that 30 s stays a true cap while many clients that
/// failed together (an API server restart) still spread their retries. Once
/// `reset_after` (2 min) has passed since the end of the last delay without another
/// failure, the sequence starts again at 800 ms.
#[derive(Clone, Debug)]
pub struct Backoff {
    config: BackoffConfig,
    next_base: Duration,
    last_end: Option<Instant>,
}

impl Backoff {
    /// A backoff at the start of its sequence.
    pub fn new(config: BackoffConfig) -> Self {
        Self {
            next_base: config.initial,
            config,
            last_end: None,
        }
    }

    /// The next delay, counted from now.
    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_at(Instant::now())
    }

    /// The next delay for a failure at `now`.
    pub fn next_delay_at(&mut self, now: Instant) -> Duration {
        if self
            .last_end
            .is_some_and(|end| now >= end + self.config.reset_after)
        {
            self.reset();
        }
        let base = self.next_base.min(self.config.max);
        self.next_base = base
            .mul_f64(self.config.factor.max(1.0))
            .min(self.config.max);
        let jitter = self.config.jitter.clamp(0.0, 1.0);
        let delay = if jitter > 0.0 {
            base.mul_f64(1.0 - jitter * rand::rng().random::<f64>())
        } else {
            base
        };
        self.last_end = Some(now + delay);
        delay
    }

    /// Starts the sequence again at the initial delay.
    pub fn reset(&mut self) {
        self.next_base = self.config.initial;
        self.last_end = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_doubles_caps_and_jitters_within_bounds() {
        let config = BackoffConfig::default();
        let mut backoff = Backoff::new(config.clone());
        let now = Instant::now();
        let bases_ms = [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000, 30000];
        for base in bases_ms {
            let base = Duration::from_millis(base);
            let d = backoff.next_delay_at(now);
            assert!(d <= base, "{d:?} > {base:?}");
            assert!(
                d >= base.mul_f64(1.0 - config.jitter),
                "{d:?} too short for {base:?}"
            );
        }
        let mut exact = Backoff::new(config.jitter(0.0));
        let seq: Vec<_> = (0..8)
            .map(|_| exact.next_delay_at(now).as_millis())
            .collect();
        assert_eq!(seq, [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
    }

    #[test]
    fn resets_after_two_minutes_of_health() {
        let mut backoff = Backoff::new(BackoffConfig::default().jitter(0.0));
        let t0 = Instant::now();
        assert_eq!(backoff.next_delay_at(t0), Duration::from_millis(800));
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(backoff.next_delay_at(t1), Duration::from_millis(1600));
        // healthy for just under 2 min after the last delay ended: no reset
        let t2 = t1 + Duration::from_millis(1600) + Duration::from_secs(119);
        assert_eq!(backoff.next_delay_at(t2), Duration::from_millis(3200));
        // healthy for 2 min: back to the start
        let t3 = t2 + Duration::from_millis(3200) + Duration::from_secs(120);
        assert_eq!(backoff.next_delay_at(t3), Duration::from_millis(800));
    }
}
