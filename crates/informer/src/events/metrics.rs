//! The event recorders' counters on Prometheus (published, written, dropped by reason),
//! read at each scrape from the recorders a manager handed out.

use std::sync::Arc;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet},
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::Recorder;
use crate::metrics::encode_family;

/// The event recorders a manager handed out.
#[derive(Clone, Default)]
pub(crate) struct Recorders(Arc<std::sync::Mutex<Vec<Recorder>>>);

impl std::fmt::Debug for Recorders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorders")
            .field("recorders", &self.all().len())
            .finish()
    }
}

impl Recorders {
    pub(crate) fn add(&self, recorder: Recorder) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(recorder);
    }

    fn all(&self) -> Vec<Recorder> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Writes what each recorder buffered, and stops them.
    pub(crate) async fn shutdown(&self) {
        futures::future::join_all(self.all().iter().map(Recorder::shutdown)).await;
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RecorderLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DroppedLabels {
    controller: String,
    reason: String,
}

/// The recorders' counters, read at each scrape.
#[derive(Debug)]
struct RecorderCollector {
    recorders: Recorders,
}

impl Collector for RecorderCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let published: Family<RecorderLabels, Counter> = Family::default();
        let written: Family<RecorderLabels, Counter> = Family::default();
        let dropped: Family<DroppedLabels, Counter> = Family::default();
        for recorder in self.recorders.all() {
            let stats = recorder.stats();
            let controller = recorder.reporter().controller().to_owned();
            let labels = RecorderLabels {
                controller: controller.clone(),
            };
            published.get_or_create(&labels).inc_by(stats.published);
            written
                .get_or_create(&labels)
                .inc_by(stats.created + stats.series_updates);
            for (reason, count) in [
                ("buffer_full", stats.dropped_buffer_full),
                ("spam", stats.dropped_spam),
                ("write_failed", stats.dropped_failed),
            ] {
                let labels = DroppedLabels {
                    controller: controller.clone(),
                    reason: reason.to_owned(),
                };
                dropped.get_or_create(&labels).inc_by(count);
            }
        }
        encode_family(
            &mut encoder,
            "events_published",
            "Kubernetes Events a controller published",
            &published,
        )?;
        encode_family(
            &mut encoder,
            "events_written",
            "Writes of Kubernetes Events: new Events and higher series counts",
            &written,
        )?;
        encode_family(
            &mut encoder,
            "events_dropped",
            "Kubernetes Events dropped: the buffer was full, the object sent too many, or the write failed",
            &dropped,
        )
    }
}

/// Serves the recorders' counters from `registry`.
pub(crate) fn register_event_metrics(registry: &mut Registry, recorders: Recorders) {
    registry.register_collector(Box::new(RecorderCollector { recorders }));
}
