//! A registered event handler: its buffer, the task that drains it, its registration,
//! and how far behind it is (events waiting, the age of the oldest, events delivered, and
//! how long it took over them).

use std::{
    collections::{HashMap, VecDeque},
    fmt,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{
        Arc, Mutex, MutexGuard, OnceLock, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use kube_core::Resource;
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::{
    handler::{Delivery, Notification, Registered},
    latency::Latency,
    sync::HasSynced,
};
use crate::key::ObjectKey;

/// Waiting events past which a handler's backlog is logged; the log repeats each time the
/// backlog doubles, and once when it has drained below half this.
pub const HANDLER_BACKLOG_WARNING: u64 = 1_000;

/// Events waiting past which a handler's buffer coalesces per object.
///
/// Up to this many, a handler receives every event as it happened. From then on, an event
/// of an object that already has one waiting merges into it: an update into the waiting
/// add or update (the handler sees the newest state, from the oldest `old`), a delete
/// replaces a waiting update, and a delete cancels a waiting add (the handler never saw
/// the object). A delete followed by a re-add stays two events. So a handler that never
/// returns holds at most this many events plus three per object (an add of the initial
/// replay, a delete and a re-add), whatever the rate of change: its buffer is bounded by
/// the number of objects, whose states it shares with the cache, not by time.
/// [`HandlerStats::coalesced`] counts the merged events.
pub const HANDLER_COALESCE_AFTER: u64 = 1_000;

/// One handler's lag, as [`InformerHandle::handler_stats`] and
/// [`HandlerRegistration::stats`] report it.
///
/// [`InformerHandle::handler_stats`]: crate::InformerHandle::handler_stats
/// [`HandlerRegistration::stats`]: crate::informer::HandlerRegistration::stats
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
    /// Events that never reached it on their own because it was behind: merged into an
    /// event of the same object already waiting (see [`HANDLER_COALESCE_AFTER`]).
    pub coalesced: u64,
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
    /// Entries in the buffer plus the one being handled.
    waiting: AtomicU64,
    delivered: AtomicU64,
    coalesced: AtomicU64,
    /// When the oldest undelivered event was queued, in nanoseconds since [`epoch`].
    head: AtomicU64,
    processing: Latency,
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
            waiting: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            coalesced: AtomicU64::new(0),
            head: AtomicU64::new(0),
            processing: Latency::default(),
            warned: AtomicU64::new(0),
        })
    }

    fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Acquire)
    }

    pub(super) fn stats(&self) -> HandlerStats {
        let waiting = self.waiting();
        let oldest_waiting = if waiting == 0 {
            Duration::ZERO
        } else {
            let head = epoch() + Duration::from_nanos(self.head.load(Ordering::Acquire));
            head.elapsed()
        };
        HandlerStats {
            name: self.name.clone(),
            waiting,
            oldest_waiting,
            delivered: self.delivered.load(Ordering::Acquire),
            coalesced: self.coalesced.load(Ordering::Relaxed),
            processing_total: self.processing.total(),
            processing_buckets: self.processing.cumulative_buckets(),
        }
    }

    /// An event queued at `now` entered the buffer as an entry of its own.
    fn queued(&self, now: Instant) {
        let waiting = self.waiting.fetch_add(1, Ordering::AcqRel) + 1;
        if waiting == 1 {
            // The buffer was empty: this event is the oldest waiting.
            self.head.store(nanos_since_epoch(now), Ordering::Release);
        }
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

    /// An event merged into one waiting.
    fn merged(&self) {
        self.coalesced.fetch_add(1, Ordering::Relaxed);
    }

    /// An event cancelled the add waiting for its object: two events gone, one entry.
    fn cancelled(&self) {
        self.coalesced.fetch_add(2, Ordering::Relaxed);
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }

    /// The task took an event queued at `queued_at` (the oldest waiting now).
    fn taken(&self, queued_at: Instant) {
        self.head
            .store(nanos_since_epoch(queued_at), Ordering::Release);
    }

    /// The task finished an event after `took`.
    fn delivered(&self, took: Duration) {
        self.delivered.fetch_add(1, Ordering::AcqRel);
        let waiting = self.waiting.fetch_sub(1, Ordering::AcqRel) - 1;
        self.processing.record(took);
        if waiting < HANDLER_BACKLOG_WARNING / 2 && self.warned.swap(0, Ordering::Relaxed) > 0 {
            info!(handler = %self.name, waiting, "an event handler has caught up");
        }
    }
}

/// The buffer's lock. Handlers run outside it, so a handler's panic cannot poison it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One event in a handler's buffer.
struct Entry<K> {
    queued_at: Instant,
    note: Notification<K>,
    /// The object's key, for an entry later events of the same object may merge into.
    key: Option<ObjectKey>,
}

/// Where the entries a key's next event may merge into are: its latest, and a delete
/// waiting before it (a delete then a re-add cannot merge into one event).
#[derive(Clone, Copy)]
struct Pending {
    latest: u64,
    delete_before: Option<u64>,
}

/// A handler's buffer: a FIFO that keeps every event until [`HANDLER_COALESCE_AFTER`] wait,
/// then merges each further event into the one its object already has waiting.
struct Queue<K> {
    /// Merged-away entries stay as `None` until [`compact`](Self::compact).
    entries: VecDeque<Option<Entry<K>>>,
    /// The sequence number of `entries[0]`.
    first: u64,
    /// Entries that are `Some`.
    live: usize,
    /// The mergeable entries waiting, by key.
    pending: HashMap<ObjectKey, Pending>,
    senders: usize,
    receiver_gone: bool,
}

/// Merged-away entries tolerated before the buffer is rebuilt without them.
const TOMBSTONES_BEFORE_COMPACTION: usize = 1_024;

/// What became of an event offered to the buffer.
enum Queued {
    /// It waits as an entry of its own.
    Appended,
    /// It merged into its object's waiting event.
    Merged,
    /// It cancelled its object's waiting add (an object added then deleted while the
    /// handler was behind): both are gone.
    Cancelled,
}

impl<K> Queue<K> {
    fn slot(&mut self, seq: u64) -> Option<&mut Entry<K>> {
        let at = usize::try_from(seq.checked_sub(self.first)?).ok()?;
        self.entries.get_mut(at)?.as_mut()
    }

    fn push(&mut self, entry: Entry<K>) -> u64 {
        let seq = self.first + self.entries.len() as u64;
        self.entries.push_back(Some(entry));
        self.live += 1;
        seq
    }

    /// Merges `note` of `key` into what the key has waiting, or appends it (indexed).
    fn offer(&mut self, key: ObjectKey, note: Notification<K>, now: Instant) -> Queued {
        let Some(pending) = self.pending.get(&key).copied() else {
            return self.push_mergeable(key, note, now, None);
        };
        let Some(waiting) = self.slot(pending.latest) else {
            // Unreachable while the index is kept right; appending is always safe.
            self.pending.remove(&key);
            return self.offer(key, note, now);
        };
        match (&mut waiting.note, note) {
            (Notification::Add { obj, .. }, Notification::Update { new, .. }) => {
                *obj = new;
                Queued::Merged
            }
            (
                Notification::Update {
                    new,
                    delivery: waiting_delivery,
                    ..
                },
                Notification::Update {
                    new: newer,
                    delivery,
                    ..
                },
            ) => {
                *new = newer;
                if delivery == Delivery::Live {
                    *waiting_delivery = Delivery::Live;
                }
                Queued::Merged
            }
            (Notification::Update { .. }, deleted @ Notification::Delete(_)) => {
                waiting.note = deleted;
                Queued::Merged
            }
            (Notification::Add { .. }, Notification::Delete(_)) => {
                // The handler never saw this object: neither event reaches it. A delete
                // waiting before the add stays, with the final state it reported.
                self.entries[(pending.latest - self.first) as usize] = None;
                self.live -= 1;
                match pending.delete_before {
                    Some(delete) => {
                        self.pending.insert(
                            key,
                            Pending {
                                latest: delete,
                                delete_before: None,
                            },
                        );
                    }
                    None => {
                        self.pending.remove(&key);
                    }
                }
                self.compact();
                Queued::Cancelled
            }
            (_, note) => {
                // A delete then a re-add, or an order the informer does not produce: the
                // event waits on its own.
                let delete_before =
                    matches!(waiting.note, Notification::Delete(_)).then_some(pending.latest);
                self.push_mergeable(key, note, now, delete_before)
            }
        }
    }

    /// Appends `note` as the entry later events of `key` merge into, after the delete at
    /// `delete_before` if one waits.
    fn push_mergeable(
        &mut self,
        key: ObjectKey,
        note: Notification<K>,
        now: Instant,
        delete_before: Option<u64>,
    ) -> Queued {
        let latest = self.push(Entry {
            queued_at: now,
            note,
            key: Some(key.clone()),
        });
        self.pending.insert(
            key,
            Pending {
                latest,
                delete_before,
            },
        );
        Queued::Appended
    }

    fn pop(&mut self) -> Option<Entry<K>> {
        while let Some(slot) = self.entries.pop_front() {
            let seq = self.first;
            self.first += 1;
            let Some(entry) = slot else { continue };
            self.live -= 1;
            if let Some(key) = &entry.key
                && let Some(pending) = self.pending.get_mut(key)
            {
                if pending.latest == seq {
                    self.pending.remove(key);
                } else if pending.delete_before == Some(seq) {
                    pending.delete_before = None;
                }
            }
            if self.entries.is_empty() {
                self.release_spare_capacity();
            }
            return Some(entry);
        }
        None
    }

    /// Rebuilds the buffer without its merged-away entries once they outnumber the others.
    fn compact(&mut self) {
        let tombstones = self.entries.len() - self.live;
        if tombstones < TOMBSTONES_BEFORE_COMPACTION || tombstones < self.live {
            return;
        }
        let old_first = self.first;
        let mut moved = HashMap::new();
        let entries: VecDeque<_> = std::mem::take(&mut self.entries)
            .into_iter()
            .enumerate()
            .filter_map(|(at, slot)| slot.map(|entry| (old_first + at as u64, entry)))
            .enumerate()
            .map(|(at, (old, entry))| {
                if entry.key.is_some() {
                    moved.insert(old, old_first + at as u64);
                }
                Some(entry)
            })
            .collect();
        self.entries = entries;
        for pending in self.pending.values_mut() {
            pending.latest = moved[&pending.latest];
            pending.delete_before = pending.delete_before.map(|seq| moved[&seq]);
        }
    }

    /// A drained buffer gives back what a backlog made it grow to.
    fn release_spare_capacity(&mut self) {
        const KEPT: usize = 16;
        if self.entries.capacity() > 4 * KEPT {
            self.entries.shrink_to(KEPT);
        }
        if self.pending.capacity() > 4 * KEPT {
            self.pending.shrink_to(KEPT);
        }
    }
}

struct Buffer<K> {
    queue: Mutex<Queue<K>>,
    ready: Notify,
    lag: Arc<Lag>,
}

/// The sending end of a handler's buffer: counts what it queues.
pub(super) struct Outbox<K> {
    buffer: Arc<Buffer<K>>,
}

impl<K> Clone for Outbox<K> {
    fn clone(&self) -> Self {
        lock(&self.buffer.queue).senders += 1;
        Self {
            buffer: self.buffer.clone(),
        }
    }
}

impl<K> Drop for Outbox<K> {
    fn drop(&mut self) {
        let mut queue = lock(&self.buffer.queue);
        queue.senders -= 1;
        if queue.senders == 0 {
            drop(queue);
            self.buffer.ready.notify_one();
        }
    }
}

/// The receiving end, for the handler's task.
pub(super) struct Inbox<K> {
    buffer: Arc<Buffer<K>>,
}

impl<K> Drop for Inbox<K> {
    fn drop(&mut self) {
        let mut queue = lock(&self.buffer.queue);
        queue.receiver_gone = true;
        queue.entries = VecDeque::new();
        queue.pending = HashMap::new();
        queue.live = 0;
    }
}

/// A handler's buffer, with its lag counted. It keeps every event in order until
/// [`HANDLER_COALESCE_AFTER`] wait, then coalesces per object.
pub(super) fn buffer<K>(lag: Arc<Lag>) -> (Outbox<K>, Inbox<K>) {
    let buffer = Arc::new(Buffer {
        queue: Mutex::new(Queue {
            entries: VecDeque::new(),
            first: 0,
            live: 0,
            pending: HashMap::new(),
            senders: 1,
            receiver_gone: false,
        }),
        ready: Notify::new(),
        lag,
    });
    (
        Outbox {
            buffer: buffer.clone(),
        },
        Inbox { buffer },
    )
}

/// The key of the object `note` is about, when later events of it may merge into it: not
/// the sync mark, nor an add of the initial replay (one per object, so bounded already, and
/// merging one would move the handler's sync).
fn mergeable_key<K: Resource>(note: &Notification<K>) -> Option<ObjectKey> {
    match note {
        Notification::Add {
            delivery: Delivery::InitialList,
            ..
        }
        | Notification::AddKey(_)
        | Notification::Synced => None,
        Notification::Add { obj, .. } => ObjectKey::from_object(&**obj).ok(),
        Notification::Update { new, .. } => ObjectKey::from_object(&**new).ok(),
        Notification::Delete(deleted) => Some(deleted.key()),
    }
}

impl<K> Outbox<K> {
    /// The handler's lag now.
    pub(super) fn stats(&self) -> HandlerStats {
        self.buffer.lag.stats()
    }
}

impl<K: Resource> Outbox<K> {
    /// Queues `note`; false once the handler's task has ended (stopped or removed). The
    /// sync mark is no event and is not counted.
    pub(super) fn send(&self, note: Notification<K>) -> bool {
        let lag = &self.buffer.lag;
        let now = Instant::now();
        let mut queue = lock(&self.buffer.queue);
        if queue.receiver_gone {
            return false;
        }
        let behind = lag.waiting() >= HANDLER_COALESCE_AFTER;
        let key = if behind || !queue.pending.is_empty() {
            mergeable_key(&note)
        } else {
            None
        };
        let counted = !matches!(note, Notification::Synced);
        let queued = match key {
            Some(key) if behind || queue.pending.contains_key(&key) => queue.offer(key, note, now),
            _ => {
                queue.push(Entry {
                    queued_at: now,
                    note,
                    key: None,
                });
                Queued::Appended
            }
        };
        // Counted under the buffer's lock, so the task never finishes an event before it
        // was counted in.
        match queued {
            Queued::Appended if counted => lag.queued(now),
            Queued::Appended => {}
            Queued::Merged => lag.merged(),
            Queued::Cancelled => lag.cancelled(),
        }
        drop(queue);
        self.buffer.ready.notify_one();
        true
    }
}

impl<K> Inbox<K> {
    /// The next event, once there is one; `None` once every sender is gone.
    pub(super) async fn recv(&mut self) -> Option<Notification<K>> {
        loop {
            {
                let mut queue = lock(&self.buffer.queue);
                if let Some(entry) = queue.pop() {
                    drop(queue);
                    if !matches!(entry.note, Notification::Synced) {
                        self.buffer.lag.taken(entry.queued_at);
                    }
                    return Some(entry.note);
                }
                if queue.senders == 0 {
                    return None;
                }
            }
            // A send between the check and this wait leaves a permit: no wake-up is lost.
            self.buffer.ready.notified().await;
        }
    }

    /// `note`, the one taken last, was handled in `took`.
    pub(super) fn done(&self, note: &Notification<K>, took: Duration) {
        if !matches!(note, Notification::Synced) {
            self.buffer.lag.delivered(took);
        }
    }
}

/// The task of one handler: drains its buffer in order until removed or stopped.
pub(super) async fn run_listener<K: 'static>(
    registered: Registered<K>,
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
        let handler = registered.handler();
        let result = catch_unwind(AssertUnwindSafe(|| match &note {
            Notification::Add { obj, delivery } => handler.on_add(obj, *delivery),
            Notification::AddKey(key) => registered.on_initial_key(key),
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

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_core::ObjectMeta;

    use super::*;

    fn cm(name: &str, version: u64) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("ns".to_owned()),
                resource_version: Some(version.to_string()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        })
    }

    fn add(name: &str, version: u64) -> Notification<ConfigMap> {
        Notification::Add {
            obj: cm(name, version),
            delivery: Delivery::Live,
        }
    }

    fn update(name: &str, from: u64, to: u64, delivery: Delivery) -> Notification<ConfigMap> {
        Notification::Update {
            old: cm(name, from),
            new: cm(name, to),
            delivery,
        }
    }

    fn delete(name: &str, version: u64) -> Notification<ConfigMap> {
        Notification::Delete(super::super::handler::DeletedObject::Final(cm(
            name, version,
        )))
    }

    /// What a handler receives, as text: `add a@1`, `update a@1->3 Live`, `delete a@2`.
    fn describe(note: &Notification<ConfigMap>) -> String {
        let at = |o: &ConfigMap| {
            format!(
                "{}@{}",
                o.metadata.name.as_deref().unwrap_or(""),
                o.metadata.resource_version.as_deref().unwrap_or("")
            )
        };
        match note {
            Notification::Add { obj, .. } => format!("add {}", at(obj)),
            Notification::Update { old, new, delivery } => {
                format!("update {}->{} {delivery:?}", at(old), at(new))
            }
            Notification::Delete(d) => format!("delete {}", at(d.object())),
            Notification::AddKey(key) => format!("key {key}"),
            Notification::Synced => "synced".to_owned(),
        }
    }

    /// Drains what is waiting, counting each as delivered.
    async fn drain(inbox: &mut Inbox<ConfigMap>) -> Vec<String> {
        let mut seen = Vec::new();
        while inbox.buffer.lag.waiting() > 0 {
            let note = inbox.recv().await.expect("an event is waiting");
            seen.push(describe(&note));
            inbox.done(&note, Duration::ZERO);
        }
        seen
    }

    /// Fills the buffer to the coalescing threshold with adds of other objects.
    fn fill(outbox: &Outbox<ConfigMap>) {
        for i in 0..HANDLER_COALESCE_AFTER {
            assert!(outbox.send(add(&format!("filler-{i}"), 1)));
        }
    }

    #[tokio::test]
    async fn below_the_threshold_every_event_is_delivered_as_it_happened() {
        let (outbox, mut inbox) = buffer(Lag::new("h".into()));
        outbox.send(add("a", 1));
        for version in 1..10 {
            outbox.send(update("a", version, version + 1, Delivery::Live));
        }
        outbox.send(delete("a", 10));
        let seen = drain(&mut inbox).await;
        assert_eq!(seen.len(), 11, "{seen:?}");
        assert_eq!(seen[0], "add a@1");
        assert_eq!(seen[5], "update a@5->a@6 Live");
        assert_eq!(seen[10], "delete a@10");
        assert_eq!(inbox.buffer.lag.stats().coalesced, 0);
    }

    #[tokio::test]
    async fn past_the_threshold_events_of_one_object_merge_into_the_one_waiting() {
        let (outbox, mut inbox) = buffer(Lag::new("h".into()));
        fill(&outbox);
        outbox.send(update("a", 1, 2, Delivery::Resync));
        for version in 2..500 {
            outbox.send(update("a", version, version + 1, Delivery::Live));
        }
        outbox.send(update("a", 500, 500, Delivery::Resync));
        outbox.send(add("b", 1));
        outbox.send(update("b", 1, 2, Delivery::Live));
        outbox.send(update("c", 1, 2, Delivery::Live));
        outbox.send(delete("c", 3));
        let stats = inbox.buffer.lag.stats();
        assert_eq!(stats.waiting, HANDLER_COALESCE_AFTER + 3);
        assert_eq!(stats.coalesced, 498 + 1 + 1 + 1);
        let seen = drain(&mut inbox).await;
        assert_eq!(
            seen[HANDLER_COALESCE_AFTER as usize..],
            [
                // From the oldest old to the newest new; live since one of them was.
                "update a@1->a@500 Live",
                "add b@2",
                "delete c@3",
            ]
        );
        assert_eq!(
            inbox.buffer.lag.stats().delivered,
            HANDLER_COALESCE_AFTER + 3
        );
    }

    #[tokio::test]
    async fn an_add_and_its_delete_cancel_out_but_a_delete_and_a_re_add_do_not() {
        let (outbox, mut inbox) = buffer(Lag::new("h".into()));
        fill(&outbox);
        // Never seen by the handler: gone without a trace.
        outbox.send(add("new", 1));
        outbox.send(update("new", 1, 2, Delivery::Live));
        outbox.send(delete("new", 3));
        // Seen before: its delete stays, and a re-add after it stays apart.
        outbox.send(delete("old", 4));
        outbox.send(add("old", 5));
        outbox.send(update("old", 5, 6, Delivery::Live));
        let stats = inbox.buffer.lag.stats();
        assert_eq!(stats.waiting, HANDLER_COALESCE_AFTER + 2);
        assert_eq!(stats.coalesced, 1 + 2 + 1);
        // The re-added object deleted again: only the first delete remains.
        outbox.send(delete("old", 7));
        assert_eq!(inbox.buffer.lag.stats().waiting, HANDLER_COALESCE_AFTER + 1);
        outbox.send(add("old", 8));
        let seen = drain(&mut inbox).await;
        assert_eq!(
            seen[HANDLER_COALESCE_AFTER as usize..],
            ["delete old@4", "add old@8"]
        );
    }

    #[tokio::test]
    async fn a_stuck_handler_s_buffer_is_bounded_by_its_objects_whatever_the_events() {
        const OBJECTS: u64 = 100;
        let (outbox, mut inbox) = buffer(Lag::new("stuck".into()));
        fill(&outbox);
        // 100,000 events: every object updated, deleted and re-added, over and over.
        for round in 0..250 {
            for i in 0..OBJECTS {
                let name = format!("cm-{i}");
                let v = round * 4;
                outbox.send(add(&name, v + 1));
                outbox.send(update(&name, v + 1, v + 2, Delivery::Live));
                outbox.send(update(&name, v + 2, v + 2, Delivery::Resync));
                outbox.send(delete(&name, v + 3));
            }
        }
        let (live, kept) = {
            let queue = lock(&inbox.buffer.queue);
            (queue.live, queue.entries.len())
        };
        let bound = (HANDLER_COALESCE_AFTER + 3 * OBJECTS) as usize;
        assert!(live <= bound, "{live} waiting");
        assert!(
            kept <= 2 * bound + TOMBSTONES_BEFORE_COMPACTION,
            "{kept} entries kept"
        );
        let stats = inbox.buffer.lag.stats();
        assert_eq!(stats.coalesced, 250 * OBJECTS * 4);
        assert_eq!(stats.waiting, HANDLER_COALESCE_AFTER);
        let seen = drain(&mut inbox).await;
        assert_eq!(seen.len(), HANDLER_COALESCE_AFTER as usize);
        assert!(lock(&inbox.buffer.queue).pending.is_empty());
    }

    #[tokio::test]
    async fn a_removed_handler_s_buffer_refuses_events_and_a_closed_one_ends() {
        let (outbox, inbox) = buffer::<ConfigMap>(Lag::new("h".into()));
        assert!(outbox.send(add("a", 1)));
        drop(inbox);
        assert!(!outbox.send(add("b", 1)), "the handler's task has ended");

        let (outbox, mut inbox) = buffer::<ConfigMap>(Lag::new("h".into()));
        let second = outbox.clone();
        outbox.send(add("a", 1));
        drop(outbox);
        drop(second);
        assert!(
            inbox.recv().await.is_some(),
            "what was sent is still delivered"
        );
        assert!(inbox.recv().await.is_none(), "then the buffer ends");
    }
}
