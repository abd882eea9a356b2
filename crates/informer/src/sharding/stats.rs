//! What a replica's ring has done: counters for logs, tests and metrics.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use super::lock;

/// What a replica's ring has done, for logs, tests and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RingStats {
    /// Live members this replica sees, itself included.
    pub members: usize,
    /// Slots dealt to this replica.
    pub assigned: usize,
    /// Slots this replica holds.
    pub held: usize,
    /// Slots this replica took.
    pub taken: u64,
    /// Slots this replica let go of, after their reconciles finished.
    pub released: u64,
    /// Slots this replica stopped reconciling without letting go: its renewals failed
    /// past the renew deadline, or another replica held the slot.
    pub lost: u64,
    /// How long the last slot it took waited, from the membership change this replica saw
    /// that dealt it the slot (its own joining counts) until it held the slot.
    pub last_handover: Option<Duration>,
}

/// The counters behind [`RingStats`], and the handover times for a histogram.
#[derive(Debug)]
pub(super) struct Counters {
    pub(super) taken: AtomicU64,
    pub(super) released: AtomicU64,
    pub(super) lost: AtomicU64,
    /// When this replica last saw the live members change.
    pub(super) membership_changed: Mutex<Option<Instant>>,
    pub(super) last_handover: Mutex<Option<Duration>>,
    #[cfg(feature = "prometheus")]
    pub(super) handover_seconds: prometheus_client::metrics::histogram::Histogram,
}

#[cfg(feature = "prometheus")]
fn handover_histogram() -> prometheus_client::metrics::histogram::Histogram {
    prometheus_client::metrics::histogram::Histogram::new(
        prometheus_client::metrics::histogram::exponential_buckets(0.05, 2.0, 12),
    )
}

impl Counters {
    pub(super) fn new() -> Self {
        Self {
            taken: AtomicU64::new(0),
            released: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            membership_changed: Mutex::new(None),
            last_handover: Mutex::new(None),
            #[cfg(feature = "prometheus")]
            handover_seconds: handover_histogram(),
        }
    }

    pub(super) fn took(&self) {
        self.taken.fetch_add(1, Ordering::Relaxed);
        let Some(since) = *lock(&self.membership_changed) else {
            return;
        };
        let waited = since.elapsed();
        *lock(&self.last_handover) = Some(waited);
        #[cfg(feature = "prometheus")]
        self.handover_seconds.observe(waited.as_secs_f64());
    }
}
