//! The settings every queue kind shares: a name and where its metrics go.

use std::fmt;
use std::sync::Arc;

use super::metrics::MetricsProvider;

/// How to build a queue: its name and its optional metrics provider.
///
/// The name labels the queue's metrics (`name="..."`); a queue without a name, or without a
/// provider, reports no metrics at all and does not pay for them.
///
/// ```
/// use kube_informer::workqueue::{Queue, QueueConfig};
///
/// # #[cfg(feature = "prometheus")] {
/// use kube_informer::workqueue::PrometheusMetrics;
///
/// let mut registry = prometheus_client::registry::Registry::default();
/// let metrics = PrometheusMetrics::new(&mut registry);
/// let queue: Queue<String> = Queue::with_config(QueueConfig::named("pods").metrics(metrics));
/// assert_eq!(queue.name(), "pods");
/// # }
/// ```
#[derive(Clone, Default)]
pub struct QueueConfig {
    pub(crate) name: String,
    pub(crate) metrics: Option<Arc<dyn MetricsProvider>>,
}

impl QueueConfig {
    /// A configuration with this name, the `name` label of the queue's metrics, and no
    /// metrics provider yet (no metrics).
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            metrics: None,
        }
    }

    /// Reports the queue's metrics to `provider`.
    #[must_use]
    pub fn metrics(mut self, provider: impl MetricsProvider + 'static) -> Self {
        self.metrics = Some(Arc::new(provider));
        self
    }
}

impl fmt::Debug for QueueConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueConfig")
            .field("name", &self.name)
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}
