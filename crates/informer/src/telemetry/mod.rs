//! OpenTelemetry traces of a controller's work (feature `opentelemetry`): each change, from
//! the watch event that brought it, through its wait in the queue and its reconcile, to
//! each API call the reconcile made, is one trace.
//!
//! - A **watch event** span is opened as a handler enqueues a key; a **queue wait** span,
//!   its child, lasts until a worker takes the key. Events that coalesce into a key already
//!   queued become links of the waiting span, so a reconcile names every event it covers.
//! - The **reconcile** span is the queue wait's child; the log lines of the reconcile carry
//!   its `trace_id` as a field.
//! - Each **API request** of a client built here ([`client`](crate::client::client),
//!   [`ClusterSource`](crate::ClusterSource)) is a span in whatever span sends it: the
//!   reconcile's, for the reads and writes it makes.
//!
//! The spans are `tracing` spans; [`OtlpTracing`] turns them into OpenTelemetry spans and
//! exports them over OTLP/HTTP. Without its layer installed they cost what a disabled
//! `tracing` span costs.
//!
//! ```no_run
//! use tracing_subscriber::prelude::*;
//! use kube_informer::telemetry::OtlpTracing;
//!
//! # fn doc() -> Result<(), kube_informer::telemetry::TelemetryError> {
//! let tracing = OtlpTracing::new("my-controller", "http://127.0.0.1:4318/v1/traces")?;
//! tracing_subscriber::registry()
//!     .with(tracing.layer())
//!     .with(tracing_subscriber::fmt::layer())
//!     .init();
//! // ... run the controller; dropping `tracing` flushes what is left.
//! # Ok(()) }
//! ```

use std::sync::Arc;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::{Resource, trace::SdkTracerProvider};
use tracing::Subscriber;
use tracing_subscriber::{Layer, filter::LevelFilter, registry::LookupSpan};

/// Why tracing could not be set up or flushed.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP exporter could not be built (an invalid endpoint, say).
    #[error("building the OTLP exporter: {0}")]
    Exporter(String),
    /// Spans could not be flushed to the collector.
    #[error("flushing spans: {0}")]
    Flush(String),
}

/// Spans exported over OTLP/HTTP (protobuf) to a collector, in batches; see the
/// [module](self). Dropping it flushes and shuts the exporter down.
#[derive(Debug)]
pub struct OtlpTracing {
    provider: SdkTracerProvider,
    export: Arc<backoff::ExportState>,
    max_level: LevelFilter,
}

impl OtlpTracing {
    /// Exports to `endpoint` (a collector's OTLP/HTTP traces URL, such as
    /// `http://127.0.0.1:4318/v1/traces`) as the service `service`. An unreachable
    /// collector costs next to nothing: after a batch it refused, no span is made and the
    /// batches already made are dropped unencoded until a probe of its port, a second
    /// later, finds it listening; the pause doubles to a minute while it stays down, and a
    /// warning says how many spans were dropped.
    ///
    /// # Errors
    ///
    /// [`TelemetryError::Exporter`] when the exporter cannot be built.
    pub fn new(service: &str, endpoint: &str) -> Result<Self, TelemetryError> {
        let exporter = SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let export = Arc::new(backoff::ExportState::new(endpoint));
        let exporter = backoff::BackingOff::new(exporter, export.clone());
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                Resource::builder()
                    .with_service_name(service.to_owned())
                    .build(),
            )
            .build();
        Ok(Self {
            provider,
            export,
            max_level: LevelFilter::INFO,
        })
    }

    /// Exports the spans at `level` and above; by default `INFO`, the library's spans,
    /// without its dependencies' `DEBUG` and `TRACE` ones. Set it here rather than with a
    /// filter around [`layer`](Self::layer): the layer's own filter is what makes a span
    /// cost nothing while the collector is down, which it cannot do beneath another one.
    ///
    /// ```no_run
    /// use tracing_subscriber::filter::LevelFilter;
    /// use kube_informer::telemetry::OtlpTracing;
    ///
    /// # fn doc() -> Result<(), kube_informer::telemetry::TelemetryError> {
    /// let tracing = OtlpTracing::new("my-controller", "http://127.0.0.1:4318/v1/traces")?
    ///     .max_level(LevelFilter::DEBUG);
    /// # let _ = tracing;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn max_level(mut self, level: LevelFilter) -> Self {
        self.max_level = level;
        self
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans of this exporter, those
    /// at its [`max_level`](Self::max_level) and above. While the collector is down it
    /// sees no span or event at all, and a span no other layer wants is not made, so
    /// tracing then costs what it costs without this layer.
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("kube-informer"))
            .with_filter(backoff::WhileExported::new(
                self.export.clone(),
                self.max_level,
            ))
    }

    /// Exports the spans ended so far now.
    ///
    /// # Errors
    ///
    /// [`TelemetryError::Flush`] when the collector does not take them.
    pub fn flush(&self) -> Result<(), TelemetryError> {
        self.export
            .flushing(|| self.provider.force_flush())
            .map_err(|e| TelemetryError::Flush(e.to_string()))
    }
}

impl Drop for OtlpTracing {
    fn drop(&mut self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::debug!(%error, "shutting the span exporter down");
        }
    }
}

mod backoff;
pub(crate) mod spans;
