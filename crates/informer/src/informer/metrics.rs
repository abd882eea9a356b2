//! The informers' gauges and handler counters on Prometheus, read from a factory at each
//! scrape: objects, sync, lists and restarts per informer, and each handler's lag.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{HandlerStats, InformerFactory, InformerHealth};
use crate::{
    list_watch::ShardMode,
    metrics::{HistogramSeries, encode_family, encode_histograms},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InformerLabels {
    resource: String,
    namespace: String,
    label_selector: String,
    field_selector: String,
}

/// The informers' gauges, read from the factory at each scrape.
#[derive(Debug)]
struct InformerCollector {
    factory: InformerFactory,
}

impl Collector for InformerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let objects: Family<InformerLabels, Gauge> = Family::default();
        let synced: Family<InformerLabels, Gauge> = Family::default();
        let version: Family<InformerLabels, Gauge> = Family::default();
        let restarts: Family<InformerLabels, Counter> = Family::default();
        let lists: Family<InformerLabels, Counter> = Family::default();
        let hot_bytes: Family<InformerLabels, Gauge> = Family::default();
        let hot_objects: Family<InformerLabels, Gauge> = Family::default();
        let hot_hits: Family<InformerLabels, Counter> = Family::default();
        let hot_misses: Family<InformerLabels, Counter> = Family::default();
        let hot_evictions: Family<InformerLabels, Counter> = Family::default();
        let shard_by_server: Family<InformerLabels, Gauge> = Family::default();
        let users: Family<InformerLabels, Gauge> = Family::default();
        let missing: Family<InformerLabels, Gauge> = Family::default();
        let mut handlers: Vec<(HandlerLabels, HandlerStats)> = Vec::new();
        let mut staleness: Vec<(InformerLabels, super::StalenessStats)> = Vec::new();
        for state in self.factory.informers() {
            let labels = InformerLabels {
                resource: state.resource,
                namespace: state.scope.namespace_name().unwrap_or_default().to_owned(),
                label_selector: state.scope.label_selector().unwrap_or_default().to_owned(),
                field_selector: state.scope.field_selector().unwrap_or_default().to_owned(),
            };
            objects
                .get_or_create(&labels)
                .set(i64::try_from(state.objects).unwrap_or(i64::MAX));
            synced.get_or_create(&labels).set(i64::from(state.synced));
            users
                .get_or_create(&labels)
                .set(i64::try_from(state.users).unwrap_or(i64::MAX));
            let resource_missing = matches!(state.health, InformerHealth::ResourceMissing { .. });
            missing
                .get_or_create(&labels)
                .set(i64::from(resource_missing));
            // etcd's revisions are integers; a server whose versions are not has no gauge.
            if let Some(rv) = state
                .last_sync_resource_version
                .and_then(|rv| rv.parse::<i64>().ok())
            {
                version.get_or_create(&labels).set(rv);
            }
            restarts
                .get_or_create(&labels)
                .inc_by(state.reflector.watch_restarts);
            lists.get_or_create(&labels).inc_by(state.reflector.lists);
            if let Some(mode) = state.reflector.shard_mode {
                let by_server = i64::from(mode == ShardMode::Server);
                shard_by_server.get_or_create(&labels).set(by_server);
            }
            let hot = state.working_set;
            hot_bytes
                .get_or_create(&labels)
                .set(i64::try_from(hot.bytes).unwrap_or(i64::MAX));
            hot_objects
                .get_or_create(&labels)
                .set(i64::try_from(hot.objects).unwrap_or(i64::MAX));
            hot_hits.get_or_create(&labels).inc_by(hot.hits);
            hot_misses.get_or_create(&labels).inc_by(hot.misses);
            hot_evictions.get_or_create(&labels).inc_by(hot.evictions);
            if let Some(stats) = state.staleness.clone() {
                staleness.push((labels.clone(), stats));
            }
            for handler in &state.handlers {
                let labels = HandlerLabels {
                    resource: labels.resource.clone(),
                    namespace: labels.namespace.clone(),
                    label_selector: labels.label_selector.clone(),
                    field_selector: labels.field_selector.clone(),
                    handler: handler.name.clone(),
                };
                handlers.push((labels, handler.clone()));
            }
        }
        let gauges = [
            (
                "informer_objects",
                "Objects in the informer's cache",
                objects,
            ),
            (
                "informer_synced",
                "Whether the informer has synced (1) or not (0)",
                synced,
            ),
            (
                "informer_last_sync_resource_version",
                "The resourceVersion the informer's cache last synced to",
                version,
            ),
            (
                "informer_working_set_bytes",
                "Estimated bytes of the decoded objects the cache's working set holds",
                hot_bytes,
            ),
            (
                "informer_working_set_objects",
                "Decoded objects the cache's working set holds",
                hot_objects,
            ),
            (
                "informer_shard_server_side",
                "Whether the API server applied the informer's shard (1) or the informer did (0)",
                shard_by_server,
            ),
            (
                "informer_users",
                "Handles, stores and handlers holding the informer in use; at 0 it stops after a grace period",
                users,
            ),
            (
                "informer_resource_missing",
                "Whether the API server answers 404 to the informer's list and watch (1), its CRD deleted or not installed, or serves it (0)",
                missing,
            ),
        ];
        let counters = [
            (
                "informer_watch_restarts",
                "Watches the informer opened again after its first one",
                restarts,
            ),
            (
                "informer_lists",
                "Lists the informer started, the first one included",
                lists,
            ),
            (
                "informer_working_set_hits",
                "Reads of one object the cache's working set served decoded",
                hot_hits,
            ),
            (
                "informer_working_set_misses",
                "Reads of one object that decoded it",
                hot_misses,
            ),
            (
                "informer_working_set_evictions",
                "Objects the working set let go to stay within its budget",
                hot_evictions,
            ),
        ];
        for (name, help, family) in gauges {
            encode_family(&mut encoder, name, help, &family)?;
        }
        for (name, help, family) in counters {
            encode_family(&mut encoder, name, help, &family)?;
        }
        encode_handlers(&mut encoder, &handlers)?;
        encode_staleness(&mut encoder, &staleness)?;
        encode_upstream(&mut encoder, &self.factory)
    }
}

/// Each probed informer's staleness: `informer_staleness_seconds` (the age of the oldest
/// probe its cache has not passed) and the histogram `informer_staleness_measured_seconds`
/// (how long the cache took to pass each probe).
fn encode_staleness(
    encoder: &mut DescriptorEncoder<'_>,
    informers: &[(InformerLabels, super::StalenessStats)],
) -> Result<(), std::fmt::Error> {
    let behind: Family<InformerLabels, Gauge<f64, std::sync::atomic::AtomicU64>> =
        Family::default();
    for (labels, stats) in informers {
        behind.get_or_create(labels).set(stats.behind.as_secs_f64());
    }
    encode_family(
        encoder,
        "informer_staleness_seconds",
        "How far the cache is behind the server: the age of the oldest probe of the server's current resourceVersion that the cache has not passed yet",
        &behind,
    )?;
    encode_histograms(
        encoder,
        "informer_staleness_measured_seconds",
        "How long the cache took to pass each probe of the server's current resourceVersion",
        informers.iter().map(|(labels, stats)| HistogramSeries {
            labels,
            sum: stats.total.as_secs_f64(),
            count: stats.passed,
            buckets: &stats.buckets,
        }),
    )
}

/// client-go's labels for its informer metrics (KEP-4346): the program, and the
/// resource's group, version and plural name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    name: String,
    group: String,
    version: String,
    resource: String,
}

/// The informer metrics client-go serves, under its names and labels, so dashboards and
/// alerts written for Go controllers read these: `informer_queued_items` (here the largest
/// backlog among an informer's handlers, since the store takes each event as it arrives
/// and what waits is the handlers' buffers), `informer_store_resource_version` (its 15
/// lowest digits, as client-go keeps it in a float) and
/// `informer_processing_latency_seconds`. Two informers of one resource in different
/// scopes share a series, as two of client-go's would; their values add up, or the
/// largest is kept for the version.
fn encode_upstream(
    encoder: &mut DescriptorEncoder<'_>,
    factory: &InformerFactory,
) -> Result<(), std::fmt::Error> {
    use std::collections::HashMap;

    let name = crate::replica::program_name();
    let mut informers: HashMap<UpstreamLabels, (u64, Option<i64>, super::ProcessingStats)> =
        HashMap::new();
    for state in factory.informers() {
        let labels = UpstreamLabels {
            name: name.clone(),
            group: state.group.clone(),
            version: state.version.clone(),
            resource: state.resource.clone(),
        };
        let queued = state.handlers.iter().map(|h| h.waiting).max().unwrap_or(0);
        let version = state
            .last_sync_resource_version
            .as_deref()
            .and_then(|rv| rv.parse::<u64>().ok())
            .map(|rv| i64::try_from(rv % 1_000_000_000_000_000).unwrap_or(0));
        let entry = informers.entry(labels).or_default();
        entry.0 += queued;
        entry.1 = entry.1.max(version);
        let processing = &mut entry.2;
        processing.events += state.processing.events;
        processing.total += state.processing.total;
        if processing.buckets.is_empty() {
            processing.buckets = state.processing.buckets;
        } else {
            for (sum, (_, count)) in processing.buckets.iter_mut().zip(state.processing.buckets) {
                sum.1 += count;
            }
        }
    }
    let queued: Family<UpstreamLabels, Gauge> = Family::default();
    let version: Family<UpstreamLabels, Gauge<f64, std::sync::atomic::AtomicU64>> =
        Family::default();
    for (labels, (waiting, rv, _)) in &informers {
        queued
            .get_or_create(labels)
            .set(i64::try_from(*waiting).unwrap_or(i64::MAX));
        if let Some(rv) = rv {
            #[allow(clippy::cast_precision_loss)]
            version.get_or_create(labels).set(*rv as f64);
        }
    }
    encode_family(
        encoder,
        "informer_queued_items",
        "Events an informer has taken in and not yet handed out: the largest backlog among its event handlers",
        &queued,
    )?;
    encode_family(
        encoder,
        "informer_store_resource_version",
        "The resourceVersion an informer's store has reached (its 15 lowest digits)",
        &version,
    )?;
    encode_histograms(
        encoder,
        "informer_processing_latency_seconds",
        "Time an informer took over each watch event before its handlers saw it: the store updated and the event put in each handler's buffer",
        informers
            .iter()
            .map(|(labels, (_, _, processing))| HistogramSeries {
                labels,
                sum: processing.total.as_secs_f64(),
                count: processing.events,
                buckets: &processing.buckets,
            }),
    )
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandlerLabels {
    resource: String,
    namespace: String,
    label_selector: String,
    field_selector: String,
    handler: String,
}

/// Each event handler's lag: `informer_handler_waiting`, `_oldest_waiting_seconds`,
/// `_delivered_total`, `_coalesced_total` and the histogram `_processing_seconds`.
fn encode_handlers(
    encoder: &mut DescriptorEncoder<'_>,
    handlers: &[(HandlerLabels, HandlerStats)],
) -> Result<(), std::fmt::Error> {
    let waiting: Family<HandlerLabels, Gauge> = Family::default();
    let oldest: Family<HandlerLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default();
    let delivered: Family<HandlerLabels, Counter> = Family::default();
    let coalesced: Family<HandlerLabels, Counter> = Family::default();
    for (labels, stats) in handlers {
        waiting
            .get_or_create(labels)
            .set(i64::try_from(stats.waiting).unwrap_or(i64::MAX));
        oldest
            .get_or_create(labels)
            .set(stats.oldest_waiting.as_secs_f64());
        delivered.get_or_create(labels).inc_by(stats.delivered);
        coalesced.get_or_create(labels).inc_by(stats.coalesced);
    }
    encode_family(
        encoder,
        "informer_handler_waiting",
        "Events waiting in an event handler's buffer, the one it is handling included",
        &waiting,
    )?;
    encode_family(
        encoder,
        "informer_handler_oldest_waiting_seconds",
        "How long the oldest event waiting for an event handler has waited",
        &oldest,
    )?;
    encode_family(
        encoder,
        "informer_handler_delivered",
        "Events an event handler has finished handling",
        &delivered,
    )?;
    encode_family(
        encoder,
        "informer_handler_coalesced",
        "Events merged into an event of the same object already waiting, because the event handler was behind",
        &coalesced,
    )?;
    encode_histograms(
        encoder,
        "informer_handler_processing_seconds",
        "Time an event handler took over each event",
        handlers.iter().map(|(labels, stats)| HistogramSeries {
            labels,
            sum: stats.processing_total.as_secs_f64(),
            count: stats.delivered,
            buckets: &stats.processing_buckets,
        }),
    )
}

/// Serves the factory's informers' gauges from `registry`.
pub(crate) fn register_informer_metrics(registry: &mut Registry, factory: InformerFactory) {
    registry.register_collector(Box::new(InformerCollector { factory }));
}
