//! The queue's state under its lock, apart from the handle around it: what an `add`, a
//! `get` or a `done` changes is decided here, in one critical section each (an `add` or a
//! `done` looks its item up once, by a hash computed before the lock), so that waking
//! workers, dropping items and reporting metrics stay in `queue.rs`, after the lock.

use std::hash::{BuildHasher, Hash};

use hashbrown::hash_table::{self, HashTable};
use tokio::time::Instant;

use super::{
    lanes::{Lanes, Priority},
    slots::{Phase, Slots},
};

/// foldhash rather than SipHash: hashing was a fifth of a queue cycle on object keys. Its
/// per-queue random seed defeats precomputed collisions, the threat here; names are chosen
/// by users who can create objects, not by anyone who can time the queue.
pub(super) type Hasher = foldhash::fast::RandomState;

/// The room, in items, an idle queue keeps (see `State::shrink_idle`).
const KEPT_WHEN_IDLE: usize = 64;

pub(super) struct State<T> {
    /// The items waiting for a worker.
    pub(super) lanes: Lanes<T>,
    /// Every item that is waiting or processing, with its slot: client-go's `dirty` and
    /// `processing` sets in one table, so that each `add` and `done` looks the item up once,
    /// with a hash computed before the lock is taken.
    pub(super) items: HashTable<Entry<T>>,
    /// How many items `items` held room for when it last grew or was rehashed, which
    /// clears the room deleted items use up until then.
    room: usize,
    /// Each item's phase and times, by the slot its entry keeps.
    pub(super) slots: Slots,
    pub(super) processing: usize,
    /// Workers that found nothing in `get` and wait for `item_queued`, less those an `add`
    /// or `done` has already woken for an item: queueing an item only notifies while this
    /// is positive, so a busy queue never touches the `Notify`. A `get` dropped while
    /// waiting stays counted; the next item then notifies once for nothing, which is harmless.
    pub(super) sleepers: usize,
    pub(super) shutting_down: bool,
    /// Whether `shutdown_with_drain` waits, so that `done` only wakes it then.
    pub(super) draining: bool,
}

/// An item of `State::items`.
pub(super) struct Entry<T> {
    pub(super) item: T,
    pub(super) slot: u32,
    /// The item's [`ItemHash`], so that growing the table never hashes an item again (nor
    /// reads it, when it is behind a pointer).
    hash: ItemHash,
}

/// 32 bits of an item's hash: as many as a table of fewer than 2^32 items can use, and
/// beside the `u32` slot they cost no room in an [`Entry`].
#[derive(Clone, Copy)]
pub(super) struct ItemHash(u32);

impl ItemHash {
    pub(super) fn of<T: Hash>(item: &T, hasher: &Hasher) -> Self {
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
pub(super) enum Added {
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
pub(super) struct Finished<T> {
    pub(super) started: Option<Instant>,
    pub(super) requeued: bool,
    /// The queue's copy of the item, to drop once the lock is released.
    pub(super) released: Option<T>,
}

/// What a worker that finds the queue empty does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IfEmpty {
    /// It returns at once (it only looked).
    Return,
    /// It waits for an item: count it among the sleepers to wake.
    Sleep,
}

/// What a non-blocking attempt to take an item found.
pub(super) enum Next<T> {
    Item(T),
    Empty,
    ShutDown,
}

impl<T: Clone + Eq + Hash> State<T> {
    pub(super) fn new() -> Self {
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
    pub(super) fn add(
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

    /// Gives back the room a burst grew the queue to, once no item is left: a process with
    /// a queue per cluster of a fleet would otherwise keep each one's largest burst. Small
    /// queues keep theirs, so steady traffic never reallocates.
    fn shrink_idle(&mut self) {
        if self.items.capacity() > KEPT_WHEN_IDLE {
            self.items.shrink_to(0, |e| e.hash.table());
            self.room = self.items.capacity();
        }
        self.lanes.shrink_idle(KEPT_WHEN_IDLE);
        self.slots.shrink_idle(KEPT_WHEN_IDLE);
    }

    /// Whether a worker waits for an item and has not been woken for one yet; if so, counts
    /// it as woken, and the caller must notify `item_queued` once.
    pub(super) fn wake_sleeper(&mut self) -> bool {
        let wake = self.sleepers > 0;
        self.sleepers -= usize::from(wake);
        wake
    }

    /// Hands out the oldest waiting item, with when it was added. When there is none and
    /// the caller will [`Sleep`](IfEmpty::Sleep), counts it among the sleepers: it is about
    /// to wait, registered with `item_queued`.
    pub(super) fn next(
        &mut self,
        now: Option<Instant>,
        if_empty: IfEmpty,
    ) -> Next<(T, Option<Instant>)> {
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
    pub(super) fn done(&mut self, item: &T, hash: ItemHash) -> Option<Finished<T>> {
        let Ok(occupied) = self.items.find_entry(hash.table(), |e| e.item == *item) else {
            return None;
        };
        let slot = occupied.get().slot;
        let (requeued, released) = match self.slots.phase(slot) {
            Phase::Processing => {
                let (Entry { item: key, .. }, _) = occupied.remove();
                self.slots.release(slot);
                if self.items.is_empty() {
                    self.shrink_idle();
                }
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
