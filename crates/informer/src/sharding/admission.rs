//! Which slots a replica may reconcile on at this instant, the reconciles running on each,
//! and a count per slot of the times it started admitting again.
//!
//! A reconcile refused on a slot is dropped by the controller that asked (another replica
//! owns the key, or will once it takes the slot). When this replica itself starts
//! admitting on the slot again (it takes the slot, or renews it after its renewals lapsed)
//! whatever it refused meanwhile must be reconciled after all: the slot's count of
//! [`Grants`] goes up, and the controllers on the ring queue their cached objects of the
//! slot again. The count is bumped under the lock [`Admission::admit`] decides under, so a
//! refusal either comes before the bump (and the requeue, which reads the cache after the
//! bump, sees at least what the refused reconcile would have) or is not a refusal.

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

/// How many times each slot has started admitting reconciles on this replica: a slot whose
/// count changed may admit keys it refused before.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Grants(Vec<u64>);

impl Grants {
    /// No grant yet, of `slots` slots.
    pub(crate) fn none(slots: u16) -> Self {
        Self(vec![0; usize::from(slots)])
    }

    /// The slots granted again since `earlier`.
    pub(crate) fn since(&self, earlier: &Grants) -> BTreeSet<u16> {
        self.0
            .iter()
            .zip(&earlier.0)
            .zip(0u16..)
            .filter(|((now, then), _)| now != then)
            .map(|(_, slot)| slot)
            .collect()
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
    /// grants the slot again.
    pub(crate) fn admit(&self, slot: u16) -> Option<SlotGuard> {
        let mut held = self.lock();
        let state = held.get_mut(usize::from(slot))?;
        let renewed = state.renewed?;
        if !self.fresh(renewed) {
            state.refused = true;
            return None;
        }
        // Counted under the lock that `release` takes before anyone waits for the count.
        self.in_flight.counts[usize::from(slot)].fetch_add(1, Ordering::AcqRel);
        Some(SlotGuard {
            in_flight: self.in_flight.clone(),
            slot,
        })
    }

    /// The slots [`admit`](Self::admit) grants guards on now.
    pub(crate) fn admitting(&self) -> BTreeSet<u16> {
        self.lock()
            .iter()
            .zip(0u16..)
            .filter(|(state, _)| state.renewed.is_some_and(|r| self.fresh(r)))
            .map(|(_, slot)| slot)
            .collect()
    }

    /// The slots held, admitting or not.
    pub(crate) fn held(&self) -> BTreeSet<u16> {
        self.lock()
            .iter()
            .zip(0u16..)
            .filter(|(state, _)| state.renewed.is_some())
            .map(|(_, slot)| slot)
            .collect()
    }

    /// `slot` was taken or renewed by a request sent at `sent`. A slot not held before, or
    /// one that refused a reconcile while its renewals lapsed, is granted again (if `sent`
    /// is recent enough for it to admit).
    pub(crate) fn hold(&self, slot: u16, sent: Instant) {
        let mut held = self.lock();
        let Some(state) = held.get_mut(usize::from(slot)) else {
            return;
        };
        let newly = state.renewed.is_none();
        state.renewed = Some(sent);
        if self.fresh(sent) && (newly || state.refused) {
            state.refused = false;
            self.grants
                .send_modify(|grants| grants.0[usize::from(slot)] += 1);
        }
    }

    /// Stops admitting on `slot`; whether it was held.
    pub(crate) fn release(&self, slot: u16) -> bool {
        let mut held = self.lock();
        held.get_mut(usize::from(slot))
            .is_some_and(|state| std::mem::take(state).renewed.is_some())
    }

    /// Releases the slots whose last renewal is older than the renew deadline; returns them.
    pub(crate) fn fence(&self) -> Vec<u16> {
        let mut held = self.lock();
        let mut dropped = Vec::new();
        for (state, slot) in held.iter_mut().zip(0u16..) {
            if state.renewed.is_some_and(|r| !self.fresh(r)) {
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

    fn regranted(admission: &Admission, before: &mut Grants) -> BTreeSet<u16> {
        let now = admission.grants().borrow().clone();
        let since = now.since(before);
        *before = now;
        since
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_taken_is_granted_and_a_renewal_in_time_is_not() {
        let admission = Admission::new(4, DEADLINE);
        let mut seen = admission.grants().borrow().clone();
        assert!(admission.admit(1).is_none(), "not held");
        admission.hold(1, Instant::now());
        assert_eq!(regranted(&admission, &mut seen), [1].into());
        assert!(admission.admit(1).is_some());
        tokio::time::advance(Duration::from_secs(5)).await;
        admission.hold(1, Instant::now());
        assert!(
            regranted(&admission, &mut seen).is_empty(),
            "renewed in time"
        );
        assert_eq!(admission.admitting(), [1].into());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_while_lapsed_is_granted_again_by_the_renewal_that_ends_the_lapse() {
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
        assert!(regranted(&admission, &mut seen).is_empty());
        tokio::time::advance(DEADLINE).await;
        assert!(admission.admit(2).is_none(), "refused while lapsed");
        // A renewal sent before the lapse ended (answered late) does not end it.
        let late = Instant::now() - DEADLINE;
        admission.hold(2, late);
        assert!(regranted(&admission, &mut seen).is_empty());
        admission.hold(2, Instant::now());
        assert_eq!(regranted(&admission, &mut seen), [2].into());
        assert!(admission.admit(2).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_fenced_or_released_then_held_again_is_granted_again() {
        let admission = Admission::new(4, DEADLINE);
        let mut seen = admission.grants().borrow().clone();
        admission.hold(0, Instant::now());
        admission.hold(3, Instant::now());
        assert_eq!(regranted(&admission, &mut seen), [0, 3].into());
        tokio::time::advance(Duration::from_secs(6)).await;
        admission.hold(3, Instant::now());
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(admission.fence(), [0]);
        assert_eq!(admission.held(), [3].into());
        assert!(admission.release(3));
        assert!(!admission.release(3), "released once");
        admission.hold(0, Instant::now());
        admission.hold(3, Instant::now());
        assert_eq!(regranted(&admission, &mut seen), [0, 3].into());
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_waits_for_the_reconciles_admitted_on_the_slot() {
        let admission = Arc::new(Admission::new(2, DEADLINE));
        admission.hold(1, Instant::now());
        let guard = admission.admit(1).unwrap();
        assert_eq!(guard.slot(), 1);
        assert!(admission.release(1));
        assert!(admission.admit(1).is_none(), "released: admits no more");
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
