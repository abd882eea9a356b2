//! What the run watches in its own process: panics, errors logged without their cause,
//! and memory over time.

use std::{
    fmt,
    sync::{
        Arc, Mutex, OnceLock, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use serde::Serialize;
use tracing::{
    Event, Level, Subscriber,
    field::{Field, Visit},
};
use tracing_subscriber::{Layer, layer::Context};

/// Panics anywhere in the process, caught or not.
static PANICS: AtomicU64 = AtomicU64::new(0);
static PANIC_MESSAGES: OnceLock<Mutex<Vec<String>>> = OnceLock::new();

/// Counts every panic, then reports it as before.
pub fn count_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::Relaxed);
        PANIC_MESSAGES
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(info.to_string());
        previous(info);
    }));
}

/// The panics so far.
pub fn panics() -> Vec<String> {
    PANIC_MESSAGES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Error-level events of kube-informer and of the run logged without a field that says
/// why (`error`, `reason`, `cause`, `panic`).
#[derive(Clone, Default)]
pub struct Uncaused(Arc<Mutex<Vec<String>>>);

impl Uncaused {
    pub fn snapshot(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl<S: Subscriber> Layer<S> for Uncaused {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        // The library's logs and the run's own; other crates log as they do (kube-client
        // logs every failed request at error level, its cause in the message).
        let target = event.metadata().target();
        if *event.metadata().level() != Level::ERROR
            || !(target.starts_with("kube_informer") || target.starts_with("soak"))
        {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if !fields.caused {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(format!("{}: {}", event.metadata().target(), fields.message));
        }
    }
}

#[derive(Default)]
struct Fields {
    caused: bool,
    message: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "error" | "reason" | "cause" | "panic" => self.caused = true,
            _ => {}
        }
    }
}

/// One memory sample.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MemorySample {
    /// Seconds since the load started.
    pub at_s: f64,
    /// The driver's resident set, which holds kube-informer's subject (and the writer
    /// and records), KiB.
    pub driver_kib: u64,
    /// client-go's subject's resident set, KiB.
    pub client_go_kib: u64,
}

/// The resident set of a process, KiB; 0 if it is gone.
pub fn rss_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
