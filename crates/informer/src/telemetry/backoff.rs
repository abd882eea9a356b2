//! An exporter that, once the collector has refused a batch, sends none until the collector
//! is back, and a filter that makes no span meanwhile.
//!
//! The OTLP exporter encodes every batch before it finds the collector down, and a batch
//! processor hands it a batch every few seconds however often that fails: with the
//! collector down, a controller paid a tenth of its CPU encoding spans for nothing
//! (profile of the informer benchmark's controller case). Turning `tracing` spans into
//! OpenTelemetry ones cost it twice that again, for spans that were then dropped. So after
//! a failed export the collector is *down*: the layer sees no span and no event (the
//! [`WhileExported`] filter), and batches made before are dropped unencoded and counted.
//! The filter says so in each callsite's interest, rebuilt as the collector goes down or
//! comes back: a per-layer filter that only answers `enabled` with `false` still leaves
//! the span to be made by the registry (its filter map counts one refusal as "some layer
//! may want it"), where a callsite no layer is interested in costs nothing at all.
//! A second later a probe connects to the collector's port, in a thread of its own; while
//! nothing listens there the pause doubles to a minute, and once something does, spans
//! are made again and the next batch tries the collector. The first batch that goes
//! through ends the failures and reports how many spans were dropped.

use std::{
    fmt,
    future::Future,
    net::{TcpStream, ToSocketAddrs},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    trace::{SpanData, SpanExporter},
};
use tracing::{Metadata, info, subscriber::Interest, warn};
use tracing_subscriber::{
    filter::LevelFilter,
    layer::{Context, Filter},
};

/// The first pause after a failed export.
const FIRST_PAUSE: Duration = Duration::from_secs(1);

/// The longest pause.
const LONGEST_PAUSE: Duration = Duration::from_secs(60);

/// How long a probe waits for the collector's port to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How often the probing thread looks at the end of the pause, which a flush that went
/// through may have moved.
const PROBE_TICK: Duration = Duration::from_millis(100);

/// What the exporter, the filter and their owner share: whether the collector is taken to
/// be up, the pause and its failures, and whether a flush asked for an export now.
#[derive(Debug)]
pub(super) struct ExportState {
    /// `host:port` of the collector, for probes; `None` when the endpoint names none,
    /// and then a pause simply ends.
    collector: Option<String>,
    /// Spans are made and batches sent: no export has failed since the last probe that
    /// found the collector listening.
    up: AtomicBool,
    /// When the pause ends, in nanoseconds since `started`.
    resume_at: AtomicU64,
    started: Instant,
    probing: AtomicBool,
    pause: Mutex<Pause>,
    flushing: AtomicBool,
}

impl ExportState {
    /// The state of an exporter to `endpoint`, taken to be up until an export fails.
    pub(super) fn new(endpoint: &str) -> Self {
        Self {
            collector: collector_address(endpoint),
            up: AtomicBool::new(true),
            resume_at: AtomicU64::new(0),
            started: Instant::now(),
            probing: AtomicBool::new(false),
            pause: Mutex::default(),
            flushing: AtomicBool::new(false),
        }
    }

    /// Runs `flush` with the pause lifted: an explicit flush always tries the collector.
    pub(super) fn flushing<T>(&self, flush: impl FnOnce() -> T) -> T {
        self.flushing.store(true, Ordering::Release);
        let flushed = flush();
        self.flushing.store(false, Ordering::Release);
        flushed
    }

    /// Whether spans are made now.
    fn records(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Spans are made again; the callsites learn it if they had been told otherwise.
    fn back_up(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            tracing::callsite::rebuild_interest_cache();
        }
    }

    /// Starts the thread that probes the collector's port at the end of each pause, unless
    /// one runs: spans are made again once something listens there, and the pause doubles
    /// each time nothing does. It holds the state weakly, and ends with it.
    fn probe_after_pause(self: &Arc<Self>) {
        if self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let state = Arc::downgrade(self);
        let collector = self.collector.clone();
        let spawned = std::thread::Builder::new()
            .name("otlp-probe".to_owned())
            .spawn(move || {
                loop {
                    std::thread::sleep(PROBE_TICK);
                    let Some(state) = state.upgrade() else { return };
                    if state.records() {
                        state.probing.store(false, Ordering::Release);
                        // An export that failed meanwhile found this probe still running.
                        if !state.records() {
                            state.probe_after_pause();
                        }
                        return;
                    }
                    let now = Instant::now();
                    if state.nanos_since_start(now) < state.resume_at.load(Ordering::Acquire) {
                        continue;
                    }
                    if collector.as_deref().is_none_or(listens) {
                        state.probing.store(false, Ordering::Release);
                        state.back_up();
                        return;
                    }
                    state.pause_again(0, &"nothing listens on the collector's port", now);
                }
            });
        if let Err(error) = spawned {
            warn!(%error, "starting a probe of the collector; trying it with the next batch");
            self.probing.store(false, Ordering::Release);
            self.back_up();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pause> {
        self.pause.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn nanos_since_start(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.started).as_nanos()).unwrap_or(u64::MAX)
    }

    /// An export of `spans` failed at `now`: the collector is down, the pause that begins
    /// is twice the last one, and a probe ends it.
    fn failed(self: &Arc<Self>, spans: usize, error: &dyn fmt::Display, now: Instant) {
        self.pause_again(spans, error, now);
        self.probe_after_pause();
    }

    /// Counts a failure at `now` and begins the pause after it; tells the callsites that no
    /// span is made if they were told otherwise.
    fn pause_again(&self, spans: usize, error: &dyn fmt::Display, now: Instant) {
        let mut pause = self.lock();
        pause.failures = pause.failures.saturating_add(1);
        let doublings = (pause.failures - 1).min(6);
        let wait = (FIRST_PAUSE * 2u32.pow(doublings)).min(LONGEST_PAUSE);
        pause.dropped += spans as u64;
        self.resume_at
            .store(self.nanos_since_start(now + wait), Ordering::Release);
        let was_up = self.up.swap(false, Ordering::AcqRel);
        warn!(
            collector = self.collector.as_deref().unwrap_or_default(),
            %error,
            dropped = pause.dropped,
            next_try_in = ?wait,
            "the collector did not take spans; none are made until it is back"
        );
        drop(pause);
        if was_up {
            tracing::callsite::rebuild_interest_cache();
        }
    }
}

/// `host:port` of an OTLP/HTTP endpoint, the port the scheme's default when it names none.
fn collector_address(endpoint: &str) -> Option<String> {
    let uri: http::Uri = endpoint.parse().ok()?;
    let host = uri.host()?;
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("https") {
            443
        } else {
            80
        });
    Some(format!("{host}:{port}"))
}

/// Whether something accepts a connection at `address`.
fn listens(address: &str) -> bool {
    address.to_socket_addrs().is_ok_and(|mut addrs| {
        addrs.any(|addr| TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).is_ok())
    })
}

/// The filter of the OpenTelemetry layer: what is at `max_level` or above while the
/// collector takes spans, nothing while it is down (see the [module](self)).
#[derive(Clone, Debug)]
pub(super) struct WhileExported {
    state: Arc<ExportState>,
    max_level: LevelFilter,
}

impl WhileExported {
    pub(super) fn new(state: Arc<ExportState>, max_level: LevelFilter) -> Self {
        Self { state, max_level }
    }
}

impl<S> Filter<S> for WhileExported {
    fn enabled(&self, metadata: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        self.max_level >= *metadata.level() && self.state.records()
    }

    fn callsite_enabled(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.max_level >= *metadata.level() && self.state.records() {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.max_level)
    }
}

#[derive(Debug, Default)]
struct Pause {
    /// Failed exports and probes since the last batch that went through.
    failures: u32,
    /// Spans dropped since then.
    dropped: u64,
}

/// `inner`, sending nothing while the collector is down (see the [module](self)).
pub(super) struct BackingOff<E> {
    inner: E,
    state: Arc<ExportState>,
}

impl<E> BackingOff<E> {
    pub(super) fn new(inner: E, state: Arc<ExportState>) -> Self {
        Self { inner, state }
    }

    /// Whether a batch of `spans` is dropped unsent, counting it if so.
    fn skips(&self, spans: usize) -> bool {
        if self.state.flushing.load(Ordering::Acquire) || self.state.up.load(Ordering::Acquire) {
            return false;
        }
        self.state.lock().dropped += spans as u64;
        true
    }

    /// Records how the export of `spans` went, ending the failures or starting a pause.
    fn outcome(&self, spans: usize, result: &OTelSdkResult, now: Instant) {
        match result {
            Ok(()) => {
                let mut pause = self.state.lock();
                if pause.failures > 0 {
                    info!(
                        collector = self.state.collector.as_deref().unwrap_or_default(),
                        dropped = pause.dropped,
                        "the collector takes spans again"
                    );
                }
                *pause = Pause::default();
                drop(pause);
                self.state.back_up();
            }
            Err(error) => self.state.failed(spans, error, now),
        }
    }
}

impl<E> fmt::Debug for BackingOff<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackingOff")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<E: SpanExporter> SpanExporter for BackingOff<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let spans = batch.len();
        let sent = (!self.skips(spans)).then(|| self.inner.export(batch));
        async move {
            let Some(sent) = sent else { return Ok(()) };
            let result = sent.await;
            self.outcome(spans, &result, Instant::now());
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use std::{net::TcpListener, sync::atomic::AtomicUsize};

    use opentelemetry_sdk::error::OTelSdkError;
    use tracing_subscriber::{Layer, layer::SubscriberExt};

    use super::*;

    /// An exporter that fails while `down` is set, counting its calls.
    #[derive(Debug, Default)]
    struct Collector {
        down: AtomicBool,
        calls: AtomicUsize,
    }

    #[derive(Debug, Default)]
    struct Shared(Arc<Collector>);

    impl SpanExporter for Shared {
        fn export(&self, _batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
            self.0.calls.fetch_add(1, Ordering::Relaxed);
            let down = self.0.down.load(Ordering::Relaxed);
            async move {
                if down {
                    Err(OTelSdkError::InternalFailure("connection refused".into()))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// An endpoint on a local port where nothing listens any more.
    fn closed_endpoint() -> String {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a local port")
            .port();
        format!("http://127.0.0.1:{port}/v1/traces")
    }

    /// Ends the pause now.
    fn pause_over(state: &ExportState) {
        state.resume_at.store(0, Ordering::Release);
    }

    /// Waits until `condition` holds of `state`.
    async fn until(state: &ExportState, what: &str, condition: impl Fn(&ExportState) -> bool) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !condition(state) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what} within 10 s"));
    }

    #[tokio::test]
    async fn a_down_collector_is_sent_nothing_until_it_is_back_and_a_flush_always_tries() {
        let collector = Arc::new(Collector::default());
        collector.down.store(true, Ordering::Relaxed);
        let state = Arc::new(ExportState::new(&closed_endpoint()));
        let exporter = BackingOff::new(Shared(collector.clone()), state.clone());
        assert!(
            exporter.export(Vec::new()).await.is_err(),
            "the first batch tries"
        );
        for _ in 0..10 {
            assert!(exporter.export(Vec::new()).await.is_ok(), "dropped unsent");
        }
        assert_eq!(collector.calls.load(Ordering::Relaxed), 1);
        state.flushing.store(true, Ordering::Release);
        let flushed = exporter.export(Vec::new()).await;
        state.flushing.store(false, Ordering::Release);
        assert!(
            flushed.is_err(),
            "a flush tries the collector while it is down"
        );
        assert_eq!(collector.calls.load(Ordering::Relaxed), 2);

        // A probe finds the collector back; the next batch goes through.
        state.back_up();
        collector.down.store(false, Ordering::Relaxed);
        assert!(exporter.export(Vec::new()).await.is_ok());
        assert_eq!(collector.calls.load(Ordering::Relaxed), 3);
        assert_eq!(
            state.lock().failures,
            0,
            "a batch that went through ends the failures"
        );
    }

    #[tokio::test]
    async fn spans_are_made_again_only_once_a_probe_finds_the_collector_listening() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
        let port = listener.local_addr().expect("its address").port();
        drop(listener);
        let state = Arc::new(ExportState::new(&format!(
            "http://127.0.0.1:{port}/v1/traces"
        )));
        assert!(state.records(), "taken to be up until an export fails");
        state.failed(1, &"refused", Instant::now());
        assert!(!state.records(), "down during the pause");
        assert!(
            state.probing.load(Ordering::Acquire),
            "a probe waits for the pause to end"
        );
        // Well within the first pause (a second): no probe has run yet.
        tokio::time::sleep(PROBE_TICK * 3).await;
        assert_eq!(state.lock().failures, 1, "no probe before the pause ends");

        pause_over(&state);
        until(&state, "a probe finds nothing listening", |s| {
            s.lock().failures == 2
        })
        .await;
        assert!(!state.records(), "the probe found nothing listening");

        let _collector = TcpListener::bind(("127.0.0.1", port)).expect("the collector's port");
        pause_over(&state);
        until(&state, "a probe finds the collector", ExportState::records).await;
        until(&state, "the probe ends", |s| {
            !s.probing.load(Ordering::Acquire)
        })
        .await;
    }

    #[test]
    fn the_layer_sees_no_span_while_the_collector_is_down() {
        #[derive(Default)]
        struct Spans(Arc<AtomicUsize>);
        impl<S: tracing::Subscriber> Layer<S> for Spans {
            fn on_new_span(
                &self,
                _: &tracing::span::Attributes<'_>,
                _: &tracing::span::Id,
                _: Context<'_, S>,
            ) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let seen = Arc::new(AtomicUsize::new(0));
        let state = Arc::new(ExportState::new(&closed_endpoint()));
        let subscriber = tracing_subscriber::registry().with(
            Spans(seen.clone()).with_filter(WhileExported::new(state.clone(), LevelFilter::INFO)),
        );
        tracing::subscriber::with_default(subscriber, || {
            let up = tracing::info_span!("up");
            assert!(!up.is_disabled());
            drop(tracing::debug_span!("below the level"));
            state.pause_again(0, &"refused", Instant::now());
            let down = tracing::info_span!("down");
            assert!(
                down.is_disabled(),
                "no layer wants it, so the registry does not make it either"
            );
            state.back_up();
            drop(tracing::info_span!("back"));
        });
        assert_eq!(
            seen.load(Ordering::Relaxed),
            2,
            "the span made while down and the one below the level are not seen"
        );
    }

    #[test]
    fn the_pause_doubles_to_a_minute() {
        let state = ExportState::new("http://collector:4318/v1/traces");
        assert_eq!(state.collector.as_deref(), Some("collector:4318"));
        let now = Instant::now();
        let pauses: Vec<u64> = (0..9)
            .map(|_| {
                state.pause_again(1, &"refused", now);
                (state.resume_at.load(Ordering::Acquire) - state.nanos_since_start(now))
                    / 1_000_000_000
            })
            .collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(state.lock().dropped, 9);
        assert_eq!(
            collector_address("https://collector/v1/traces").as_deref(),
            Some("collector:443")
        );
    }
}
