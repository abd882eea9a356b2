//! The basic work queue: fair, deduplicating, and never handing one item to two workers.
//!
//! [`Queue`] is client-go's `workqueue.Typed` for tokio. Producers (usually informer event
//! handlers) [`add`](Queue::add) keys; workers loop on [`get`](Queue::get), process the key
//! and call [`done`](Queue::done). Between those two calls the key is *processing*:
//!
//! * a key waiting in the queue is there once, however often it is added (it is *dirty*);
//! * a key added while it is processing is not handed to a second worker, it is queued
//!   again when the first worker calls `done`, so that the latest change is never missed;
//! * otherwise keys come out in the order they went in.
//!
//! Because a key stands for "the object with this name changed, look at it", collapsing
//! duplicates loses nothing and bounds the queue by the number of objects, not of events.

use std::collections::VecDeque;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::ops::Deref;
use std::pin::pin;
use std::sync::{Arc, Weak};

use hashbrown::hash_table::{self, HashTable};
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::config::QueueConfig;
use super::metrics::{InFlightProbe, InFlightSnapshot, InFlightSource, QueueMetrics};

/// foldhash rather than SipHash: hashing was a fifth of a queue cycle on object keys. Its
/// per-queue random seed defeats precomputed collisions, the threat here; names are chosen
/// by users who can create objects, not by anyone who can time the queue.
type Hasher = foldhash::fast::RandomState;

/// A work queue shared by producers and workers: client-go's `workqueue.Interface`.
///
/// Producers [`add`](Self::add) keys; workers loop on [`get`](Self::get), process the key
/// and call [`done`](Self::done). Between those two calls the key is *processing*:
///
/// * a key waiting in the queue is there once, however often it is added;
/// * a key is never handed to two workers at once: one added while it is processing is
///   queued again when the first worker calls `done`, so its latest change is not missed;
/// * otherwise keys come out in the order they went in.
///
/// Cloning is cheap and every clone is the same queue.
///
/// # Example
///
/// A worker loop, and a shutdown that lets in-flight work finish:
///
/// ```
/// use kube_informer::workqueue::Queue;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let queue: Queue<String> = Queue::new();
///
/// let worker = tokio::spawn({
///     let queue = queue.clone();
///     async move {
///         let mut handled = Vec::new();
///         while let Some(key) = queue.get().await {
///             handled.push(key.clone()); // reconcile the object named `key` here
///             queue.done(&key);
///         }
///         handled
///     }
/// });
///
/// queue.add("default/web".to_string());
/// queue.add("default/db".to_string());
/// queue.add("default/web".to_string()); // still waiting: collapses into the first add
///
/// queue.shutdown_with_drain().await;
/// assert_eq!(worker.await.unwrap(), ["default/web", "default/db"]);
/// # }
/// ```
pub struct Queue<T> {
    inner: Arc<Inner<T>>,
}

struct Inner<T> {
    /// parking_lot's mutex rather than std's: when a producer and a worker contend for it,
    /// it soon backs off (a few spins, then yields) instead of spinning on the lock's cache
    /// line, which the holder then has to win back; each side then gets several operations
    /// in a row. That alone doubled throughput in the add/get/done benchmark.
    state: Mutex<State<T>>,
    /// Hashes items before the lock is taken, so the critical sections stay short.
    hasher: Hasher,
    /// Wakes workers blocked in `get`: one per newly queued item, all of them on shutdown.
    item_queued: Notify,
    /// Wakes `shutdown_with_drain` when the last in-flight item is done.
    drained: Notify,
    name: String,
    metrics: Option<Box<dyn QueueMetrics>>,
}

struct State<T> {
    /// The items waiting for a worker.
    lanes: Lanes<T>,
    /// Every item that is waiting or processing, with its slot: client-go's `dirty` and
    /// `processing` sets in one table, so that each `add` and `done` looks the item up once,
    /// with a hash computed before the lock is taken.
    items: HashTable<Entry<T>>,
    /// How many items `items` held room for when it last grew or was rehashed, which
    /// clears the room deleted items use up until then.
    room: usize,
    /// Each item's phase and times, by the slot its entry keeps.
    slots: Slots,
    processing: usize,
    /// Workers that found nothing in `get` and wait for `item_queued`, less those an `add`
    /// or `done` has already woken for an item: queueing an item only notifies while this
    /// is positive, so a busy queue never touches the `Notify`. A `get` dropped while
    /// waiting stays counted; the next item then notifies once for nothing, which is harmless.
    sleepers: usize,
    shutting_down: bool,
    /// Whether `shutdown_with_drain` waits, so that `done` only wakes it then.
    draining: bool,
}

/// An item of `State::items`.
struct Entry<T> {
    item: T,
    slot: u32,
    /// The item's [`ItemHash`], so that growing the table never hashes an item again (nor
    /// reads it, when it is behind a pointer).
    hash: ItemHash,
}

/// 32 bits of an item's hash: as many as a table of fewer than 2^32 items can use, and
/// beside the `u32` slot they cost no room in an [`Entry`].
#[derive(Clone, Copy)]
struct ItemHash(u32);

impl ItemHash {
    fn of<T: Hash>(item: &T, hasher: &Hasher) -> Self {
        let hash = hasher.hash_one(item);
        // Both halves are well mixed: fold them.
        Self((hash ^ (hash >> 32)) as u32)
    }

    /// The hash the table works with: the 32 bits spread over 64, since the table takes
    /// its buckets from the low bits and its tags from the top 7.
    fn table(self) -> u64 {
        u64::from(self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Waiting,
    /// Waiting at low priority.
    WaitingLow,
    Processing,
    /// Added again while processing: it goes back in the queue at `done`.
    ProcessingDirty,
    /// Added again while processing, only at low priority.
    ProcessingDirtyLow,
}

impl Phase {
    /// The phase of an item added at `priority`.
    #[inline]
    fn waiting(priority: Priority) -> Self {
        match priority {
            Priority::Normal => Phase::Waiting,
            Priority::Low => Phase::WaitingLow,
        }
    }

    /// The phase of a processing item added again at `priority`.
    #[inline]
    fn dirty(priority: Priority) -> Self {
        match priority {
            Priority::Normal => Phase::ProcessingDirty,
            Priority::Low => Phase::ProcessingDirtyLow,
        }
    }
}

/// Each held item's phase and, when the queue reports metrics, its times, in vectors indexed
/// by the slot the item keeps while it is waiting or processing. A freed slot is reused, so
/// the vectors grow with the items held at once, never with those ever held; one byte of
/// phase a slot keeps the memory a burst of adds touches small.
#[derive(Default)]
struct Slots {
    phases: Vec<Phase>,
    /// Only kept when the queue reports metrics: then as long as `phases`.
    times: Vec<Times>,
    free: Vec<u32>,
}

// `#[inline]` throughout: `State<T>` is generic, so it is compiled in the crate that names
// `T`, where these small non-generic methods would otherwise be calls across crates.
impl Slots {
    /// A slot for a new item in `phase`, added at `now` (set when the queue reports
    /// metrics).
    #[inline]
    fn claim(&mut self, phase: Phase, now: Option<Instant>) -> u32 {
        let slot = match self.free.pop() {
            Some(slot) => {
                self.phases[slot as usize] = phase;
                slot
            }
            None => {
                let slot =
                    u32::try_from(self.phases.len()).expect("a queue holds fewer than 2^32 items");
                self.phases.push(phase);
                slot
            }
        };
        if now.is_some() {
            let times = Times {
                added: now,
                started: None,
            };
            match self.times.get_mut(slot as usize) {
                Some(kept) => *kept = times,
                None => self.times.push(times),
            }
        }
        slot
    }

    #[inline]
    fn phase(&self, slot: u32) -> Phase {
        self.phases[slot as usize]
    }

    #[inline]
    fn set_phase(&mut self, slot: u32, phase: Phase) {
        self.phases[slot as usize] = phase;
    }

    /// The slot's processing item was added again at `now`.
    #[inline]
    fn readded(&mut self, slot: u32, now: Option<Instant>) {
        if now.is_some() {
            self.times[slot as usize].added = now;
        }
    }

    /// A worker takes the slot's waiting item at `now`; returns when it was added.
    #[inline]
    fn start(&mut self, slot: u32, now: Option<Instant>) -> Option<Instant> {
        let phase = &mut self.phases[slot as usize];
        debug_assert!(
            matches!(*phase, Phase::Waiting | Phase::WaitingLow),
            "a queued item must be waiting"
        );
        *phase = Phase::Processing;
        let times = self.times.get_mut(slot as usize)?;
        times.started = now;
        times.added
    }

    /// When the slot's item started processing, if the queue reports metrics.
    #[inline]
    fn started(&self, slot: u32) -> Option<Instant> {
        self.times.get(slot as usize).and_then(|t| t.started)
    }

    /// The slot's item left the queue.
    #[inline]
    fn release(&mut self, slot: u32) {
        self.free.push(slot);
    }
}

/// The items waiting for a worker, each with its slot so that handing one out needs no
/// hashing: at [`Priority::Normal`] oldest first, and at [`Priority::Low`] oldest first
/// with when they were queued, taken when no normal item waits or once the oldest has
/// waited [`LOW_PRIORITY_MAX_WAIT`].
struct Lanes<T> {
    normal: VecDeque<(T, u32)>,
    low: VecDeque<(T, u32, Instant)>,
}

impl<T> Lanes<T> {
    #[inline]
    fn new() -> Self {
        Self {
            normal: VecDeque::new(),
            low: VecDeque::new(),
        }
    }

    /// Queues `item` at `priority`; `now` is set when the queue reports metrics.
    #[inline]
    fn push(&mut self, item: T, slot: u32, priority: Priority, now: Option<Instant>) {
        match priority {
            Priority::Normal => self.normal.push_back((item, slot)),
            Priority::Low => {
                let queued = now.unwrap_or_else(Instant::now);
                self.low.push_back((item, slot, queued));
            }
        }
    }

    /// Moves the low-priority item of `slot` to the back of the normal lane (rare, so a
    /// search).
    #[inline]
    fn raise(&mut self, item: T, slot: u32) {
        if let Some(at) = self.low.iter().position(|(_, s, _)| *s == slot) {
            self.low.remove(at);
        }
        self.normal.push_back((item, slot));
    }

    /// The next item for a worker at `now`, with its slot.
    #[inline]
    fn pop(&mut self, now: Option<Instant>) -> Option<(T, u32)> {
        let low_first = match (self.normal.front(), self.low.front()) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(_), Some((_, _, queued))) => {
                now.unwrap_or_else(Instant::now)
                    .saturating_duration_since(*queued)
                    >= LOW_PRIORITY_MAX_WAIT
            }
        };
        if low_first {
            self.low.pop_front().map(|(item, slot, _)| (item, slot))
        } else {
            self.normal.pop_front()
        }
    }

    #[inline]
    fn len(&self) -> usize {
        self.normal.len() + self.low.len()
    }
}

/// How urgent an added item is (controller-runtime's priority queue, in two levels).
///
/// Items at [`Low`](Self::Low) priority, such as the keys of an informer's initial list or
/// of a resync, go behind every [`Normal`](Self::Normal) one, so a live edit is not stuck
/// behind thousands of replayed objects; one that has waited [`LOW_PRIORITY_MAX_WAIT`]
/// goes first, so low-priority items are never starved. An item added at both priorities
/// waits at the higher.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    /// Behind every normal item, for a bounded time.
    Low,
    /// In the order added (the default).
    #[default]
    Normal,
}

/// The longest a low-priority item waits behind normal ones before it goes first.
pub const LOW_PRIORITY_MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A slot's instants, for metrics.
#[derive(Clone, Copy, Default)]
struct Times {
    added: Option<Instant>,
    started: Option<Instant>,
}

/// Below this many items, a table full of items grows fourfold instead of twofold.
///
/// Growing moves every item, under the queue's lock, with every worker waiting; a burst of
/// adds (an informer's initial list, a resync) into a fresh queue then moves items a third
/// as often, which made a burst of 10,000 keys a quarter faster. The price is up to twice
/// the room a doubling table keeps, a couple of megabytes at most below this size; above
/// it, the table doubles.
const QUADRUPLE_BELOW: usize = 1 << 14;

/// What an `add` did.
#[derive(Debug, PartialEq, Eq)]
enum Added {
    /// New: queued for a worker.
    Queued,
    /// Processing: it will be queued again at `done`.
    Dirty,
    /// Already pending: nothing changed.
    Duplicate,
    /// Shutting down: ignored.
    Ignored,
}

/// What a `done` did, for a processing item.
struct Finished<T> {
    started: Option<Instant>,
    requeued: bool,
    /// The queue's copy of the item, to drop once the lock is released.
    released: Option<T>,
}

/// What a worker that finds the queue empty does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IfEmpty {
    /// It returns at once (it only looked).
    Return,
    /// It waits for an item: count it among the sleepers to wake.
    Sleep,
}

/// What a non-blocking attempt to take an item found.
enum Next<T> {
    Item(T),
    Empty,
    ShutDown,
}

impl<T: Clone + Eq + Hash> State<T> {
    fn new() -> Self {
        Self {
            lanes: Lanes::new(),
            items: HashTable::new(),
            room: 0,
            slots: Slots::default(),
            processing: 0,
            sleepers: 0,
            shutting_down: false,
            draining: false,
        }
    }

    /// Adds `item`, whose hash is `hash`; `now` is set when the queue reports metrics.
    /// Returns what happened, and `item` back when the queue did not keep it, so that the
    /// caller drops it after releasing the lock.
    fn add(
        &mut self,
        item: T,
        hash: ItemHash,
        now: Option<Instant>,
        priority: Priority,
    ) -> (Added, Option<T>) {
        if self.shutting_down {
            return (Added::Ignored, Some(item));
        }
        self.make_room();
        match self
            .items
            .entry(hash.table(), |e| e.item == item, |e| e.hash.table())
        {
            hash_table::Entry::Vacant(vacant) => {
                let slot = self.slots.claim(Phase::waiting(priority), now);
                self.lanes.push(item.clone(), slot, priority, now);
                vacant.insert(Entry { item, slot, hash });
                (Added::Queued, None)
            }
            hash_table::Entry::Occupied(occupied) => {
                let slot = occupied.get().slot;
                let added = match (self.slots.phase(slot), priority) {
                    (Phase::WaitingLow, Priority::Normal) => {
                        self.slots.set_phase(slot, Phase::Waiting);
                        self.lanes.raise(item.clone(), slot);
                        Added::Duplicate
                    }
                    (Phase::Processing, _) => {
                        self.slots.set_phase(slot, Phase::dirty(priority));
                        self.slots.readded(slot, now);
                        Added::Dirty
                    }
                    (Phase::ProcessingDirtyLow, Priority::Normal) => {
                        self.slots.set_phase(slot, Phase::ProcessingDirty);
                        Added::Duplicate
                    }
                    _ => Added::Duplicate,
                };
                (added, Some(item))
            }
        }
    }

    /// Makes room in `items` for one more item when it has none left (the insert would
    /// grow or rehash it). Filled by items rather than by deleted ones, it grows fourfold
    /// while small, see [`QUADRUPLE_BELOW`]; otherwise it doubles or rehashes in place, as
    /// usual.
    fn make_room(&mut self) {
        let len = self.items.len();
        if len < self.items.capacity() {
            return;
        }
        let additional = if len < QUADRUPLE_BELOW && len >= self.room / 2 {
            3 * len + 1
        } else {
            1
        };
        self.items.reserve(additional, |e| e.hash.table());
        self.room = self.items.capacity();
    }

    /// Whether a worker waits for an item and has not been woken for one yet; if so, counts
    /// it as woken, and the caller must notify `item_queued` once.
    fn wake_sleeper(&mut self) -> bool {
        let wake = self.sleepers > 0;
        self.sleepers -= usize::from(wake);
        wake
    }

    /// Hands out the oldest waiting item, with when it was added. When there is none and
    /// the caller will [`Sleep`](IfEmpty::Sleep), counts it among the sleepers: it is about
    /// to wait, registered with `item_queued`.
    fn next(&mut self, now: Option<Instant>, if_empty: IfEmpty) -> Next<(T, Option<Instant>)> {
        let Some((item, slot)) = self.lanes.pop(now) else {
            if self.shutting_down {
                return Next::ShutDown;
            }
            self.sleepers += usize::from(if_empty == IfEmpty::Sleep);
            return Next::Empty;
        };
        let added = self.slots.start(slot, now);
        self.processing += 1;
        Next::Item((item, added))
    }

    /// Ends the processing of `item`, whose hash is `hash`; `None` if it was not processing.
    fn done(&mut self, item: &T, hash: ItemHash) -> Option<Finished<T>> {
        let Ok(occupied) = self.items.find_entry(hash.table(), |e| e.item == *item) else {
            return None;
        };
        let slot = occupied.get().slot;
        let (requeued, released) = match self.slots.phase(slot) {
            Phase::Processing => {
                let (Entry { item: key, .. }, _) = occupied.remove();
                self.slots.release(slot);
                (false, Some(key))
            }
            dirty @ (Phase::ProcessingDirty | Phase::ProcessingDirtyLow) => {
                let priority = if dirty == Phase::ProcessingDirty {
                    Priority::Normal
                } else {
                    Priority::Low
                };
                self.slots.set_phase(slot, Phase::waiting(priority));
                self.lanes
                    .push(occupied.get().item.clone(), slot, priority, None);
                (true, None)
            }
            Phase::Waiting | Phase::WaitingLow => return None,
        };
        self.processing -= 1;
        Some(Finished {
            started: self.slots.started(slot),
            requeued,
            released,
        })
    }
}

impl<T> Queue<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// An unnamed queue without metrics.
    pub fn new() -> Self {
        Self::with_config(QueueConfig::default())
    }

    /// A queue named and instrumented as `config` says.
    pub fn with_config(config: QueueConfig) -> Self {
        let QueueConfig { name, metrics } = config;
        let inner = Arc::new_cyclic(|weak: &Weak<Inner<T>>| {
            let metrics = match metrics {
                Some(provider) if !name.is_empty() => {
                    let weak: Weak<dyn InFlightSource> = weak.clone();
                    Some(provider.queue_metrics(&name, InFlightProbe::new(weak)))
                }
                _ => None,
            };
            Inner {
                state: Mutex::new(State::new()),
                hasher: Hasher::default(),
                item_queued: Notify::new(),
                drained: Notify::new(),
                name,
                metrics,
            }
        });
        Self { inner }
    }

    /// The name given in the [`QueueConfig`], empty if none.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Marks `item` as needing processing.
    ///
    /// It is queued unless it is already waiting (then this is a no-op) or processing (then
    /// it is queued again when that processing is [`done`](Self::done)). Ignored once the
    /// queue is shutting down.
    pub fn add(&self, item: T) {
        self.add_with_priority(item, Priority::Normal);
    }

    /// [`add`](Self::add) at `priority`: a [`Priority::Low`] item waits behind normal ones
    /// (for at most [`LOW_PRIORITY_MAX_WAIT`]); an item already waiting at low priority
    /// that is added at normal priority moves up.
    ///
    /// ```
    /// use kube_informer::workqueue::{Priority, Queue};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let queue = Queue::new();
    /// for key in ["replayed-1", "replayed-2"] {
    ///     queue.add_with_priority(key, Priority::Low);
    /// }
    /// queue.add("edited");
    /// assert_eq!(queue.get().await, Some("edited"));
    /// assert_eq!(queue.get().await, Some("replayed-1"));
    /// # }
    /// ```
    pub fn add_with_priority(&self, item: T, priority: Priority) {
        let hash = ItemHash::of(&item, &self.inner.hasher);
        let now = self.now();
        let (added, unused, wake) = {
            let mut state = self.inner.lock();
            let (added, unused) = state.add(item, hash, now, priority);
            let wake = added == Added::Queued && state.wake_sleeper();
            (added, unused, wake)
        };
        drop(unused);
        if wake {
            self.inner.item_queued.notify_one();
        }
        if matches!(added, Added::Queued | Added::Dirty)
            && let Some(metrics) = &self.inner.metrics
        {
            metrics.added();
        }
    }

    /// Waits for the next item and marks it as processing.
    ///
    /// The caller owns the item until it calls [`done`](Self::done) with it; until then no
    /// other worker receives it. Returns `None` once the queue is shut down and no item is
    /// left waiting, which is a worker's cue to exit.
    ///
    /// Cancel safe: an item is only taken in the poll that returns it.
    pub async fn get(&self) -> Option<T> {
        loop {
            // Registering with `Notify` costs a lock, so try without it first.
            match self.try_next(IfEmpty::Return) {
                Next::Item(item) => return Some(item),
                Next::ShutDown => return None,
                Next::Empty => {}
            }
            // Register before looking again, so an item queued between the look and the
            // wait still wakes this worker; the look counts it among the sleepers, which
            // `add` and `done` notify.
            let mut queued = pin!(self.inner.item_queued.notified());
            queued.as_mut().enable();
            match self.try_next(IfEmpty::Sleep) {
                Next::Item(item) => return Some(item),
                Next::ShutDown => return None,
                Next::Empty => queued.await,
            }
        }
    }

    /// Like [`get`](Self::get), but the item comes in a guard that calls
    /// [`done`](Self::done) when dropped, so an early return or a panic cannot leave the
    /// item processing forever.
    ///
    /// ```
    /// # use kube_informer::workqueue::Queue;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let queue = Queue::new();
    /// queue.add(7_u32);
    /// let item = queue.get_guarded().await.unwrap();
    /// assert_eq!(*item, 7);
    /// queue.add(7); // added while processing...
    /// drop(item); // ...so it is queued again when the guard marks it done
    /// assert_eq!(queue.len(), 1);
    /// # }
    /// ```
    pub async fn get_guarded(&self) -> Option<DoneGuard<T>> {
        let item = self.get().await?;
        Some(DoneGuard {
            queue: self.clone(),
            item,
        })
    }

    /// Marks `item`, obtained from [`get`](Self::get), as processed.
    ///
    /// If it was added again meanwhile it is queued again now. Calling it for an item that
    /// is not processing does nothing.
    pub fn done(&self, item: &T) {
        let hash = ItemHash::of(item, &self.inner.hasher);
        let now = self.now();
        let (finished, wake, drained) = {
            let mut state = self.inner.lock();
            let Some(finished) = state.done(item, hash) else {
                return;
            };
            let wake = finished.requeued && state.wake_sleeper();
            (finished, wake, state.draining && state.processing == 0)
        };
        drop(finished.released);
        if wake {
            self.inner.item_queued.notify_one();
        }
        if drained {
            self.inner.drained.notify_waiters();
        }
        if let (Some(metrics), Some(started), Some(now)) =
            (&self.inner.metrics, finished.started, now)
        {
            metrics.finished(now.saturating_duration_since(started));
        }
    }

    /// The items waiting for a worker or being processed, copied.
    pub(crate) fn items(&self) -> Vec<T> {
        let state = self.inner.lock();
        state.items.iter().map(|entry| entry.item.clone()).collect()
    }

    /// The number of items waiting for a worker (not counting those processing).
    pub fn len(&self) -> usize {
        let state = self.inner.lock();
        state.lanes.len()
    }

    /// Whether no item is waiting for a worker.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops accepting items. Workers still receive the items already waiting; once none is
    /// left, every [`get`](Self::get), including those blocked now, returns `None`.
    pub fn shutdown(&self) {
        {
            let mut state = self.inner.lock();
            state.shutting_down = true;
            // All of them are woken below, and none waits again.
            state.sleepers = 0;
        }
        self.inner.item_queued.notify_waiters();
    }

    /// Like [`shutdown`](Self::shutdown), then waits until every item being processed is
    /// [`done`](Self::done).
    ///
    /// As in client-go, this waits for items in flight, not for items still waiting: those
    /// are handed out by later `get` calls (and so become in flight) or dropped with the
    /// queue. It never returns if a worker never calls `done`.
    pub async fn shutdown_with_drain(&self) {
        self.shutdown();
        loop {
            let mut drained = pin!(self.inner.drained.notified());
            drained.as_mut().enable();
            {
                let mut state = self.inner.lock();
                if state.processing == 0 {
                    return;
                }
                state.draining = true;
            }
            drained.await;
        }
    }

    /// Whether [`shutdown`](Self::shutdown) has been called.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.lock().shutting_down
    }

    /// Counts a delayed add; the delaying queue reports it here so that all of a queue's
    /// metrics go through one handle.
    pub(super) fn record_retry(&self) {
        if let Some(metrics) = &self.inner.metrics {
            metrics.retried();
        }
    }

    /// How many handles share this queue, to check that background tasks let go of it.
    #[cfg(test)]
    pub(super) fn handle_count(&self) -> usize {
        Arc::strong_count(&self.inner)
    }

    /// Takes the next item if one is waiting; `if_empty` as in [`State::next`].
    fn try_next(&self, if_empty: IfEmpty) -> Next<T> {
        let now = self.now();
        let next = self.inner.lock().next(now, if_empty);
        match next {
            Next::Item((item, added)) => {
                if let (Some(metrics), Some(added), Some(now)) = (&self.inner.metrics, added, now) {
                    metrics.started(now.saturating_duration_since(added));
                }
                Next::Item(item)
            }
            Next::Empty => Next::Empty,
            Next::ShutDown => Next::ShutDown,
        }
    }

    /// The time, only when someone will read it: reading the clock is the only cost
    /// metrics would add to an uninstrumented queue.
    fn now(&self) -> Option<Instant> {
        self.inner.metrics.as_ref().map(|_| Instant::now())
    }
}

impl<T> Inner<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // parking_lot's lock does not poison: the state is consistent between statements,
        // and a panic elsewhere (in a user's `Eq`, say) must not take every worker down.
        self.state.lock()
    }
}

impl<T: Send + Sync> InFlightSource for Inner<T> {
    fn in_flight(&self) -> InFlightSnapshot {
        let now = Instant::now();
        let state = self.lock();
        let mut snapshot = InFlightSnapshot::default();
        for entry in &state.items {
            let started = state.slots.started(entry.slot);
            let (Phase::Processing | Phase::ProcessingDirty, Some(started)) =
                (state.slots.phase(entry.slot), started)
            else {
                continue;
            };
            let running = now.saturating_duration_since(started);
            snapshot.unfinished_work += running;
            snapshot.longest_running = snapshot.longest_running.max(running);
        }
        snapshot
    }
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> Default for Queue<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.lock();
        f.debug_struct("Queue")
            .field("name", &self.inner.name)
            .field("waiting", &state.lanes.len())
            .field("processing", &state.processing)
            .field("shutting_down", &state.shutting_down)
            .finish()
    }
}

/// An item being processed; marks it [`done`](Queue::done) when dropped.
///
/// Returned by [`Queue::get_guarded`]. Dereferences to the item.
pub struct DoneGuard<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    queue: Queue<T>,
    item: T,
}

impl<T> DoneGuard<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// The item being processed.
    pub fn item(&self) -> &T {
        &self.item
    }
}

impl<T> Deref for DoneGuard<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    type Target = T;

    fn deref(&self) -> &T {
        &self.item
    }
}

impl<T> Drop for DoneGuard<T>
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    fn drop(&mut self) {
        self.queue.done(&self.item);
    }
}

impl<T> fmt::Debug for DoneGuard<T>
where
    T: Clone + Eq + Hash + Send + Sync + fmt::Debug + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DoneGuard").field(&self.item).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;

    /// Takes an item that must already be waiting, without blocking.
    fn take<T: Clone + Eq + Hash + Send + Sync + 'static>(queue: &Queue<T>) -> Option<T> {
        match queue.try_next(IfEmpty::Return) {
            Next::Item(item) => Some(item),
            Next::Empty | Next::ShutDown => None,
        }
    }

    #[tokio::test]
    async fn hands_out_items_in_fifo_order() {
        let queue = Queue::new();
        for i in 0..5 {
            queue.add(i);
        }
        assert_eq!(queue.len(), 5);
        for i in 0..5 {
            assert_eq!(queue.get().await, Some(i));
        }
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn collapses_duplicates_while_waiting() {
        let queue = Queue::new();
        queue.add("a");
        queue.add("b");
        queue.add("a");
        queue.add("a");
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.get().await, Some("a"));
        assert_eq!(queue.get().await, Some("b"));
        assert_eq!(take(&queue), None);
    }

    #[tokio::test]
    async fn item_added_while_processing_comes_back_once_after_done() {
        let queue = Queue::new();
        queue.add("a");
        let item = queue.get().await.unwrap();
        queue.add("a");
        queue.add("a");
        // Not handed to a second worker while the first holds it.
        assert_eq!(queue.len(), 0);
        assert_eq!(take(&queue), None);
        queue.done(&item);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.get().await, Some("a"));
        queue.done(&"a");
        assert_eq!(take(&queue), None);
        assert!(queue.inner.lock().items.is_empty());
    }

    #[tokio::test]
    async fn done_without_readd_forgets_the_item() {
        let queue = Queue::new();
        queue.add(1);
        let item = queue.get().await.unwrap();
        queue.done(&item);
        assert_eq!(queue.len(), 0);
        // Adding again after done queues it afresh.
        queue.add(1);
        assert_eq!(queue.len(), 1);
    }

    #[tokio::test]
    async fn slots_of_done_items_are_reused() {
        let queue = Queue::new();
        for round in 0..100 {
            for i in 0..10 {
                queue.add(round * 10 + i);
            }
            for _ in 0..10 {
                let item = queue.get().await.unwrap();
                queue.done(&item);
            }
        }
        let state = queue.inner.lock();
        assert_eq!(state.slots.phases.len(), 10);
        assert_eq!(state.slots.free.len(), 10);
        assert!(state.items.is_empty());
    }

    #[tokio::test]
    async fn table_room_stays_bounded_under_churn() {
        // 100 items live at any time, 100,000 over the queue's life: the table must grow
        // with the items it holds at once, not with those it ever held.
        let queue = Queue::new();
        for i in 0..100_u32 {
            queue.add(i);
        }
        for i in 100..100_000 {
            let item = take(&queue).unwrap();
            queue.done(&item);
            queue.add(i);
        }
        let state = queue.inner.lock();
        assert_eq!(state.items.len(), 100);
        assert!(state.items.capacity() < 500, "{}", state.items.capacity());
        assert_eq!(state.slots.phases.len(), 100);
    }

    #[tokio::test]
    async fn done_for_an_item_not_processing_is_ignored() {
        let queue = Queue::new();
        queue.done(&1);
        queue.add(1);
        queue.done(&1);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.get().await, Some(1));
        assert_eq!(queue.inner.lock().processing, 1);
    }

    #[tokio::test]
    async fn get_waits_for_an_add() {
        let queue = Queue::new();
        let worker = tokio::spawn({
            let queue = queue.clone();
            async move { queue.get().await }
        });
        tokio::task::yield_now().await;
        assert!(!worker.is_finished());
        queue.add(9);
        assert_eq!(worker.await.unwrap(), Some(9));
    }

    #[tokio::test]
    async fn shutdown_wakes_every_waiting_worker_with_none() {
        let queue: Queue<u32> = Queue::new();
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(8);
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let queue = queue.clone();
                let ready_tx = ready_tx.clone();
                tokio::spawn(async move {
                    let mut get = pin!(queue.get());
                    // Announce only once `get` is actually blocked.
                    assert!(futures::poll!(get.as_mut()).is_pending());
                    ready_tx.send(()).await.unwrap();
                    get.await
                })
            })
            .collect();
        for _ in 0..8 {
            ready_rx.recv().await.unwrap();
        }
        queue.shutdown();
        for worker in workers {
            assert_eq!(worker.await.unwrap(), None);
        }
        assert!(queue.is_shutting_down());
    }

    #[tokio::test]
    async fn shutdown_hands_out_waiting_items_then_none_and_ignores_adds() {
        let queue = Queue::new();
        queue.add(1);
        queue.add(2);
        queue.shutdown();
        queue.add(3);
        assert_eq!(queue.get().await, Some(1));
        assert_eq!(queue.get().await, Some(2));
        assert_eq!(queue.get().await, None);
    }

    #[tokio::test]
    async fn shutdown_with_drain_returns_only_after_in_flight_items_are_done() {
        let queue = Queue::new();
        queue.add("a");
        queue.add("b");
        let a = queue.get().await.unwrap();
        let b = queue.get().await.unwrap();
        let finished = Arc::new(AtomicBool::new(false));
        let (started_tx, started_rx) = oneshot::channel();
        let drain = tokio::spawn({
            let queue = queue.clone();
            let finished = finished.clone();
            async move {
                let mut drain = pin!(queue.shutdown_with_drain());
                assert!(futures::poll!(drain.as_mut()).is_pending());
                started_tx.send(()).unwrap();
                drain.await;
                // Both items must be done by the time the drain returns.
                assert!(finished.load(Ordering::SeqCst));
            }
        });
        started_rx.await.unwrap();
        assert!(queue.is_shutting_down());
        queue.done(&a);
        tokio::task::yield_now().await;
        assert!(!drain.is_finished());
        finished.store(true, Ordering::SeqCst);
        queue.done(&b);
        drain.await.unwrap();
    }

    #[tokio::test]
    async fn shutdown_with_drain_returns_at_once_when_idle() {
        let queue: Queue<u8> = Queue::new();
        queue.shutdown_with_drain().await;
        assert!(queue.is_shutting_down());
    }

    #[tokio::test]
    async fn guard_marks_the_item_done_on_drop() {
        let queue = Queue::new();
        queue.add(5);
        let guard = queue.get_guarded().await.unwrap();
        assert_eq!(*guard.item(), 5);
        assert_eq!(queue.inner.lock().processing, 1);
        drop(guard);
        assert_eq!(queue.inner.lock().processing, 0);
        assert!(queue.inner.lock().items.is_empty());
    }

    #[tokio::test]
    async fn cancelled_get_does_not_lose_a_wakeup() {
        let queue = Queue::new();
        let mut first = Box::pin(queue.get());
        assert!(futures::poll!(first.as_mut()).is_pending());
        let second = tokio::spawn({
            let queue = queue.clone();
            async move { queue.get().await }
        });
        tokio::task::yield_now().await;
        // The notification may go to `first`; dropping it must pass it on to `second`.
        queue.add(1);
        drop(first);
        assert_eq!(second.await.unwrap(), Some(1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sleeping_workers_are_woken_for_every_burst() {
        // Workers go to sleep between bursts, so every burst must wake them: a lost wakeup
        // leaves items waiting and the round never ends.
        use std::sync::atomic::AtomicUsize;
        let queue: Queue<u64> = Queue::new();
        let processed = Arc::new(AtomicUsize::new(0));
        let progress = Arc::new(Notify::new());
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let (queue, processed, progress) =
                    (queue.clone(), processed.clone(), progress.clone());
                tokio::spawn(async move {
                    while let Some(item) = queue.get().await {
                        queue.done(&item);
                        processed.fetch_add(1, Ordering::SeqCst);
                        progress.notify_one();
                    }
                })
            })
            .collect();
        let mut expected = 0;
        for round in 0..2_000_u64 {
            let burst = 1 + round % 7;
            for i in 0..burst {
                queue.add(round * 10 + i);
            }
            expected += burst as usize;
            tokio::time::timeout(Duration::from_secs(10), async {
                while processed.load(Ordering::SeqCst) < expected {
                    progress.notified().await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("round {round}: items left unprocessed"));
        }
        queue.shutdown();
        for worker in workers {
            worker.await.unwrap();
        }
        assert_eq!(queue.inner.lock().sleepers, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_snapshot_sums_and_maxes_processing_time() {
        struct Nothing;
        impl QueueMetrics for Nothing {
            fn added(&self) {}
            fn started(&self, _: Duration) {}
            fn finished(&self, _: Duration) {}
            fn retried(&self) {}
        }
        struct Keep(std::sync::Mutex<Option<InFlightProbe>>);
        impl super::super::MetricsProvider for Arc<Keep> {
            fn queue_metrics(&self, _: &str, probe: InFlightProbe) -> Box<dyn QueueMetrics> {
                *self.0.lock().unwrap() = Some(probe);
                Box::new(Nothing)
            }
        }
        let keep = Arc::new(Keep(std::sync::Mutex::new(None)));
        let queue = Queue::with_config(QueueConfig::named("q").metrics(keep.clone()));
        let probe = keep.0.lock().unwrap().take().unwrap();

        queue.add(1);
        queue.add(2);
        queue.get().await.unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        queue.get().await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let snapshot = probe.snapshot().unwrap();
        assert_eq!(snapshot.unfinished_work, Duration::from_secs(5));
        assert_eq!(snapshot.longest_running, Duration::from_secs(4));

        drop(queue);
        assert!(probe.is_closed());
        assert_eq!(probe.snapshot(), None);
    }

    async fn drain(queue: &Queue<&'static str>, n: usize) -> Vec<&'static str> {
        let mut taken = Vec::new();
        for _ in 0..n {
            let item = queue.get().await.unwrap();
            queue.done(&item);
            taken.push(item);
        }
        taken
    }

    #[tokio::test(start_paused = true)]
    async fn low_priority_items_wait_behind_normal_ones_in_order() {
        let queue = Queue::new();
        queue.add_with_priority("low-1", Priority::Low);
        queue.add("normal-1");
        queue.add_with_priority("low-2", Priority::Low);
        queue.add("normal-2");
        assert_eq!(queue.len(), 4);
        assert_eq!(
            drain(&queue, 4).await,
            ["normal-1", "normal-2", "low-1", "low-2"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_low_item_added_at_normal_priority_moves_up_once() {
        let queue = Queue::new();
        for item in ["a", "b", "c"] {
            queue.add_with_priority(item, Priority::Low);
        }
        queue.add("z");
        queue.add("c");
        queue.add_with_priority("c", Priority::Low);
        assert_eq!(queue.len(), 4, "c waits once");
        assert_eq!(drain(&queue, 4).await, ["z", "c", "a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_low_item_that_waited_long_enough_goes_first() {
        let queue = Queue::new();
        queue.add_with_priority("old-low", Priority::Low);
        tokio::time::advance(LOW_PRIORITY_MAX_WAIT).await;
        queue.add("fresh");
        assert_eq!(
            drain(&queue, 2).await,
            ["old-low", "fresh"],
            "never starved"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_item_added_while_processing_requeues_at_its_highest_priority() {
        let queue = Queue::new();
        queue.add("x");
        queue.add("y");
        let x = queue.get().await.unwrap();
        queue.add_with_priority("x", Priority::Low);
        queue.done(&x);
        queue.add("w");
        assert_eq!(
            drain(&queue, 3).await,
            ["y", "w", "x"],
            "x went back at low priority"
        );

        queue.add("x");
        let x = queue.get().await.unwrap();
        queue.add_with_priority("x", Priority::Low);
        queue.add("x");
        queue.done(&x);
        queue.add("v");
        assert_eq!(
            drain(&queue, 2).await,
            ["x", "v"],
            "raised while processing"
        );
    }
}
