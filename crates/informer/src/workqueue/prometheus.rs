//! Queue metrics in a `prometheus-client` registry, under client-go's names.
//!
//! [`PrometheusMetrics`] registers, each labelled with the queue's `name`:
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `workqueue_depth` | gauge | items waiting (added, not yet taken by a worker) |
//! | `workqueue_adds_total` | counter | items added (duplicates of waiting items excluded) |
//! | `workqueue_queue_duration_seconds` | histogram | time from add to a worker taking it |
//! | `workqueue_work_duration_seconds` | histogram | time from a worker taking it to `done` |
//! | `workqueue_unfinished_work_seconds` | gauge | processing time so far of items not yet done, summed |
//! | `workqueue_longest_running_processor_seconds` | gauge | processing time so far of the oldest item not yet done |
//! | `workqueue_retries_total` | counter | delayed adds (`add_after`, rate-limited adds) |
//!
//! The histograms use client-go's buckets (10 ns to 1000 s, times 10). The two in-flight
//! gauges are computed from the live queues when the registry is encoded, rather than every
//! 500 ms as client-go does; a dropped queue disappears from them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::metrics::{InFlightProbe, InFlightSnapshot, MetricsProvider, QueueMetrics};

/// A [`MetricsProvider`] that records client-go's `workqueue_*` metrics in a
/// `prometheus-client` [`Registry`].
///
/// Create one per registry and share it (it is cheap to clone) among all queues, which it
/// tells apart by their names.
///
/// ```
/// use kube_informer::workqueue::{PrometheusMetrics, Queue, QueueConfig};
/// use prometheus_client::{encoding::text::encode, registry::Registry};
///
/// let mut registry = Registry::default();
/// let metrics = PrometheusMetrics::new(&mut registry);
/// let queue = Queue::with_config(QueueConfig::named("pods").metrics(metrics));
/// queue.add("default/web");
///
/// let mut text = String::new();
/// encode(&mut text, &registry).unwrap();
/// assert!(text.contains(r#"workqueue_adds_total{name="pods"} 1"#));
/// ```
#[derive(Clone, Debug)]
pub struct PrometheusMetrics {
    depth: Family<QueueLabels, Gauge>,
    adds: Family<QueueLabels, Counter>,
    queue_duration: Family<QueueLabels, Histogram, fn() -> Histogram>,
    work_duration: Family<QueueLabels, Histogram, fn() -> Histogram>,
    retries: Family<QueueLabels, Counter>,
    in_flight: Arc<InFlightProbes>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct QueueLabels {
    name: String,
}

impl PrometheusMetrics {
    /// Registers the workqueue metrics in `registry` (with its prefix and labels, if any).
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(duration_histogram),
            work_duration: Family::new_with_constructor(duration_histogram),
            retries: Family::default(),
            in_flight: Arc::default(),
        };
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            metrics.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            metrics.adds.clone(),
        );
        registry.register_with_unit(
            "workqueue_queue_duration",
            "How long in seconds an item stays in workqueue before being requested",
            Unit::Seconds,
            metrics.queue_duration.clone(),
        );
        registry.register_with_unit(
            "workqueue_work_duration",
            "How long in seconds processing an item from workqueue takes",
            Unit::Seconds,
            metrics.work_duration.clone(),
        );
        registry.register_with_unit(
            "workqueue_unfinished_work",
            "How many seconds of work has been done that is in progress and hasn't been \
             observed by work_duration; large values indicate stuck workers",
            Unit::Seconds,
            InFlightGauge {
                probes: Arc::clone(&metrics.in_flight),
                reading: Reading::Unfinished,
            },
        );
        registry.register_with_unit(
            "workqueue_longest_running_processor",
            "How many seconds the longest running processor for workqueue has been running",
            Unit::Seconds,
            InFlightGauge {
                probes: Arc::clone(&metrics.in_flight),
                reading: Reading::Longest,
            },
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            metrics.retries.clone(),
        );
        metrics
    }
}

impl MetricsProvider for PrometheusMetrics {
    fn queue_metrics(&self, name: &str, in_flight: InFlightProbe) -> Box<dyn QueueMetrics> {
        let labels = QueueLabels {
            name: name.to_owned(),
        };
        self.in_flight.lock().push((labels.clone(), in_flight));
        // The handles share their atomics with the families, so the queue updates the
        // registry without going through the families' locks again.
        Box::new(PrometheusQueueMetrics {
            depth: self.depth.get_or_create_owned(&labels),
            adds: self.adds.get_or_create_owned(&labels),
            queue_duration: self.queue_duration.get_or_create_owned(&labels),
            work_duration: self.work_duration.get_or_create_owned(&labels),
            retries: self.retries.get_or_create_owned(&labels),
        })
    }
}

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-8, 10.0, 12))
}

struct PrometheusQueueMetrics {
    depth: Gauge,
    adds: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    retries: Counter,
}

impl QueueMetrics for PrometheusQueueMetrics {
    fn added(&self) {
        self.adds.inc();
        self.depth.inc();
    }

    fn started(&self, queued: Duration) {
        self.depth.dec();
        self.queue_duration.observe(queued.as_secs_f64());
    }

    fn finished(&self, worked: Duration) {
        self.work_duration.observe(worked.as_secs_f64());
    }

    fn retried(&self) {
        self.retries.inc();
    }
}

/// The probes of every queue created through one provider.
#[derive(Debug, Default)]
struct InFlightProbes(Mutex<Vec<(QueueLabels, InFlightProbe)>>);

impl InFlightProbes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(QueueLabels, InFlightProbe)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One snapshot per queue name: queues sharing a name share a series, as their
    /// counters do, so their in-flight work is summed and their longest runs maxed.
    fn snapshots(&self) -> BTreeMap<QueueLabels, InFlightSnapshot> {
        let mut probes = self.lock();
        probes.retain(|(_, probe)| !probe.is_closed());
        let mut by_name = BTreeMap::<QueueLabels, InFlightSnapshot>::new();
        for (labels, probe) in probes.iter() {
            let Some(snapshot) = probe.snapshot() else {
                continue;
            };
            let total = by_name.entry(labels.clone()).or_default();
            total.unfinished_work += snapshot.unfinished_work;
            total.longest_running = total.longest_running.max(snapshot.longest_running);
        }
        by_name
    }
}

#[derive(Debug, Clone, Copy)]
enum Reading {
    Unfinished,
    Longest,
}

/// A gauge family read from the queues when the registry is encoded.
#[derive(Debug)]
struct InFlightGauge {
    probes: Arc<InFlightProbes>,
    reading: Reading,
}

impl EncodeMetric for InFlightGauge {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), fmt::Error> {
        for (labels, snapshot) in self.probes.snapshots() {
            let seconds = match self.reading {
                Reading::Unfinished => snapshot.unfinished_work,
                Reading::Longest => snapshot.longest_running,
            }
            .as_secs_f64();
            encoder.encode_family(&labels)?.encode_gauge(&seconds)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;
    use crate::workqueue::{config::QueueConfig, delaying::DelayingQueue};

    const MS: Duration = Duration::from_millis(1);

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    fn sample<'a>(text: &'a str, series: &str) -> &'a str {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    #[tokio::test(start_paused = true)]
    async fn reports_client_go_metrics() {
        let mut registry = Registry::default();
        let metrics = PrometheusMetrics::new(&mut registry);
        let queue = DelayingQueue::with_config(QueueConfig::named("test").metrics(metrics));

        queue.add("a");
        queue.add("b");
        queue.add("a"); // a duplicate: neither an add nor depth
        tokio::time::advance(1000 * MS).await;
        let a = queue.get().await.unwrap(); // waited 1 s
        tokio::time::advance(500 * MS).await;
        let b = queue.get().await.unwrap(); // waited 1.5 s
        tokio::time::advance(2000 * MS).await;
        queue.done(&a); // worked 2.5 s
        queue.add_after("c", 250 * MS);

        let text = scrape(&registry);
        let name = r#"{name="test"}"#;
        assert_eq!(sample(&text, &format!("workqueue_adds_total{name}")), "2");
        assert_eq!(sample(&text, &format!("workqueue_depth{name}")), "0");
        assert_eq!(
            sample(&text, &format!("workqueue_retries_total{name}")),
            "1"
        );
        assert_eq!(
            sample(
                &text,
                &format!("workqueue_queue_duration_seconds_count{name}")
            ),
            "2"
        );
        assert_eq!(
            sample(
                &text,
                &format!("workqueue_queue_duration_seconds_sum{name}")
            ),
            "2.5"
        );
        assert_eq!(
            sample(
                &text,
                &format!("workqueue_work_duration_seconds_count{name}")
            ),
            "1"
        );
        assert_eq!(
            sample(&text, &format!("workqueue_work_duration_seconds_sum{name}")),
            "2.5"
        );
        // "b" has been processing for 2 s.
        assert_eq!(
            sample(&text, &format!("workqueue_unfinished_work_seconds{name}")),
            "2.0"
        );
        assert!(text.contains(r#"workqueue_queue_duration_seconds_bucket{le="1e-8",name="test"}"#));

        // Once the timer moves "c" into the queue, it is an add and counts in depth.
        tokio::time::advance(250 * MS).await;
        for _ in 0..100 {
            if queue.len() == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(queue.len(), 1);
        let text = scrape(&registry);
        assert_eq!(sample(&text, &format!("workqueue_adds_total{name}")), "3");
        assert_eq!(sample(&text, &format!("workqueue_depth{name}")), "1");
        assert_eq!(
            sample(&text, &format!("workqueue_unfinished_work_seconds{name}")),
            "2.25"
        );
        assert_eq!(
            sample(
                &text,
                &format!("workqueue_longest_running_processor_seconds{name}")
            ),
            "2.25"
        );

        queue.done(&b);
        let text = scrape(&registry);
        assert_eq!(
            sample(&text, &format!("workqueue_unfinished_work_seconds{name}")),
            "0.0"
        );

        // A dropped queue leaves the in-flight gauges; its counters stay.
        queue.shutdown();
        drop(queue);
        // The aborted timer task lets go of the queue when the runtime next polls it.
        let mut text = scrape(&registry);
        for _ in 0..100 {
            if !text.contains("workqueue_unfinished_work_seconds{") {
                break;
            }
            tokio::task::yield_now().await;
            text = scrape(&registry);
        }
        assert!(
            !text.contains("workqueue_unfinished_work_seconds{"),
            "{text}"
        );
        assert_eq!(sample(&text, &format!("workqueue_adds_total{name}")), "3");
    }

    #[tokio::test(start_paused = true)]
    async fn unnamed_queues_report_nothing() {
        let mut registry = Registry::default();
        let metrics = PrometheusMetrics::new(&mut registry);
        let queue = DelayingQueue::with_config(QueueConfig::default().metrics(metrics));
        queue.add(1);
        queue.add_after(2, MS);
        assert!(!scrape(&registry).contains("name="));
    }
}
