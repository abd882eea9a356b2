//! Which slots a replica may reconcile on at this instant, the reconciles running on each,
//! and a count per slot of the times it started admitting again.
//!
//! A reconcile refused on a slot this replica does not hold is dropped by the controller
//! that asked: another replica owns the key, or this one will once it takes the slot, and
//! a slot taken has all its cached objects queued again (the previous owner may have
//! refused changes while it let go). A reconcile refused on a slot this replica holds but
//! cannot renew in time is kept aside by the controller, and queued again when a renewal
//! ends the lapse. Both are counted per slot in [`Grants`], bumped under the lock
//! [`Admission::admit`] decides under: a refusal either comes before the bump (and the
//! requeue, which reads the cache and the keys kept aside after the bump, sees at least
//! what the refused reconcile would have) or is not a refusal.

use std::{
    collections::BTreeSet,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{
    sync::{Notify, watch},
    time::Instant,
};

/// A reconcile admitted on a slot: the slot is not let go while one is alive.
#[derive(Debug)]
pub struct SlotGuard {
    in_flight: Arc<InFlight>,
    slot: u16,
}

impl SlotGuard {
    /// The slot.
    pub fn slot(&self) -> u16 {
        self.slot
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let was = self.in_flight.counts[usize::from(self.slot)].fetch_sub(1, Ordering::AcqRel);
        if was == 1 {
            self.in_flight.drained.notify_waiters();
        }
    }
}

/// Reconciles admitted per slot, and the wake-up of whoever waits for one to drain.
#[derive(Debug)]
struct InFlight {
    counts: Vec<AtomicUsize>,
    drained: Notify,
}

/// Why a reconcile was not admitted on a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// This replica does not hold the slot.
    NotHeld,
    /// It holds the slot, but its renewals are late past the renew deadline: the renewal
    /// that ends the lapse resumes it.
    Lapsed,
    /// The slot is dealt to this replica (or warming for it) and not taken yet: what it
    /// refuses now is its to reconcile once it takes the slot.
    Incoming,
    /// This replica lost the slot without handing it over: a deletion it sees there is
    /// forwarded to the slot's holder (see `forward`).
    Lost,
}

/// How many times each slot has started admitting reconciles on this replica, taken (after
/// not being held) or resumed (after a lapse in which a reconcile was refused).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Grants {
    taken: Vec<u64>,
    resumed: Vec<u64>,
}

/// The slots granted between two [`Grants`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Granted {
    /// Taken: every cached object of theirs is to be reconciled.
    pub(crate) taken: BTreeSet<u16>,
    /// Resumed: the keys refused in the lapse are to be reconciled.
    pub(crate) resumed: BTreeSet<u16>,
}

impl Grants {
    /// No grant yet, of `slots` slots.
    pub(crate) fn none(slots: u16) -> Self {
        Self {
            taken: vec![0; usize::from(slots)],
            resumed: vec![0; usize::from(slots)],
        }
    }

    /// The slots granted since `earlier`.
    pub(crate) fn since(&self, earlier: &Grants) -> Granted {
        let moved = |now: &[u64], then: &[u64]| -> BTreeSet<u16> {
            now.iter()
                .zip(then)
                .zip(0u16..)
                .filter(|((now, then), _)| now != then)
                .map(|(_, slot)| slot)
                .collect()
        };
        Granted {
            taken: moved(&self.taken, &earlier.taken),
            resumed: moved(&self.resumed, &earlier.resumed),
        }
    }
}

/// One slot as this replica holds it.
#[derive(Clone, Copy, Debug, Default)]
struct Held {
    /// When the last renewal (or the take) that succeeded was sent; `None` while not held.
    renewed: Option<Instant>,
    /// A reconcile was refused on it while held, its renewals lapsed.
    refused: bool,
}

/// The slots a replica holds and admits reconciles on; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Admission {
    renew_deadline: Duration,
    held: Mutex<Vec<Held>>,
    in_flight: Arc<InFlight>,
    grants: watch::Sender<Grants>,
}

impl Admission {
    /// `slots` slots, none held; a held slot admits until `renew_deadline` after its last
    /// renewal was sent.
    pub(crate) fn new(slots: u16, renew_deadline: Duration) -> Self {
        Self {
            renew_deadline,
            held: Mutex::new(vec![Held::default(); usize::from(slots)]),
            in_flight: Arc::new(InFlight {
                counts: (0..slots).map(|_| AtomicUsize::new(0)).collect(),
                drained: Notify::new(),
            }),
            grants: watch::Sender::new(Grants::none(slots)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fresh(&self, renewed: Instant) -> bool {
        renewed.elapsed() < self.renew_deadline
    }

    /// A guard for a reconcile on `slot` if it is held and renewed within the renew
    /// deadline. A refusal on a held slot is remembered, so the renewal that ends the lapse
    /// resumes the slot.
    pub(crate) fn admit(&self, slot: u16) -> Result<SlotGuard, Refusal> {
        let mut held = self.lock();
        let state = held.get_mut(usize::from(slot)).ok_or(Refusal::NotHeld)?;
        let renewed = state.renewed.ok_or(Refusal::NotHeld)?;
        if !self.fresh(renewed) {
            state.refused = true;
            return Err(Refusal::Lapsed);
        }
        // Counted under the lock that `release` takes before anyone waits for the count.
        self.in_flight.counts[usize::from(slot)].fetch_add(1, Ordering::AcqRel);
        Ok(SlotGuard {
            in_flight: self.in_flight.clone(),
            slot,
        })
    }

    /// The slots [`admit`](Self::admit) grants guards on now.
    pub(crate) fn admitting(&self) -> BTreeSet<u16> {
        self.slots_renewed(|renewed| self.fresh(renewed))
    }

    /// The slots held, admitting or not.
    pub(crate) fn held(&self) -> BTreeSet<u16> {
        self.slots_renewed(|_| true)
    }

    /// The held slots whose last renewal passes `keep`.
    fn slots_renewed(&self, keep: impl Fn(Instant) -> bool) -> BTreeSet<u16> {
        self.lock()
            .iter()
            .zip(0u16..)
            .filter(|(state, _)| state.renewed.is_some_and(&keep))
            .map(|(_, slot)| slot)
            .collect()
    }

    /// `slot` was taken or renewed by a request sent at `sent`. A slot not held before is
    /// taken; one that refused a reconcile while its renewals lapsed is resumed, once `sent`
    /// is recent enough for it to admit.
    pub(crate) fn hold(&self, slot: u16, sent: Instant) {
        let mut held = self.lock();
        let Some(state) = held.get_mut(usize::from(slot)) else {
            return;
        };
        let at = usize::from(slot);
        if state.renewed.is_none() {
            *state = Held {
                renewed: Some(sent),
                refused: false,
            };
            self.grants.send_modify(|grants| grants.taken[at] += 1);
            return;
        }
        state.renewed = Some(sent);
        if state.refused && self.fresh(sent) {
            state.refused = false;
            self.grants.send_modify(|grants| grants.resumed[at] += 1);
        }
    }

    /// Stops admitting on `slot`; whether it was held.
    pub(crate) fn release(&self, slot: u16) -> bool {
        let mut held = self.lock();
        held.get_mut(usize::from(slot))
            .is_some_and(|state| std::mem::take(state).renewed.is_some())
    }

    /// Stops admitting on `slot`, which another replica took without a handover; whether
    /// it was held. `lost` runs first, under the lock: a reconcile refused on the slot
    /// from then on already finds what `lost` recorded, never a slot merely not held.
    pub(crate) fn lose(&self, slot: u16, lost: impl FnOnce(u16)) -> bool {
        let mut held = self.lock();
        let Some(state) = held.get_mut(usize::from(slot)) else {
            return false;
        };
        if state.renewed.is_none() {
            return false;
        }
        lost(slot);
        *state = Held::default();
        true
    }

    /// Releases the slots whose last renewal is older than the renew deadline, running
    /// `lost` on each under the lock first (as [`lose`](Self::lose) does); returns them.
    pub(crate) fn fence(&self, mut lost: impl FnMut(u16)) -> Vec<u16> {
        let mut held = self.lock();
        let mut dropped = Vec::new();
        for (state, slot) in held.iter_mut().zip(0u16..) {
            if state.renewed.is_some_and(|r| !self.fresh(r)) {
                lost(slot);
                *state = Held::default();
                dropped.push(slot);
            }
        }
        dropped
    }

    /// Reconciles admitted on `slot` still running.
    pub(crate) fn running(&self, slot: u16) -> usize {
        self.in_flight.counts[usize::from(slot)].load(Ordering::Acquire)
    }

    /// Waits until no reconcile admitted on `slot` runs.
    pub(crate) async fn drained(&self, slot: u16) {
        loop {
            let drained = self.in_flight.drained.notified();
            tokio::pin!(drained);
            // Registered before the count is read, so a guard dropped in between wakes it.
            drained.as_mut().enable();
            if self.running(slot) == 0 {
                return;
            }
            drained.await;
        }
    }

    /// The grants of each slot, as they change.
    pub(crate) fn grants(&self) -> watch::Receiver<Grants> {
        self.grants.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(10);

    fn regranted(admission: &Admission, before: &mut Grants) -> Granted {
        let now = admission.grants().borrow().clone();
        let since = now.since(before);
        *before = now;
        since
    }

    fn taken(slots: &[u16]) -> Granted {
        Granted {
            taken: slots.iter().copied().collect(),
            ..Granted::default()
        }
    }

    fn resumed(slots: &[u16]) -> Granted {
        Granted {
            resumed: slots.iter().copied().collect(),
            ..Granted::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_held_is_taken_and_a_renewal_in_time_grants_nothing() {
        let admission = Admission::new(4, DEADLINE);
        let mut seen = admission.grants().borrow().clone();
        assert_eq!(admission.admit(1).err(), Some(Refusal::NotHeld));
        admission.hold(1, Instant::now());
        assert_eq!(regranted(&admission, &mut seen), taken(&[1]));
        assert!(admission.admit(1).is_ok());
        tokio::time::advance(Duration::from_secs(5)).await;
        admission.hold(1, Instant::now());
        assert_eq!(regranted(&admission, &mut seen), Granted::default());
        assert_eq!(admission.admitting(), [1].into());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_while_lapsed_is_resumed_by_the_renewal_that_ends_the_lapse() {
        let admission = Admission::new(4, DEADLINE);
        let mut seen = admission.grants().borrow().clone();
        admission.hold(2, Instant::now());
        regranted(&admission, &mut seen);
        // Renewals late: still held, no longer admitting.
        tokio::time::advance(DEADLINE).await;
        assert_eq!(admission.held(), [2].into());
        assert!(admission.admitting().is_empty());
        // A renewal that lapsed with nothing refused grants nothing.
        admission.hold(2, Instant::now());
        assert_eq!(regranted(&admission, &mut seen), Granted::default());
        tokio::time::advance(DEADLINE).await;
        assert_eq!(admission.admit(2).err(), Some(Refusal::Lapsed));
        // A renewal sent before the lapse ended (answered late) does not end it.
        let late = Instant::now() - DEADLINE;
        admission.hold(2, late);
        assert_eq!(regranted(&admission, &mut seen), Granted::default());
        admission.hold(2, Instant::now());
        assert_eq!(regranted(&admission, &mut seen), resumed(&[2]));
        assert!(admission.admit(2).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_fenced_or_released_then_held_again_is_taken_again() {
        let admission = Admission::new(4, DEADLINE);
        let mut seen = admission.grants().borrow().clone();
        admission.hold(0, Instant::now());
        admission.hold(3, Instant::now());
        assert_eq!(regranted(&admission, &mut seen), taken(&[0, 3]));
        tokio::time::advance(Duration::from_secs(6)).await;
        admission.hold(3, Instant::now());
        tokio::time::advance(Duration::from_secs(6)).await;
        let mut fenced = Vec::new();
        assert_eq!(admission.fence(|slot| fenced.push(slot)), [0]);
        assert_eq!(fenced, [0], "told before the slot stops admitting");
        assert_eq!(admission.held(), [3].into());
        assert!(admission.lose(3, |_| ()));
        assert!(
            !admission.lose(3, |_| panic!("not held any more")),
            "lost once"
        );
        admission.hold(0, Instant::now());
        admission.hold(3, Instant::now());
        assert_eq!(regranted(&admission, &mut seen), taken(&[0, 3]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_waits_for_the_reconciles_admitted_on_the_slot() {
        let admission = Arc::new(Admission::new(2, DEADLINE));
        admission.hold(1, Instant::now());
        let guard = admission.admit(1).unwrap();
        assert_eq!(guard.slot(), 1);
        assert!(admission.release(1));
        assert_eq!(admission.admit(1).err(), Some(Refusal::NotHeld));
        assert_eq!(admission.running(1), 1);
        let waiting = tokio::spawn({
            let admission = admission.clone();
            async move { admission.drained(1).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a reconcile still runs");
        drop(guard);
        waiting.await.unwrap();
        assert_eq!(admission.running(1), 0);
    }
}
