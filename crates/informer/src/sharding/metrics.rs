//! The shard rings' gauges and counters on Prometheus (members, slots assigned and held,
//! taken, released and lost, handover times, each sharded controller's cached objects),
//! read at each scrape from the rings a manager runs.

use std::sync::Arc;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{TypedMetric, counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::ShardRing;
use crate::metrics::encode_family;

/// Counts a sharded controller's cached primaries.
pub(crate) type CountObjects = Box<dyn Fn() -> usize + Send + Sync>;

/// A ring the manager runs, with the sharded controllers that follow it.
struct RingEntry {
    ring: Arc<ShardRing>,
    controllers: Vec<(String, CountObjects)>,
}

/// The shard rings a manager runs.
#[derive(Clone, Default)]
pub(crate) struct Rings(Arc<std::sync::Mutex<Vec<RingEntry>>>);

impl std::fmt::Debug for Rings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rings = self.lock();
        f.debug_list()
            .entries(rings.iter().map(|e| e.ring.config().name.clone()))
            .finish()
    }
}

impl Rings {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RingEntry>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn add(&self, ring: Arc<ShardRing>) {
        self.lock().push(RingEntry {
            ring,
            controllers: Vec::new(),
        });
    }

    /// Counts `controller`'s objects under `ring`, which the manager runs.
    pub(crate) fn follow(&self, ring: &Arc<ShardRing>, controller: String, count: CountObjects) {
        if let Some(entry) = self.lock().iter_mut().find(|e| Arc::ptr_eq(&e.ring, ring)) {
            entry.controllers.push((controller, count));
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RingLabels {
    ring: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RingControllerLabels {
    ring: String,
    controller: String,
}

/// The rings' gauges and counters, read at each scrape.
struct RingCollector {
    rings: Rings,
}

impl std::fmt::Debug for RingCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingCollector")
            .field("rings", &self.rings)
            .finish()
    }
}

impl Collector for RingCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let members: Family<RingLabels, Gauge> = Family::default();
        let assigned: Family<RingLabels, Gauge> = Family::default();
        let held: Family<RingLabels, Gauge> = Family::default();
        let taken: Family<RingLabels, Counter> = Family::default();
        let released: Family<RingLabels, Counter> = Family::default();
        let lost: Family<RingLabels, Counter> = Family::default();
        let objects: Family<RingControllerLabels, Gauge> = Family::default();
        let rings = self.rings.lock();
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        for entry in rings.iter() {
            let stats = entry.ring.stats();
            let labels = RingLabels {
                ring: entry.ring.config().name.clone(),
            };
            members.get_or_create(&labels).set(gauge(stats.members));
            assigned.get_or_create(&labels).set(gauge(stats.assigned));
            held.get_or_create(&labels).set(gauge(stats.held));
            taken.get_or_create(&labels).inc_by(stats.taken);
            released.get_or_create(&labels).inc_by(stats.released);
            lost.get_or_create(&labels).inc_by(stats.lost);
            for (controller, count) in &entry.controllers {
                let labels = RingControllerLabels {
                    ring: labels.ring.clone(),
                    controller: controller.clone(),
                };
                objects.get_or_create(&labels).set(gauge(count()));
            }
        }
        let gauges = [
            (
                "shard_ring_members",
                "Live members of the ring this replica sees",
                members,
            ),
            (
                "shard_ring_slots_assigned",
                "Slots of the ring dealt to this replica",
                assigned,
            ),
            (
                "shard_ring_slots_held",
                "Slots of the ring this replica holds and reconciles",
                held,
            ),
        ];
        for (name, help, family) in gauges {
            encode_family(&mut encoder, name, help, &family)?;
        }
        let counters = [
            ("shard_ring_slots_taken", "Slots this replica took", taken),
            (
                "shard_ring_slots_released",
                "Slots this replica let go of once their reconciles finished",
                released,
            ),
            (
                "shard_ring_slots_lost",
                "Slots this replica stopped reconciling without letting go (renewals failed, or another replica held them)",
                lost,
            ),
        ];
        for (name, help, family) in counters {
            encode_family(&mut encoder, name, help, &family)?;
        }
        encode_family(
            &mut encoder,
            "shard_ring_objects",
            "Primaries a sharded controller caches: its replica's shard",
            &objects,
        )?;
        let mut metric = encoder.encode_descriptor(
            "shard_ring_handover_seconds",
            "From a membership change this replica saw to its taking a slot the change dealt it",
            None,
            prometheus_client::metrics::histogram::Histogram::TYPE,
        )?;
        for entry in rings.iter() {
            let labels = RingLabels {
                ring: entry.ring.config().name.clone(),
            };
            entry
                .ring
                .handover_seconds()
                .encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Serves the rings' gauges and counters from `registry`.
pub(crate) fn register_ring_metrics(registry: &mut Registry, rings: Rings) {
    registry.register_collector(Box::new(RingCollector { rings }));
}
