//! Hooks through which a queue reports what it does to a metrics backend.
//!
//! A queue reports to a [`MetricsProvider`] only when it is given one *and* has a non-empty
//! name (client-go does the same: unnamed queues are invisible). Without a provider a queue
//! does not even read the clock, so metrics cost nothing when unused.
//!
//! The events mirror client-go's `workqueue` metrics:
//!
//! | event | client-go metric it feeds |
//! |---|---|
//! | [`QueueMetrics::added`] | `workqueue_adds_total`, `workqueue_depth` + 1 |
//! | [`QueueMetrics::started`] | `workqueue_depth` - 1, `workqueue_queue_duration_seconds` |
//! | [`QueueMetrics::finished`] | `workqueue_work_duration_seconds` |
//! | [`QueueMetrics::retried`] | `workqueue_retries_total` |
//! | [`InFlightProbe::snapshot`] | `workqueue_unfinished_work_seconds`, `workqueue_longest_running_processor_seconds` |
//!
//! The two in-flight gauges are not pushed by the queue: client-go refreshes them every
//! 500 ms from a background goroutine, which costs a timer per queue and reports values up to
//! half a second old. Here a provider computes them when it is scraped, through the
//! [`InFlightProbe`] it receives for each queue, so they are exact and free between scrapes.
//! `PrometheusMetrics` does exactly that.

use std::fmt;
use std::sync::Weak;
use std::time::Duration;

/// Creates the metric handles of each named queue.
///
/// Implement it to feed queue metrics into a backend of your choice; with the `prometheus`
/// feature, `PrometheusMetrics` is ready-made.
pub trait MetricsProvider: Send + Sync {
    /// Returns the handle through which the queue called `name` reports its events.
    ///
    /// `in_flight` reads the queue's in-flight work on demand; keep it to serve the
    /// unfinished-work and longest-running-processor gauges. It stops answering once the
    /// queue is dropped.
    fn queue_metrics(&self, name: &str, in_flight: InFlightProbe) -> Box<dyn QueueMetrics>;
}

/// The events of one queue, as reported to a [`MetricsProvider`].
///
/// The queue calls these outside its lock, so a slow backend delays only the caller.
pub trait QueueMetrics: Send + Sync {
    /// An item became pending: it was not waiting before (duplicates are not reported).
    fn added(&self);

    /// A worker took an item that had been pending for `queued`.
    fn started(&self, queued: Duration);

    /// A worker marked an item done after processing it for `worked`.
    fn finished(&self, worked: Duration);

    /// An item was scheduled with a delay (`add_after`, and so every rate-limited add).
    fn retried(&self);
}

/// The work that a queue's workers hold at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InFlightSnapshot {
    /// The time spent so far on every item being processed, summed.
    pub unfinished_work: Duration,
    /// How long the item processed the longest has been processed so far.
    pub longest_running: Duration,
}

/// Reads the in-flight work of one queue on demand, without keeping the queue alive.
pub struct InFlightProbe {
    source: Weak<dyn InFlightSource>,
}

impl InFlightProbe {
    pub(crate) fn new(source: Weak<dyn InFlightSource>) -> Self {
        Self { source }
    }

    /// The queue's in-flight work now, or `None` once the queue has been dropped.
    pub fn snapshot(&self) -> Option<InFlightSnapshot> {
        self.source.upgrade().map(|source| source.in_flight())
    }

    /// Whether the queue has been dropped, after which the probe can be discarded.
    pub fn is_closed(&self) -> bool {
        self.source.strong_count() == 0
    }
}

impl fmt::Debug for InFlightProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightProbe")
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Implemented by the queue so that a probe can read it without naming its item type.
pub(crate) trait InFlightSource: Send + Sync {
    fn in_flight(&self) -> InFlightSnapshot;
}
