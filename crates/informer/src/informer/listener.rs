//! A registered event handler: its buffer, the task that drains it, its registration,
//! and how far behind it is (events waiting, the age of the oldest, events delivered, and
//! how long it took over them).

use std::{
    fmt,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::{
    handler::{EventHandler, Notification},
    sync::HasSynced,
};

/// Waiting events past which a handler's backlog is logged; the log repeats each time the
/// backlog doubles, and once when it has drained below half this.
pub const HANDLER_BACKLOG_WARNING: u64 = 1_000;

/// Upper bounds (seconds) of the processing-time buckets: 10 µs to about 10 s.
const BUCKETS: [f64; 11] = [
    1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 1e-1, 1.0, 10.0,
];

/// One handler's lag, as [`InformerHandle::handler_stats`] and
/// [`HandlerRegistration::stats`] report it.
///
/// [`InformerHandle::handler_stats`]: crate::InformerHandle::handler_stats
/// [`HandlerRegistration::stats`]: crate::HandlerRegistration::stats
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct HandlerStats {
    /// The handler's name ([`add_named_handler`](crate::InformerHandle::add_named_handler)),
    /// or `handler-<n>` in registration order.
    pub name: String,
    /// Events in its buffer, the one it is handling included.
    pub waiting: u64,
    /// How long the oldest of them has waited; zero when none is.
    pub oldest_waiting: Duration,
    /// Events it has finished handling.
    pub delivered: u64,
    /// Total time spent in it.
    pub processing_total: Duration,
    /// Events handled within each bound (seconds), cumulative, as a Prometheus histogram's
    /// buckets.
    pub processing_buckets: Vec<(f64, u64)>,
}

/// The counters one handler's buffer and task share.
#[derive(Debug)]
pub(super) struct Lag {
    name: String,
    queued: AtomicU64,
    delivered: AtomicU64,
    /// When the oldest undelivered event was queued, in nanoseconds since [`epoch`].
    head: AtomicU64,
    processing_nanos: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
    /// The backlog last warned about (0: none since it drained).
    warned: AtomicU64,
}

/// A fixed instant the queue times are counted from, so they fit an atomic.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn nanos_since_epoch(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch()).as_nanos()).unwrap_or(u64::MAX)
}

impl Lag {
    pub(super) fn new(name: String) -> Arc<Self> {
        Arc::new(Self {
            name,
            queued: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            head: AtomicU64::new(0),
            processing_nanos: AtomicU64::new(0),
            buckets: Default::default(),
            warned: AtomicU64::new(0),
        })
    }

    pub(super) fn stats(&self) -> HandlerStats {
        let delivered = self.delivered.load(Ordering::Acquire);
        let waiting = self
            .queued
            .load(Ordering::Acquire)
            .saturating_sub(delivered);
        let oldest_waiting = if waiting == 0 {
            Duration::ZERO
        } else {
            let head = epoch() + Duration::from_nanos(self.head.load(Ordering::Acquire));
            head.elapsed()
        };
        let mut cumulative = 0;
        let processing_buckets = BUCKETS
            .iter()
            .zip(&self.buckets)
            .map(|(bound, count)| {
                cumulative += count.load(Ordering::Relaxed);
                (*bound, cumulative)
            })
            .collect();
        HandlerStats {
            name: self.name.clone(),
            waiting,
            oldest_waiting,
            delivered,
            processing_total: Duration::from_nanos(self.processing_nanos.load(Ordering::Relaxed)),
            processing_buckets,
        }
    }

    /// An event entered the buffer.
    fn queued(&self) {
        let now = Instant::now();
        let before = self.queued.fetch_add(1, Ordering::AcqRel);
        let delivered = self.delivered.load(Ordering::Acquire);
        if before <= delivered {
            // The buffer was empty: this event is the oldest waiting.
            self.head.store(nanos_since_epoch(now), Ordering::Release);
        }
        let waiting = before + 1 - delivered.min(before + 1);
        let warned = self.warned.load(Ordering::Relaxed);
        if waiting >= HANDLER_BACKLOG_WARNING
            && waiting >= warned.saturating_mul(2)
            && self
                .warned
                .compare_exchange(warned, waiting, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let oldest = self.stats().oldest_waiting;
            warn!(handler = %self.name, waiting, ?oldest, "an event handler is falling behind");
        }
    }

    /// The task took an event queued at `queued_at` (the oldest waiting now).
    fn taken(&self, queued_at: Instant) {
        self.head
            .store(nanos_since_epoch(queued_at), Ordering::Release);
    }

    /// The task finished an event after `took`.
    fn delivered(&self, took: Duration) {
        let delivered = self.delivered.fetch_add(1, Ordering::AcqRel) + 1;
        self.processing_nanos.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        let seconds = took.as_secs_f64();
        if let Some(bucket) = BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        let waiting = self
            .queued
            .load(Ordering::Acquire)
            .saturating_sub(delivered);
        if waiting < HANDLER_BACKLOG_WARNING / 2 && self.warned.swap(0, Ordering::Relaxed) > 0 {
            info!(handler = %self.name, waiting, "an event handler has caught up");
        }
    }
}

/// The sending end of a handler's buffer: counts what it queues.
pub(super) struct Outbox<K> {
    tx: mpsc::UnboundedSender<(Instant, Notification<K>)>,
    lag: Arc<Lag>,
}

impl<K> Clone for Outbox<K> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            lag: self.lag.clone(),
        }
    }
}

/// The receiving end, for the handler's task.
pub(super) struct Inbox<K> {
    rx: mpsc::UnboundedReceiver<(Instant, Notification<K>)>,
    lag: Arc<Lag>,
}

/// A handler's buffer, unbounded, with its lag counted.
pub(super) fn buffer<K>(lag: Arc<Lag>) -> (Outbox<K>, Inbox<K>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Outbox {
            tx,
            lag: lag.clone(),
        },
        Inbox { rx, lag },
    )
}

impl<K> Outbox<K> {
    /// The handler's lag now.
    pub(super) fn stats(&self) -> HandlerStats {
        self.lag.stats()
    }

    /// Queues `note`; false once the handler's task has ended (stopped or removed). The
    /// sync mark is no event and is not counted.
    pub(super) fn send(&self, note: Notification<K>) -> bool {
        let counted = !matches!(note, Notification::Synced);
        if self.tx.send((Instant::now(), note)).is_err() {
            return false;
        }
        if counted {
            self.lag.queued();
        }
        true
    }
}

impl<K> Inbox<K> {
    /// The next event, once there is one; `None` once every sender is gone.
    pub(super) async fn recv(&mut self) -> Option<Notification<K>> {
        let (queued_at, note) = self.rx.recv().await?;
        if !matches!(note, Notification::Synced) {
            self.lag.taken(queued_at);
        }
        Some(note)
    }

    /// `note`, the one taken last, was handled in `took`.
    pub(super) fn done(&self, note: &Notification<K>, took: Duration) {
        if !matches!(note, Notification::Synced) {
            self.lag.delivered(took);
        }
    }
}

/// The task of one handler: drains its buffer in order until removed or stopped.
pub(super) async fn run_listener<K: 'static>(
    handler: Box<dyn EventHandler<K>>,
    mut rx: Inbox<K>,
    synced: watch::Sender<bool>,
    cancel: CancellationToken,
) {
    loop {
        let note = tokio::select! {
            biased;
            () = cancel.cancelled() => break,
            n = rx.recv() => match n {
                Some(n) => n,
                None => break,
            },
        };
        let started = tokio::time::Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| match &note {
            Notification::Add { obj, delivery } => handler.on_add(obj, *delivery),
            Notification::Update { old, new, delivery } => handler.on_update(old, new, *delivery),
            Notification::Delete(d) => handler.on_delete(d),
            Notification::Synced => {
                synced.send_replace(true);
            }
        }));
        rx.done(&note, started.elapsed());
        if result.is_err() {
            error!("event handler panicked; continuing with the next event");
        }
    }
}

/// Handle on a registered handler (client-go's `ResourceEventHandlerRegistration`).
///
/// Dropping it keeps the handler registered; call [`remove`](Self::remove) to unregister.
pub struct HandlerRegistration {
    synced: watch::Receiver<bool>,
    remover: Box<dyn Fn() + Send + Sync>,
    lag: Arc<Lag>,
}

impl HandlerRegistration {
    pub(super) fn new(
        synced: watch::Receiver<bool>,
        remover: Box<dyn Fn() + Send + Sync>,
        lag: Arc<Lag>,
    ) -> Self {
        Self {
            synced,
            remover,
            lag,
        }
    }

    /// How far behind the handler is: events waiting, the oldest's age, events delivered,
    /// time spent (see [`HandlerStats`]).
    pub fn stats(&self) -> HandlerStats {
        self.lag.stats()
    }

    /// True once the handler has processed the initial adds (the initial list, or for a
    /// handler added late, the objects cached when it was added).
    pub fn has_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until [`has_synced`](Self::has_synced) (forever if the informer never syncs or
    /// the handler was removed first).
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.clone();
        if rx.wait_for(|s| *s).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Unregisters the handler: it receives nothing more and its task ends.
    pub fn remove(self) {
        (self.remover)();
    }
}

impl HasSynced for HandlerRegistration {
    fn has_synced(&self) -> bool {
        HandlerRegistration::has_synced(self)
    }

    fn synced_receiver(&self) -> watch::Receiver<bool> {
        self.synced.clone()
    }
}

impl fmt::Debug for HandlerRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerRegistration")
            .field("has_synced", &self.has_synced())
            .finish()
    }
}
