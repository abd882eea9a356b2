//! Handing a slot over without a gap: a deletion is the one change a new owner cannot
//! learn from its own list, so the old owner lets a slot go only once the new owner's
//! cache follows the slot and the old owner has reconciled everything it saw before that.
//!
//! A replica whose controllers report their caches ([`Handover`]) writes what they follow
//! into its member Lease ([`COVERAGE_ANNOTATION`]): the slots, and the resourceVersion of
//! the list from which its caches have followed them. A replica that holds a slot dealt
//! to another keeps it, and keeps reconciling on it, until that other replica's member
//! Lease says it follows the slot and its own controllers have caught up with the version
//! it gives. Every change of the slot up to that version has then been reconciled here;
//! every change after it reaches the new owner's cache, which holds back what it refuses
//! until it takes the slot. A replica without controllers on the ring writes no coverage,
//! and its slots are let go as soon as they are dealt elsewhere.

use super::forward::ForwardedDeletion;
use std::{
    collections::BTreeSet,
    sync::{
        Arc, Mutex, PoisonError, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

/// The member Lease annotation that says which slots a replica's caches follow, and from
/// which resourceVersion: `rv=<version>;slots=<slot>,<slot>,...`.
pub const COVERAGE_ANNOTATION: &str = "sharding.kube-informer.dev/covered";

/// The slots a replica's caches follow, and the resourceVersion since which they do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Coverage {
    pub(crate) slots: BTreeSet<u16>,
    pub(crate) resource_version: u64,
}

impl Coverage {
    /// As [`COVERAGE_ANNOTATION`] writes it.
    pub(crate) fn encode(&self) -> String {
        let slots: Vec<String> = self.slots.iter().map(u16::to_string).collect();
        format!("rv={};slots={}", self.resource_version, slots.join(","))
    }

    /// Reads an annotation [`encode`](Self::encode) wrote; `None` for anything else.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let (version, slots) = text.split_once(';')?;
        let resource_version = version.strip_prefix("rv=")?.parse().ok()?;
        let slots = slots.strip_prefix("slots=")?;
        let slots = if slots.is_empty() {
            BTreeSet::new()
        } else {
            slots
                .split(',')
                .map(|s| s.parse().ok())
                .collect::<Option<_>>()?
        };
        Some(Self {
            slots,
            resource_version,
        })
    }
}

/// What a controller running on the ring tells it, so its slots are handed over without
/// a gap.
pub(crate) trait Handover: Send + Sync {
    /// The slots of `count` this controller's cache follows, and since which version;
    /// `None` until its first list is done.
    fn coverage(&self, count: u16) -> Option<Coverage>;

    /// Whether every change of `slot` up to `version` has reached this controller's cache
    /// and its reconciles have finished or are running.
    fn caught_up(&self, slot: u16, version: u64) -> bool;

    /// Deletions another replica forwards in slots this one holds (see `forward`): the
    /// controller they name queues them.
    fn take_forwarded(&self, deletions: &[ForwardedDeletion]);
}

/// The controllers reporting to one ring.
#[derive(Default)]
pub(crate) struct Handovers {
    next: AtomicU64,
    registered: Mutex<Vec<(u64, Arc<dyn Handover>)>>,
    /// Whether a controller was built on the ring: until it reports, the replica follows
    /// nothing, so no slot is handed to it before its cache can take the slot's changes.
    expected: AtomicBool,
}

impl Handovers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Arc<dyn Handover>)>> {
        self.registered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, handover: Arc<dyn Handover>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().push((id, handover));
        id
    }

    fn remove(&self, id: u64) {
        self.lock().retain(|(registered, _)| *registered != id);
    }

    /// A controller will report: until one does, this replica follows nothing.
    pub(crate) fn expect(&self) {
        self.expected.store(true, Ordering::Relaxed);
    }

    /// What every registered controller follows: the slots all of them do, from the
    /// latest of their versions. `None` when no controller was built on the ring (nothing
    /// is written); no slots while one has not listed or reported yet.
    pub(crate) fn coverage(&self, count: u16) -> Option<Coverage> {
        let registered = self.lock();
        if registered.is_empty() && self.expected.load(Ordering::Relaxed) {
            return Some(Coverage {
                slots: BTreeSet::new(),
                resource_version: 0,
            });
        }
        let mut shared: Option<Coverage> = None;
        for (_, handover) in registered.iter() {
            let Some(coverage) = handover.coverage(count) else {
                return Some(Coverage {
                    slots: BTreeSet::new(),
                    resource_version: 0,
                });
            };
            shared = Some(match shared {
                None => coverage,
                Some(so_far) => Coverage {
                    slots: so_far
                        .slots
                        .intersection(&coverage.slots)
                        .copied()
                        .collect(),
                    resource_version: so_far.resource_version.max(coverage.resource_version),
                },
            });
        }
        shared
    }

    /// Whether a controller was built on the ring here: only then is there anything to
    /// forward from, or a cache to hand over.
    pub(crate) fn any(&self) -> bool {
        self.expected.load(Ordering::Relaxed) || !self.lock().is_empty()
    }

    /// Hands forwarded deletions to every registered controller.
    pub(crate) fn take_forwarded(&self, deletions: &[ForwardedDeletion]) {
        for (_, handover) in self.lock().iter() {
            handover.take_forwarded(deletions);
        }
    }

    /// Whether every registered controller has caught up with `version` on `slot`.
    pub(crate) fn caught_up(&self, slot: u16, version: u64) -> bool {
        self.lock()
            .iter()
            .all(|(_, handover)| handover.caught_up(slot, version))
    }
}

/// A controller's report to a ring, withdrawn when dropped.
pub(crate) struct HandoverRegistration {
    handovers: Weak<Handovers>,
    id: u64,
}

impl HandoverRegistration {
    pub(crate) fn new(handovers: &Arc<Handovers>, handover: Arc<dyn Handover>) -> Self {
        Self {
            id: handovers.add(handover),
            handovers: Arc::downgrade(handovers),
        }
    }
}

impl Drop for HandoverRegistration {
    fn drop(&mut self) {
        if let Some(handovers) = self.handovers.upgrade() {
            handovers.remove(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Option<Coverage>, u64);

    impl Handover for Fixed {
        fn coverage(&self, _count: u16) -> Option<Coverage> {
            self.0.clone()
        }

        fn caught_up(&self, _slot: u16, version: u64) -> bool {
            version <= self.1
        }

        fn take_forwarded(&self, _deletions: &[ForwardedDeletion]) {}
    }

    fn coverage(slots: &[u16], resource_version: u64) -> Coverage {
        Coverage {
            slots: slots.iter().copied().collect(),
            resource_version,
        }
    }

    #[test]
    fn coverage_reads_back_what_it_wrote_and_nothing_else() {
        for written in [coverage(&[0, 3, 15], 1234), coverage(&[], 7)] {
            assert_eq!(Coverage::parse(&written.encode()), Some(written));
        }
        for garbage in [
            "",
            "rv=1",
            "rv=x;slots=1",
            "rv=1;slots=1,,2",
            "slots=1;rv=1",
        ] {
            assert_eq!(Coverage::parse(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn controllers_share_the_slots_all_of_them_follow_from_the_latest_version() {
        let handovers = Arc::new(Handovers::default());
        assert_eq!(
            handovers.coverage(16),
            None,
            "nothing to write without controllers"
        );
        let a = HandoverRegistration::new(
            &handovers,
            Arc::new(Fixed(Some(coverage(&[1, 2, 3], 10)), 20)),
        );
        let b = HandoverRegistration::new(
            &handovers,
            Arc::new(Fixed(Some(coverage(&[2, 3, 4], 12)), 30)),
        );
        assert_eq!(handovers.coverage(16), Some(coverage(&[2, 3], 12)));
        assert!(handovers.caught_up(2, 20));
        assert!(!handovers.caught_up(2, 21), "a is behind");
        drop(a);
        assert!(handovers.caught_up(2, 21));
        let unlisted = HandoverRegistration::new(&handovers, Arc::new(Fixed(None, 0)));
        assert_eq!(
            handovers.coverage(16),
            Some(coverage(&[], 0)),
            "a controller that has not listed follows nothing yet"
        );
        drop((b, unlisted));
        assert_eq!(handovers.coverage(16), None);
        handovers.expect();
        assert_eq!(
            handovers.coverage(16),
            Some(coverage(&[], 0)),
            "a controller built on the ring and not running yet follows nothing"
        );
    }
}
