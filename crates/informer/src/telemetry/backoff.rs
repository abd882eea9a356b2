//! An exporter that, once the collector has refused a batch, sends none for a while.
//!
//! The OTLP exporter encodes every batch before it finds the collector down, and a batch
//! processor hands it a batch every few seconds however often that fails: with the
//! collector down, a controller paid a tenth of its CPU encoding spans for nothing
//! (profile of the informer benchmark's controller case). After a failure the batches of
//! the next second are dropped without being encoded, the pause doubling to a minute while
//! failures go on; the first batch that goes through ends it. Spans dropped meanwhile are
//! counted and reported when the collector takes spans again. During a pause the sampler
//! ([`WhileExported`]) makes no span at all: one made then would only be dropped, and
//! not making it saves most of what a span costs.

use std::{
    fmt,
    future::Future,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use opentelemetry::{
    Context, KeyValue,
    trace::{Link, SpanKind, TraceContextExt, TraceId, TraceState},
};
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    trace::{Sampler, SamplingDecision, SamplingResult, ShouldSample, SpanData, SpanExporter},
};
use tracing::{info, warn};

/// The first pause after a failed export.
const FIRST_PAUSE: Duration = Duration::from_secs(1);

/// The longest pause.
const LONGEST_PAUSE: Duration = Duration::from_secs(60);

/// What the exporter and its owner share: the pause, and whether a flush asked for an
/// export now.
#[derive(Debug, Default)]
pub(super) struct ExportState {
    pause: Mutex<Pause>,
    flushing: AtomicBool,
}

impl ExportState {
    /// Runs `flush` with the pause lifted: an explicit flush always tries the collector.
    pub(super) fn flushing<T>(&self, flush: impl FnOnce() -> T) -> T {
        self.flushing.store(true, Ordering::Release);
        let flushed = flush();
        self.flushing.store(false, Ordering::Release);
        flushed
    }

    /// Whether the collector refused the last batch and the pause that began lasts at
    /// `now`.
    fn paused(&self, now: Instant) -> bool {
        self.pause
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .lasts(now)
    }
}

/// The SDK's default sampling (a root span always, a child as its parent) while the
/// collector takes spans; no span during a pause (see the [module](self)).
#[derive(Clone, Debug)]
pub(super) struct WhileExported {
    state: Arc<ExportState>,
    otherwise: Sampler,
}

impl WhileExported {
    pub(super) fn new(state: Arc<ExportState>) -> Self {
        Self {
            state,
            otherwise: Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        }
    }
}

impl ShouldSample for WhileExported {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        if self.state.paused(Instant::now()) {
            return SamplingResult {
                decision: SamplingDecision::Drop,
                attributes: Vec::new(),
                trace_state: parent_context.map_or_else(TraceState::default, |cx| {
                    cx.span().span_context().trace_state().clone()
                }),
            };
        }
        self.otherwise
            .should_sample(parent_context, trace_id, name, span_kind, attributes, links)
    }
}

#[derive(Debug, Default)]
struct Pause {
    failures: u32,
    until: Option<Instant>,
    dropped: u64,
}

impl Pause {
    /// Whether a pause began and lasts at `now`.
    fn lasts(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| now < until)
    }
}

/// `inner`, paused after each failure (see the [module](self)).
pub(super) struct BackingOff<E> {
    inner: E,
    state: Arc<ExportState>,
    endpoint: String,
}

impl<E> BackingOff<E> {
    pub(super) fn new(inner: E, state: Arc<ExportState>, endpoint: &str) -> Self {
        Self {
            inner,
            state,
            endpoint: endpoint.to_owned(),
        }
    }

    fn pause(&self) -> std::sync::MutexGuard<'_, Pause> {
        self.state
            .pause
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a batch of `spans` is dropped unsent, counting it if so.
    fn skips(&self, spans: usize, now: Instant) -> bool {
        if self.state.flushing.load(Ordering::Acquire) {
            return false;
        }
        let mut pause = self.pause();
        let paused = pause.lasts(now);
        if paused {
            pause.dropped += spans as u64;
        }
        paused
    }

    /// Records how the export of `spans` went, starting or ending a pause.
    fn outcome(&self, spans: usize, result: &OTelSdkResult, now: Instant) {
        let mut pause = self.pause();
        match result {
            Ok(()) => {
                if pause.failures > 0 {
                    info!(
                        endpoint = %self.endpoint,
                        dropped = pause.dropped,
                        "the collector takes spans again"
                    );
                }
                *pause = Pause::default();
            }
            Err(error) => {
                pause.failures = pause.failures.saturating_add(1);
                let doublings = (pause.failures - 1).min(6);
                let wait = (FIRST_PAUSE * 2u32.pow(doublings)).min(LONGEST_PAUSE);
                pause.until = Some(now + wait);
                pause.dropped += spans as u64;
                warn!(
                    endpoint = %self.endpoint,
                    %error,
                    dropped = pause.dropped,
                    next_try_in = ?wait,
                    "the collector did not take spans; none are sent until the next try"
                );
            }
        }
    }
}

impl<E> fmt::Debug for BackingOff<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackingOff")
            .field("endpoint", &self.endpoint)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<E: SpanExporter> SpanExporter for BackingOff<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let spans = batch.len();
        let sent = (!self.skips(spans, Instant::now())).then(|| self.inner.export(batch));
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
    use std::sync::atomic::AtomicUsize;

    use opentelemetry_sdk::error::OTelSdkError;

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

    #[tokio::test]
    async fn a_down_collector_is_tried_once_per_pause_and_a_flush_always_tries() {
        let collector = Arc::new(Collector::default());
        collector.down.store(true, Ordering::Relaxed);
        let state = Arc::new(ExportState::default());
        let exporter =
            BackingOff::new(Shared(collector.clone()), state.clone(), "http://collector");
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
            "a flush tries the collector during a pause"
        );
        assert_eq!(collector.calls.load(Ordering::Relaxed), 2);

        // The pause ends; the collector is back and the next batch goes through.
        exporter.pause().until = Some(Instant::now());
        collector.down.store(false, Ordering::Relaxed);
        assert!(exporter.export(Vec::new()).await.is_ok());
        assert_eq!(collector.calls.load(Ordering::Relaxed), 3);
        assert_eq!(
            exporter.pause().failures,
            0,
            "a batch that went through ends it"
        );
    }

    #[test]
    fn no_span_is_sampled_during_a_pause() {
        let state = Arc::new(ExportState::default());
        let sampler = WhileExported::new(state.clone());
        let exporter = BackingOff::new(Shared::default(), state, "http://collector");
        let decide = || {
            sampler
                .should_sample(
                    None,
                    TraceId::from_bytes([1; 16]),
                    "reconcile",
                    &SpanKind::Internal,
                    &[],
                    &[],
                )
                .decision
        };
        assert_eq!(decide(), SamplingDecision::RecordAndSample);
        let now = Instant::now();
        exporter.outcome(
            1,
            &Err(OTelSdkError::InternalFailure("refused".into())),
            now,
        );
        assert_eq!(decide(), SamplingDecision::Drop, "paused");
        exporter.pause().until = Some(now);
        assert_eq!(
            decide(),
            SamplingDecision::RecordAndSample,
            "the pause is over: the next batch tries the collector"
        );
    }

    #[test]
    fn the_pause_doubles_to_a_minute() {
        let exporter = BackingOff::new(Shared::default(), Arc::default(), "http://collector");
        let now = Instant::now();
        let failed = Err(OTelSdkError::InternalFailure("refused".into()));
        let pauses: Vec<Duration> = (0..9)
            .map(|_| {
                exporter.outcome(1, &failed, now);
                exporter.pause().until.expect("paused") - now
            })
            .collect();
        assert_eq!(
            pauses.iter().map(Duration::as_secs).collect::<Vec<_>>(),
            [1, 2, 4, 8, 16, 32, 60, 60, 60]
        );
        assert_eq!(exporter.pause().dropped, 9);
    }
}
