//! The manager's endpoints: `/healthz` and `/readyz` on the probe address, `/metrics` on
//! the metrics address, and the informers' gauges on `/metrics`.

use std::{convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode, body::Incoming, server::conn::http1, service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, text::encode},
    metrics::{TypedMetric, counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    events::Recorder,
    informer::{HandlerStats, InformerFactory, InformerHealth},
    list_watch::ShardMode,
    sharding::ShardRing,
};

pub(super) const PROBE_PATHS: &[&str] = &["/healthz", "/readyz"];
pub(super) const METRICS_PATHS: &[&str] = &["/metrics"];

/// A slow or idle client gets this long to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long past the lease duration a leader's stalled renewals are tolerated before
/// `/healthz` fails (client-go's `HealthzAdaptor` timeout).
#[cfg(feature = "leader-election")]
const LEADER_STALL_TOLERANCE: Duration = Duration::from_secs(20);

/// What the endpoints answer from.
pub(super) struct State {
    factory: InformerFactory,
    registry: Registry,
    elector: Option<Arc<super::LeaderElector>>,
}

impl State {
    pub(super) fn new(
        factory: InformerFactory,
        registry: Registry,
        elector: Option<Arc<super::LeaderElector>>,
    ) -> Self {
        Self {
            factory,
            registry,
            elector,
        }
    }

    /// `/healthz`: failing while a leader's renewals have stalled.
    fn health(&self) -> Result<(), String> {
        match &self.elector {
            #[cfg(feature = "leader-election")]
            Some(elector) => elector.check_health(LEADER_STALL_TOLERANCE),
            _ => Ok(()),
        }
    }

    /// `/readyz`: failing until every informer has synced, and while the server does not
    /// serve an informer's resource.
    fn readiness(&self) -> Result<(), String> {
        let missing: Vec<String> = self
            .factory
            .informers()
            .into_iter()
            .filter_map(|informer| match informer.health {
                InformerHealth::ResourceMissing { since } => Some(format!(
                    "the API server has not served {} for {:?}",
                    informer.resource,
                    since.elapsed().unwrap_or_default()
                )),
                _ => None,
            })
            .collect();
        if !missing.is_empty() {
            return Err(missing.join("\n"));
        }
        if self.factory.has_synced() {
            Ok(())
        } else {
            Err("caches not synced yet".into())
        }
    }

    fn answer(&self, path: &str) -> (StatusCode, &'static str, String) {
        const TEXT: &str = "text/plain; charset=utf-8";
        match path {
            "/healthz" => match self.health() {
                Ok(()) => (StatusCode::OK, TEXT, "ok".into()),
                Err(why) => (StatusCode::INTERNAL_SERVER_ERROR, TEXT, why),
            },
            "/readyz" => match self.readiness() {
                Ok(()) => (StatusCode::OK, TEXT, "ok".into()),
                Err(why) => (StatusCode::SERVICE_UNAVAILABLE, TEXT, why),
            },
            "/metrics" => {
                let mut body = String::new();
                match encode(&mut body, &self.registry) {
                    Ok(()) => (
                        StatusCode::OK,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        body,
                    ),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, TEXT, e.to_string()),
                }
            }
            _ => (StatusCode::NOT_FOUND, TEXT, "not found".into()),
        }
    }
}

/// Serves `paths` on `listener` until `cancel` fires; other paths get 404. Accept errors
/// (out of file descriptors, ...) back off from 5 ms to 1 s instead of spinning.
pub(super) async fn serve(
    listener: TcpListener,
    state: Arc<State>,
    paths: &'static [&'static str],
    cancel: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, ?paths, "serving");
    }
    let mut backoff = Duration::from_millis(5);
    loop {
        let (stream, peer) = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(%error, retry_in = ?backoff, "accept failed");
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
        };
        backoff = Duration::from_millis(5);
        let state = state.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let path = request.uri().path();
            let (status, content_type, body) =
                state.answer(if paths.contains(&path) { path } else { "" });
            let response = Response::builder()
                .status(status)
                .header("content-type", content_type)
                .body(Full::new(Bytes::from(body)));
            async move { Ok::<_, Infallible>(response.unwrap_or_default()) }
        });
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => if let Err(error) = result {
                    debug!(%peer, %error, "connection ended with an error");
                },
                () = cancel.cancelled() => connection.as_mut().graceful_shutdown(),
            }
        });
    }
}

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
            restarts.get_or_create(&labels).inc_by(state.watch_restarts);
            lists.get_or_create(&labels).inc_by(state.lists);
            if let Some(mode) = state.shard_mode {
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
        encode_handlers(&mut encoder, &handlers)
    }
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
    let mut metric = encoder.encode_descriptor(
        "informer_handler_processing_seconds",
        "Time an event handler took over each event",
        None,
        prometheus_client::metrics::MetricType::Histogram,
    )?;
    for (labels, stats) in handlers {
        metric
            .encode_family(labels)?
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                stats.processing_total.as_secs_f64(),
                stats.delivered,
                &stats.processing_buckets,
                None,
            )?;
    }
    Ok(())
}

fn encode_family<L, M>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    family: &Family<L, M>,
) -> Result<(), std::fmt::Error>
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug,
    M: EncodeMetric + TypedMetric,
{
    let metric = encoder.encode_descriptor(name, help, None, family.metric_type())?;
    family.encode(metric)
}

pub(super) fn register_informer_metrics(registry: &mut Registry, factory: InformerFactory) {
    registry.register_collector(Box::new(InformerCollector { factory }));
}

/// The event recorders a manager handed out.
#[derive(Clone, Default)]
pub(super) struct Recorders(Arc<std::sync::Mutex<Vec<Recorder>>>);

impl std::fmt::Debug for Recorders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorders")
            .field("recorders", &self.all().len())
            .finish()
    }
}

impl Recorders {
    pub(super) fn add(&self, recorder: Recorder) {
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
    pub(super) async fn shutdown(&self) {
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

pub(super) fn register_event_metrics(registry: &mut Registry, recorders: Recorders) {
    registry.register_collector(Box::new(RecorderCollector { recorders }));
}

/// Counts a sharded controller's cached primaries.
pub(super) type CountObjects = Box<dyn Fn() -> usize + Send + Sync>;

/// A ring the manager runs, with the sharded controllers that follow it.
struct RingEntry {
    ring: Arc<ShardRing>,
    controllers: Vec<(String, CountObjects)>,
}

/// The shard rings a manager runs.
#[derive(Clone, Default)]
pub(super) struct Rings(Arc<std::sync::Mutex<Vec<RingEntry>>>);

impl std::fmt::Debug for Rings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rings = self.lock();
        f.debug_list()
            .entries(rings.iter().map(|e| e.ring.config().name().to_owned()))
            .finish()
    }
}

impl Rings {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RingEntry>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn add(&self, ring: Arc<ShardRing>) {
        self.lock().push(RingEntry {
            ring,
            controllers: Vec::new(),
        });
    }

    /// Counts `controller`'s objects under `ring`, which the manager runs.
    pub(super) fn follow(&self, ring: &Arc<ShardRing>, controller: String, count: CountObjects) {
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
                ring: entry.ring.config().name().to_owned(),
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
                ring: entry.ring.config().name().to_owned(),
            };
            entry
                .ring
                .handover_seconds()
                .encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

pub(super) fn register_ring_metrics(registry: &mut Registry, rings: Rings) {
    registry.register_collector(Box::new(RingCollector { rings }));
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn serving() -> (std::net::SocketAddr, CancellationToken) {
        let config = kube_client::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = kube_client::Client::try_from(config).unwrap();
        let state = Arc::new(State::new(
            InformerFactory::new(client),
            Registry::default(),
            None,
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        tokio::spawn(serve(listener, state, PROBE_PATHS, cancel.clone()));
        (addr, cancel)
    }

    /// Reads until the server closes the connection; what it sent.
    async fn read_to_close(stream: &mut tokio::net::TcpStream) -> String {
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(3600), stream.read_to_end(&mut answer))
            .await
            .expect("the server closes the connection")
            .unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    }

    // Paused time runs ahead whenever the runtime waits on the sockets, so the header-read
    // timeout is reached at once if it is set, and the read never ends if it is not.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_finishes_its_headers_is_dropped() {
        let (addr, cancel) = serving().await;
        let mut complete = tokio::net::TcpStream::connect(addr).await.unwrap();
        complete
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        assert!(
            read_to_close(&mut complete)
                .await
                .starts_with("HTTP/1.1 200")
        );

        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let answer = read_to_close(&mut slow).await;
        assert!(!answer.contains("200"), "{answer}");
        // Ours, not hyper's default of 30 s.
        let waited = started.elapsed();
        assert!(
            waited >= HEADER_READ_TIMEOUT && waited < Duration::from_secs(20),
            "{waited:?}"
        );
        cancel.cancel();
    }
}
