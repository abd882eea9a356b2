//! The waiting items, a lane per priority: what [`Priority`] means is how a worker picks
//! between the lanes, so the two are kept together.

use std::collections::VecDeque;

use tokio::time::Instant;

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

/// The items waiting for a worker, each with its slot so that handing one out needs no
/// hashing: at [`Priority::Normal`] oldest first, and at [`Priority::Low`] oldest first
/// with when they were queued, taken when no normal item waits or once the oldest has
/// waited [`LOW_PRIORITY_MAX_WAIT`].
pub(super) struct Lanes<T> {
    normal: VecDeque<(T, u32)>,
    low: VecDeque<(T, u32, Instant)>,
}

impl<T> Lanes<T> {
    #[inline]
    pub(super) fn new() -> Self {
        Self {
            normal: VecDeque::new(),
            low: VecDeque::new(),
        }
    }

    /// Gives back the room of empty lanes that hold room for more than `kept` items.
    pub(super) fn shrink_idle(&mut self, kept: usize) {
        if self.normal.is_empty() && self.normal.capacity() > kept {
            self.normal = VecDeque::new();
        }
        if self.low.is_empty() && self.low.capacity() > kept {
            self.low = VecDeque::new();
        }
    }

    /// Queues `item` at `priority`; `now` is set when the queue reports metrics.
    #[inline]
    pub(super) fn push(&mut self, item: T, slot: u32, priority: Priority, now: Option<Instant>) {
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
    pub(super) fn raise(&mut self, item: T, slot: u32) {
        if let Some(at) = self.low.iter().position(|(_, s, _)| *s == slot) {
            self.low.remove(at);
        }
        self.normal.push_back((item, slot));
    }

    /// The next item for a worker at `now`, with its slot.
    #[inline]
    pub(super) fn pop(&mut self, now: Option<Instant>) -> Option<(T, u32)> {
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
    pub(super) fn len(&self) -> usize {
        self.normal.len() + self.low.len()
    }
}
