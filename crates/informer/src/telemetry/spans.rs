//! The spans a controller opens around each key: a watch event, its wait in the queue
//! (coalesced events linked to it), and the reconcile.

use dashmap::DashMap;
use opentelemetry::trace::TraceContextExt;
use tracing::{Span, field::Empty};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::key::ObjectKey;

/// The queue-wait spans of the keys a controller has queued.
#[derive(Debug, Default)]
pub(crate) struct QueuedSpans(DashMap<ObjectKey, Span>);

impl QueuedSpans {
    /// A watch event (or a replay) enqueued `key`: its span, and the key's queue-wait span,
    /// opened now, or linked to it when the key already waits.
    pub(crate) fn enqueued(&self, controller: &str, key: &ObjectKey, replay: bool) {
        let event = tracing::info_span!(
            "watch event",
            otel.name = "watch event",
            controller,
            key = %key,
            replay,
        );
        if event.is_disabled() {
            // No layer takes spans now (none installed, or the collector is down).
            return;
        }
        match self.0.entry(key.clone()) {
            dashmap::mapref::entry::Entry::Occupied(waiting) => {
                let linked = event.context().span().span_context().clone();
                waiting.get().add_link(linked);
            }
            dashmap::mapref::entry::Entry::Vacant(vacant) => {
                let wait = tracing::info_span!(parent: &event, "queue wait", otel.name = "queue wait", controller, key = %key);
                vacant.insert(wait);
            }
        }
    }

    /// A worker took `key`: its queue-wait span, which ends as it is dropped. Taken as the
    /// worker takes the key, whether it reconciles it or not, so no key's span outlives
    /// its turn in the queue.
    pub(crate) fn taken(&self, key: &ObjectKey) -> Option<Span> {
        self.0.remove(key).map(|(_, wait)| wait)
    }
}

/// The span of a reconcile of `key`: the child of its queue wait (a root for a key queued
/// by a retry, which has no wait), its trace id recorded for the log lines in it.
pub(crate) fn reconcile(controller: &str, key: &ObjectKey, wait: Option<Span>) -> Span {
    let span = tracing::info_span!(
        "reconcile",
        otel.name = "reconcile",
        controller,
        key = %key,
        trace_id = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(wait) = wait {
        let _ = span.set_parent(wait.context());
    }
    let trace_id = span.context().span().span_context().trace_id();
    if trace_id != opentelemetry::trace::TraceId::INVALID {
        span.record("trace_id", tracing::field::display(trace_id));
    }
    span
}

/// The span of one API request, in whatever span sends it.
pub(crate) fn request(method: &str, path: &str) -> Span {
    tracing::info_span!(
        "api request",
        otel.name = %format!("{method} {path}"),
        otel.kind = "client",
        http.request.method = %method,
        url.path = %path,
        http.response.status_code = Empty,
    )
}
