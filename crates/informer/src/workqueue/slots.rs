//! Each held item's phase and times, by a slot the item keeps while the queue holds it, in
//! vectors that grow with the items held at once (a freed slot is reused): the table of
//! items carries a 4-byte slot beside each item, and a burst of adds touches a byte of
//! phase per item.

use tokio::time::Instant;

use super::lanes::Priority;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Phase {
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
    pub(super) fn waiting(priority: Priority) -> Self {
        match priority {
            Priority::Normal => Phase::Waiting,
            Priority::Low => Phase::WaitingLow,
        }
    }

    /// The phase of a processing item added again at `priority`.
    #[inline]
    pub(super) fn dirty(priority: Priority) -> Self {
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
pub(super) struct Slots {
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
    pub(super) fn claim(&mut self, phase: Phase, now: Option<Instant>) -> u32 {
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
    pub(super) fn phase(&self, slot: u32) -> Phase {
        self.phases[slot as usize]
    }

    #[inline]
    pub(super) fn set_phase(&mut self, slot: u32, phase: Phase) {
        self.phases[slot as usize] = phase;
    }

    /// The slot's processing item was added again at `now`.
    #[inline]
    pub(super) fn readded(&mut self, slot: u32, now: Option<Instant>) {
        if now.is_some() {
            self.times[slot as usize].added = now;
        }
    }

    /// A worker takes the slot's waiting item at `now`; returns when it was added.
    #[inline]
    pub(super) fn start(&mut self, slot: u32, now: Option<Instant>) -> Option<Instant> {
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
    pub(super) fn started(&self, slot: u32) -> Option<Instant> {
        self.times.get(slot as usize).and_then(|t| t.started)
    }

    /// The slot's item left the queue.
    #[inline]
    pub(super) fn release(&mut self, slot: u32) {
        self.free.push(slot);
    }

    /// Forgets every slot when there are more than `kept`; only for a queue that holds no
    /// item, so that no slot is in use.
    pub(super) fn shrink_idle(&mut self, kept: usize) {
        debug_assert_eq!(self.free.len(), self.phases.len(), "every slot is free");
        if self.phases.len() > kept {
            *self = Self::default();
        }
    }

    /// How many slots there are, and how many of them are free.
    #[cfg(test)]
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.phases.len(), self.free.len())
    }
}

/// A slot's instants, for metrics.
#[derive(Clone, Copy, Default)]
struct Times {
    added: Option<Instant>,
    started: Option<Instant>,
}
