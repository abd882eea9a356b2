//! A fleet's clusters on Prometheus, labelled by cluster and read from its [`FleetView`]
//! at each scrape: whether each runs, has synced, answers the fleet's probe and is behind,
//! how often its run started, and the fleet's workers.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::run::{ClusterPhase, FleetView, Reachability};
use crate::metrics::encode_family;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    cluster: String,
}

/// Reads the view at each scrape.
#[derive(Debug)]
struct FleetCollector {
    view: FleetView,
}

impl Collector for FleetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let running: Family<ClusterLabels, Gauge> = Family::default();
        let synced: Family<ClusterLabels, Gauge> = Family::default();
        let reachable: Family<ClusterLabels, Gauge> = Family::default();
        let behind: Family<ClusterLabels, Gauge> = Family::default();
        let unreachable_seconds: Family<ClusterLabels, Gauge<f64, std::sync::atomic::AtomicU64>> =
            Family::default();
        let probe_seconds: Family<ClusterLabels, Gauge<f64, std::sync::atomic::AtomicU64>> =
            Family::default();
        let starts: Family<ClusterLabels, Counter> = Family::default();
        let behind_now = self.view.behind();
        for cluster in self.view.clusters() {
            let labels = ClusterLabels {
                cluster: cluster.name.to_string(),
            };
            running
                .get_or_create(&labels)
                .set(i64::from(cluster.phase == ClusterPhase::Running));
            synced.get_or_create(&labels).set(i64::from(cluster.synced));
            behind
                .get_or_create(&labels)
                .set(i64::from(behind_now.contains(&cluster.name)));
            starts.get_or_create(&labels).inc_by(cluster.starts);
            match &cluster.reach {
                Reachability::Reachable { round_trip } => {
                    reachable.get_or_create(&labels).set(1);
                    probe_seconds
                        .get_or_create(&labels)
                        .set(round_trip.as_secs_f64());
                    unreachable_seconds.get_or_create(&labels).set(0.0);
                }
                Reachability::Unreachable { since, .. } => {
                    reachable.get_or_create(&labels).set(0);
                    unreachable_seconds
                        .get_or_create(&labels)
                        .set(since.elapsed().unwrap_or_default().as_secs_f64());
                }
                // Not probed yet: no figure rather than a made-up one.
                _ => {}
            }
        }
        let gauges = [
            (
                "fleet_cluster_running",
                "1 while the cluster's run is going on this replica",
                running,
            ),
            (
                "fleet_cluster_synced",
                "1 once every informer of the cluster's run has synced",
                synced,
            ),
            (
                "fleet_cluster_reachable",
                "1 while the cluster's API server answers the fleet's probe (GET /readyz)",
                reachable,
            ),
            (
                "fleet_cluster_behind",
                "1 while the cluster is not running synced and reachable",
                behind,
            ),
        ];
        for (name, help, family) in gauges {
            encode_family(&mut encoder, name, help, &family)?;
        }
        encode_family(
            &mut encoder,
            "fleet_cluster_unreachable_seconds",
            "How long the cluster's API server has not answered the fleet's probe (0 when it answers)",
            &unreachable_seconds,
        )?;
        encode_family(
            &mut encoder,
            "fleet_cluster_probe_seconds",
            "How long the last answered probe of the cluster's API server took",
            &probe_seconds,
        )?;
        encode_family(
            &mut encoder,
            "fleet_cluster_starts",
            "Runs of the cluster started: once, plus once per failure or credential change",
            &starts,
        )?;
        let share = self.view.share().stats();
        let totals = [
            (
                "fleet_workers",
                "The fleet's workers, shared fairly between its clusters",
                share.turns,
            ),
            (
                "fleet_workers_busy",
                "The fleet's workers reconciling now",
                share.held,
            ),
            (
                "fleet_reconciles_waiting",
                "Reconciles waiting for one of the fleet's workers",
                share.waiting,
            ),
        ];
        for (name, help, value) in totals {
            let gauge: Gauge = Gauge::default();
            gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

impl FleetView {
    /// Serves this fleet's clusters from `registry`, labelled by cluster (`fleet_cluster_*`:
    /// running, synced, reachable, behind, unreachable and probe seconds, starts) with its
    /// workers (`fleet_workers`, `fleet_workers_busy`, `fleet_reconciles_waiting`), read at
    /// each scrape. [`Manager::report_fleet`](crate::Manager::report_fleet) does this for
    /// the manager's registry.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(FleetCollector { view: self.clone() }));
    }
}
