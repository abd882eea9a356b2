//! Reconcile metrics in a `prometheus-client` registry, under controller-runtime's names.

use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

/// controller-runtime's reconcile metrics, recorded by every
/// [`Controller`](crate::Controller) given this (share one per registry;
/// cheap to clone), each labelled with the controller's name:
///
/// | metric | type | meaning |
/// |---|---|---|
/// | `controller_runtime_reconcile_total{result}` | counter | reconciles by result: `success`, `requeue_after`, `error` |
/// | `controller_runtime_reconcile_errors_total` | counter | reconciles that failed |
/// | `controller_runtime_terminal_reconcile_errors_total` | counter | failures the error policy gave up on |
/// | `controller_runtime_reconcile_panics_total` | counter | reconciles that panicked |
/// | `controller_runtime_reconcile_time_seconds` | histogram | time per reconcile |
/// | `controller_runtime_active_workers` | gauge | workers reconciling now |
/// | `controller_runtime_max_concurrent_reconciles` | gauge | workers configured |
/// | `controller_own_write_waits_total` | counter | reads of the [controller's client](crate::ControllerClient) that waited for the cache to observe the controller's own writes |
/// | `controller_own_write_timeouts_total` | counter | those that gave up waiting |
/// | `controller_own_write_wait_seconds` | histogram | how long they waited |
///
/// ```no_run
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{Controller, controller::ControllerMetrics, InformerFactory, Scope};
/// use prometheus_client::{encoding::text::encode, registry::Registry};
///
/// # fn doc(factory: InformerFactory) {
/// let mut registry = Registry::default();
/// let metrics = ControllerMetrics::new(&mut registry);
/// let controller = Controller::new("config-maps", factory.informer::<ConfigMap>(Scope::all()))
///     .reconcile_metrics(metrics.clone());
/// // ... run it; then, on a scrape:
/// let mut text = String::new();
/// encode(&mut text, &registry).unwrap();
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    total: Family<ResultLabels, Counter>,
    errors: Family<ControllerLabels, Counter>,
    terminal_errors: Family<ControllerLabels, Counter>,
    panics: Family<ControllerLabels, Counter>,
    time: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    active_workers: Family<ControllerLabels, Gauge>,
    max_concurrent: Family<ControllerLabels, Gauge>,
    own_write_waits: Family<ControllerLabels, Counter>,
    own_write_timeouts: Family<ControllerLabels, Counter>,
    own_write_wait: Family<ControllerLabels, Histogram, fn() -> Histogram>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: String,
    result: &'static str,
}

/// How a reconcile ended, as `controller_runtime_reconcile_total` labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    Success,
    RequeueAfter,
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::RequeueAfter => "requeue_after",
            Outcome::Error => "error",
        }
    }
}

/// controller-runtime's buckets for `reconcile_time_seconds`, 5 ms to 60 s.
fn reconcile_time_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Waits for a watch event: 1 ms to about 16 s.
fn own_write_wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

impl ControllerMetrics {
    /// Registers the reconcile metrics in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            total: Family::default(),
            errors: Family::default(),
            terminal_errors: Family::default(),
            panics: Family::default(),
            time: Family::new_with_constructor(reconcile_time_histogram),
            active_workers: Family::default(),
            max_concurrent: Family::default(),
            own_write_waits: Family::default(),
            own_write_timeouts: Family::default(),
            own_write_wait: Family::new_with_constructor(own_write_wait_histogram),
        };
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            metrics.total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            metrics.errors.clone(),
        );
        registry.register(
            "controller_runtime_terminal_reconcile_errors",
            "Total number of terminal reconciliation errors per controller",
            metrics.terminal_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_panics",
            "Total number of reconciliation panics per controller",
            metrics.panics.clone(),
        );
        registry.register_with_unit(
            "controller_runtime_reconcile_time",
            "Length of time per reconciliation per controller",
            Unit::Seconds,
            metrics.time.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            metrics.active_workers.clone(),
        );
        registry.register(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            metrics.max_concurrent.clone(),
        );
        registry.register(
            "controller_own_write_waits",
            "Reads that waited for the cache to observe the controller's own writes",
            metrics.own_write_waits.clone(),
        );
        registry.register(
            "controller_own_write_timeouts",
            "Reads that gave up waiting for the cache to observe the controller's own writes",
            metrics.own_write_timeouts.clone(),
        );
        registry.register_with_unit(
            "controller_own_write_wait",
            "Time reads waited for the cache to observe the controller's own writes",
            Unit::Seconds,
            metrics.own_write_wait.clone(),
        );
        metrics
    }

    /// The handles of one controller.
    pub(super) fn for_controller(&self, name: &str, workers: usize) -> Recorder {
        let labels = ControllerLabels {
            controller: name.to_owned(),
        };
        let result = |outcome: Outcome| {
            self.total.get_or_create_owned(&ResultLabels {
                controller: name.to_owned(),
                result: outcome.label(),
            })
        };
        let recorder = Recorder {
            success: result(Outcome::Success),
            requeue_after: result(Outcome::RequeueAfter),
            error: result(Outcome::Error),
            errors: self.errors.get_or_create_owned(&labels),
            terminal_errors: self.terminal_errors.get_or_create_owned(&labels),
            panics: self.panics.get_or_create_owned(&labels),
            time: self.time.get_or_create_owned(&labels),
            active_workers: self.active_workers.get_or_create_owned(&labels),
        };
        self.max_concurrent
            .get_or_create(&labels)
            .set(i64::try_from(workers).unwrap_or(i64::MAX));
        recorder
    }

    /// The own-write handles of one controller.
    pub(super) fn own_writes_of(&self, name: &str) -> OwnWriteRecorder {
        let labels = ControllerLabels {
            controller: name.to_owned(),
        };
        OwnWriteRecorder {
            waits: self.own_write_waits.get_or_create_owned(&labels),
            timeouts: self.own_write_timeouts.get_or_create_owned(&labels),
            wait: self.own_write_wait.get_or_create_owned(&labels),
        }
    }
}

/// One controller's own-write metric handles.
#[derive(Clone, Debug)]
pub(super) struct OwnWriteRecorder {
    waits: Counter,
    timeouts: Counter,
    wait: Histogram,
}

impl OwnWriteRecorder {
    pub(super) fn waited(&self, took: Duration, timed_out: bool) {
        self.waits.inc();
        self.wait.observe(took.as_secs_f64());
        if timed_out {
            self.timeouts.inc();
        }
    }
}

/// One controller's metric handles (sharing their atomics with the registry's families).
#[derive(Clone, Debug)]
pub(super) struct Recorder {
    success: Counter,
    requeue_after: Counter,
    error: Counter,
    errors: Counter,
    terminal_errors: Counter,
    panics: Counter,
    time: Histogram,
    active_workers: Gauge,
}

impl Recorder {
    pub(super) fn started(&self) {
        self.active_workers.inc();
    }

    pub(super) fn finished(&self, outcome: Outcome, took: Duration) {
        self.active_workers.dec();
        self.time.observe(took.as_secs_f64());
        match outcome {
            Outcome::Success => {
                self.success.inc();
            }
            Outcome::RequeueAfter => {
                self.requeue_after.inc();
            }
            Outcome::Error => {
                self.error.inc();
                self.errors.inc();
            }
        }
    }

    /// A reconcile dropped because its controller stopped: no longer active, and no
    /// outcome to count.
    pub(super) fn cancelled(&self) {
        self.active_workers.dec();
    }

    pub(super) fn panicked(&self) {
        self.panics.inc();
    }

    pub(super) fn gave_up(&self) {
        self.terminal_errors.inc();
    }
}
