//! Kubernetes Events from a controller: what `kubectl describe` and `kubectl events` show
//! the people who run it.
//!
//! A [`Recorder`] takes [`Event`]s about objects and writes them in the background, as
//! `events.k8s.io/v1` Events (core/v1 Events where that group is not served), reported by
//! a [`Reporter`]: the controller's name and this replica's.
//!
//! - **Series.** Repeats of one Event about one object (the same type, reason, action,
//!   note and related object) within a window (6 minutes by default, as client-go's) are
//!   one Event object whose `series` counts them, as client-go's `tools/events` does. 200
//!   identical warnings make one Event with a series count of 200, not 200 objects.
//! - **A spam filter.** New Events about one object are rate limited (a burst of 25, then
//!   one per 5 minutes, client-go's figures), so an object that flaps between many
//!   different notes cannot flood the API server. Repeats of a series are not limited:
//!   they cost one write per batch, not one per occurrence.
//! - **Never in a reconcile's way.** [`Recorder::publish`] puts the Event in a bounded
//!   buffer and returns. If the buffer is full, or the API server is down or refuses the
//!   write (missing RBAC), the Event is dropped and counted ([`RecorderStats`]); the first
//!   failure of an outage is logged, not every Event.
//! - **Shutdown** writes what is buffered: [`Recorder::shutdown`].
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::Pod;
//! use kube_informer::events::{Event, Recorder, Reporter};
//!
//! # async fn doc(client: kube_client::Client, pod: Pod) {
//! let recorder = Recorder::new(client, Reporter::new("example.com/pod-checker"));
//! recorder.publish_for(
//!     Event::warning("ImagePullFailed", "Check").note("the image is not in the registry"),
//!     &pod,
//! );
//! recorder.shutdown().await;
//! # }
//! ```

#[cfg(feature = "manager")]
pub(crate) mod metrics;
mod series;
mod sink;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::ObjectReference;
use kube_client::Client;
use kube_core::Resource;
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::replica::pod_name;

/// The longest note the API server takes (`events.k8s.io/v1` refuses longer ones).
pub const MAX_NOTE_BYTES: usize = 1024;

/// Whether an Event is routine or worth someone's attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Something went as it should (`Normal`).
    Normal,
    /// Something went wrong, or may (`Warning`).
    Warning,
}

impl EventType {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One thing that happened to an object, to be [published](Recorder::publish).
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    type_: EventType,
    reason: String,
    action: String,
    note: Option<String>,
    related: Option<ObjectReference>,
}

impl Event {
    /// A `Normal` Event: why (`reason`, e.g. `Registered`, UpperCamelCase) and what the
    /// controller did or tried (`action`, e.g. `Register`).
    pub fn normal(reason: impl Into<String>, action: impl Into<String>) -> Self {
        Self::new(EventType::Normal, reason, action)
    }

    /// A `Warning` Event (see [`normal`](Self::normal)).
    pub fn warning(reason: impl Into<String>, action: impl Into<String>) -> Self {
        Self::new(EventType::Warning, reason, action)
    }

    /// An Event of `type_`.
    pub fn new(type_: EventType, reason: impl Into<String>, action: impl Into<String>) -> Self {
        Self {
            type_,
            reason: reason.into(),
            action: action.into(),
            note: None,
            related: None,
        }
    }

    /// A human-readable note; cut at [`MAX_NOTE_BYTES`] (on a character boundary).
    #[must_use]
    pub fn note(mut self, note: impl Into<String>) -> Self {
        let mut note = note.into();
        if note.len() > MAX_NOTE_BYTES {
            let mut end = MAX_NOTE_BYTES;
            while !note.is_char_boundary(end) {
                end -= 1;
            }
            note.truncate(end);
        }
        self.note = Some(note);
        self
    }

    /// A second object the Event is about (a Pod's node, a route's Service).
    #[must_use]
    pub fn related(mut self, related: ObjectReference) -> Self {
        self.related = Some(related);
        self
    }

    /// The Event's type.
    pub fn type_(&self) -> EventType {
        self.type_
    }

    /// Its reason.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Its action.
    pub fn action(&self) -> &str {
        &self.action
    }
}

/// Who reports Events: the controller (`reportingController`, e.g.
/// `example.com/traefik-operator`) and the replica (`reportingInstance`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reporter {
    controller: String,
    instance: String,
}

impl Reporter {
    /// The controller named `controller`, on this replica: its Pod name (`$POD_NAME`,
    /// else the host name).
    pub fn new(controller: impl Into<String>) -> Self {
        Self {
            controller: controller.into(),
            instance: pod_name(),
        }
    }

    /// Names the replica `instance` instead (e.g. the leader election identity).
    #[must_use]
    pub fn instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = instance.into();
        self
    }

    /// The controller's name.
    pub fn controller(&self) -> &str {
        &self.controller
    }

    /// The replica's name.
    pub fn instance_name(&self) -> &str {
        &self.instance
    }
}

/// How a [`Recorder`] buffers, aggregates and filters.
#[derive(Clone, Debug)]
pub struct RecorderConfig {
    buffer: usize,
    series_window: Duration,
    spam_burst: u32,
    spam_period: Duration,
}

impl Default for RecorderConfig {
    fn default() -> Self {
        Self {
            buffer: 1000,
            series_window: Duration::from_secs(6 * 60),
            spam_burst: 25,
            spam_period: Duration::from_secs(5 * 60),
        }
    }
}

impl RecorderConfig {
    /// How many Events wait to be written before more are dropped (default 1,000).
    #[must_use]
    pub fn buffer(mut self, events: usize) -> Self {
        self.buffer = events.max(1);
        self
    }

    /// How long after its last occurrence an Event's series goes on (default 6 minutes).
    #[must_use]
    pub fn series_window(mut self, window: Duration) -> Self {
        self.series_window = window;
        self
    }

    /// New Events about one object: `burst` at once, then one per `period` (default 25,
    /// then one per 5 minutes).
    #[must_use]
    pub fn spam_filter(mut self, burst: u32, period: Duration) -> Self {
        self.spam_burst = burst.max(1);
        self.spam_period = period.max(Duration::from_millis(1));
        self
    }
}

/// What a [`Recorder`] did with the Events published to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecorderStats {
    /// Events published.
    pub published: u64,
    /// Event objects created.
    pub created: u64,
    /// Writes of a higher series count to an Event.
    pub series_updates: u64,
    /// Events dropped because the buffer was full.
    pub dropped_buffer_full: u64,
    /// New Events dropped by the spam filter.
    pub dropped_spam: u64,
    /// Events dropped because the API server refused or did not answer a write (each
    /// occurrence a failed write stood for counts), or published after shutdown.
    pub dropped_failed: u64,
}

impl RecorderStats {
    /// All Events dropped, for whatever reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_buffer_full + self.dropped_spam + self.dropped_failed
    }
}

#[derive(Default)]
struct Counters {
    published: AtomicU64,
    created: AtomicU64,
    series_updates: AtomicU64,
    dropped_buffer_full: AtomicU64,
    dropped_spam: AtomicU64,
    dropped_failed: AtomicU64,
}

/// Writes Kubernetes Events in the background. Cheap to clone: clones share one buffer
/// and writer. The full documentation is on the [module](self).
#[derive(Clone)]
pub struct Recorder {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("reporter", &self.shared.reporter)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

struct Shared {
    reporter: Reporter,
    sender: mpsc::Sender<(Event, ObjectReference)>,
    counters: Arc<Counters>,
    stop: CancellationToken,
    writer: tokio::sync::Mutex<Option<JoinHandle<()>>>,
    /// Whether a full buffer was logged since the last Event that fit.
    full_logged: std::sync::atomic::AtomicBool,
}

impl Recorder {
    /// A recorder writing with `client` for `reporter`, with the default configuration.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime: its writer is a task.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self::with_config(client, reporter, RecorderConfig::default())
    }

    /// A recorder with `config`.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime: its writer is a task.
    pub fn with_config(client: Client, reporter: Reporter, config: RecorderConfig) -> Self {
        let (sender, receiver) = mpsc::channel(config.buffer);
        let counters = Arc::new(Counters::default());
        let stop = CancellationToken::new();
        let writer = sink::Writer::new(client, reporter.clone(), &config, counters.clone());
        let task = tokio::spawn(writer.run(receiver, stop.clone()));
        Self {
            shared: Arc::new(Shared {
                reporter,
                sender,
                counters,
                stop,
                writer: tokio::sync::Mutex::new(Some(task)),
                full_logged: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// Who this recorder reports as.
    pub fn reporter(&self) -> &Reporter {
        &self.shared.reporter
    }

    /// Records `event` about the object `regarding` refers to. Never waits: the Event is
    /// written in the background, or dropped and counted (see the [module](self)).
    pub fn publish(&self, event: Event, regarding: &ObjectReference) {
        let counters = &self.shared.counters;
        counters.published.fetch_add(1, Ordering::Relaxed);
        match self.shared.sender.try_send((event, regarding.clone())) {
            Ok(()) => {
                self.shared.full_logged.store(false, Ordering::Relaxed);
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                counters.dropped_buffer_full.fetch_add(1, Ordering::Relaxed);
                if !self.shared.full_logged.swap(true, Ordering::Relaxed) {
                    warn!(
                        controller = %self.shared.reporter.controller,
                        "event buffer full; dropping events until it drains (counted, not logged)"
                    );
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                counters.dropped_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Records `event` about `object` (see [`publish`](Self::publish)).
    pub fn publish_for<K: Resource<DynamicType = ()>>(&self, event: Event, object: &K) {
        self.publish(event, &object.object_ref(&()));
    }

    /// What this recorder did so far.
    pub fn stats(&self) -> RecorderStats {
        let c = &self.shared.counters;
        RecorderStats {
            published: c.published.load(Ordering::Relaxed),
            created: c.created.load(Ordering::Relaxed),
            series_updates: c.series_updates.load(Ordering::Relaxed),
            dropped_buffer_full: c.dropped_buffer_full.load(Ordering::Relaxed),
            dropped_spam: c.dropped_spam.load(Ordering::Relaxed),
            dropped_failed: c.dropped_failed.load(Ordering::Relaxed),
        }
    }

    /// Writes the Events buffered so far, then stops the writer; Events published after
    /// it are dropped and counted. Bound it with a timeout for a grace period: a write the
    /// timeout interrupts is lost.
    pub async fn shutdown(&self) {
        self.shared.stop.cancel();
        if let Some(task) = self.shared.writer.lock().await.take() {
            let _ = task.await;
        }
    }
}
