//! A histogram of durations kept in atomics, read as a Prometheus histogram's cumulative
//! buckets: how long each handler took over its events, and how long the processor took
//! to apply each watch event to the store and hand it to the handlers.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

/// Upper bounds (seconds) of the buckets: 10 µs to about 10 s.
pub(super) const BUCKETS: [f64; 11] = [
    1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 1e-1, 1.0, 10.0,
];

/// How long an informer's processor took over each watch event: applying it to the store
/// and handing it to every handler's buffer (client-go's
/// `informer_processing_latency_seconds`), from
/// [`InformerHandle::processing_stats`](crate::InformerHandle::processing_stats).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct ProcessingStats {
    /// Watch events processed.
    pub events: u64,
    /// The time spent over them.
    pub total: Duration,
    /// Events processed within each bound (seconds), cumulative, as a Prometheus
    /// histogram's buckets.
    pub buckets: Vec<(f64, u64)>,
}

/// Durations recorded from any thread.
#[derive(Debug, Default)]
pub(super) struct Latency {
    count: AtomicU64,
    nanos: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
}

impl Latency {
    pub(super) fn record(&self, took: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        let seconds = took.as_secs_f64();
        if let Some(bucket) = BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many were recorded.
    pub(super) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Their sum.
    pub(super) fn total(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// What it holds, as [`ProcessingStats`].
    pub(super) fn processing_stats(&self) -> ProcessingStats {
        ProcessingStats {
            events: self.count(),
            total: self.total(),
            buckets: self.cumulative_buckets(),
        }
    }

    /// Each bucket's bound and the durations within it, cumulative.
    pub(super) fn cumulative_buckets(&self) -> Vec<(f64, u64)> {
        let mut cumulative = 0;
        BUCKETS
            .iter()
            .zip(&self.buckets)
            .map(|(bound, count)| {
                cumulative += count.load(Ordering::Relaxed);
                (*bound, cumulative)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_the_slowest_counts_in_none() {
        let latency = Latency::default();
        latency.record(Duration::from_micros(5));
        latency.record(Duration::from_millis(3));
        latency.record(Duration::from_secs(60));
        let buckets = latency.cumulative_buckets();
        assert_eq!(buckets.first(), Some(&(1e-5, 1)));
        assert_eq!(buckets.iter().find(|(b, _)| *b == 5e-3), Some(&(5e-3, 2)));
        assert_eq!(buckets.last(), Some(&(10.0, 2)));
        assert_eq!(latency.count(), 3);
        assert!(latency.total() > Duration::from_secs(60));
    }
}
