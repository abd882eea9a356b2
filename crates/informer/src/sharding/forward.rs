//! Deletions a replica saw in slots it lost without handing them over, forwarded to
//! their new owner.
//!
//! A slot changes hands without a gap when its holder lets it go (see `handover`). A
//! holder cut off from the API server for a lease duration cannot: its renewals fail, it
//! stops reconciling the slot (fencing), and another replica takes the slot once the Lease
//! expires. An object deleted while the old holder could not see it and before the new
//! one listed the slot is in neither's cache; nothing else would reconcile its deletion.
//!
//! So a replica keeps caching a slot it lost this way (the slot is **owed**,
//! [`RingView::owed`](super::RingView::owed)), and when its cache catches up, the
//! deletions it sees there are written into its member Lease
//! ([`FORWARDED_ANNOTATION`]). The slot's holder queues them for its controllers as
//! deletions and says so in its own member Lease ([`TAKEN_ANNOTATION`]); the forwarder
//! then drops them. The debt ends once the holder's cache follows the slot (its
//! coverage) and this replica's controllers have caught up with the version it gives:
//! every later deletion reaches the holder's cache.
//!
//! A deletion both replicas saw is reconciled twice, which a level-triggered reconcile
//! takes in its stride; one neither saw (the old holder killed before it caught up)
//! takes a finalizer to be sure of.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The member Lease annotation listing the deletions a replica forwards: a JSON array of
/// `{"seq", "slot", "controller", "namespace", "name", "uid"}`.
pub const FORWARDED_ANNOTATION: &str = "sharding.kube-informer.dev/forwarded-deletions";

/// The member Lease annotation saying which forwarded deletions a replica has queued: a
/// JSON object from the forwarding member to, per slot, the last `seq` taken.
pub const TAKEN_ANNOTATION: &str = "sharding.kube-informer.dev/taken-deletions";

/// How many deletions a replica forwards at once: a member Lease's annotations must stay
/// well under the API server's 256 KiB.
pub(crate) const MAX_FORWARDED: usize = 1000;

/// One deletion, as a replica forwards it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ForwardedDeletion {
    /// Orders one replica's forwards: a later one has a greater `seq`.
    pub(crate) seq: u64,
    pub(crate) slot: u16,
    /// The controller that saw it, by name: only its namesake on the holder takes it.
    pub(crate) controller: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) namespace: Option<String>,
    pub(crate) name: String,
    pub(crate) uid: String,
}

/// Per forwarding member, per slot, the last `seq` taken.
type Taken = BTreeMap<String, BTreeMap<u16, u64>>;

/// Why a deletion was not forwarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotForwarded {
    /// The slot was handed over (or never held): its holder's cache sees the deletion.
    NotOwed,
    /// [`MAX_FORWARDED`] deletions wait for their holders already.
    Full,
}

/// What one replica forwards and has taken.
#[derive(Debug)]
pub(crate) struct Forwarding {
    owed: BTreeSet<u16>,
    outbox: Vec<ForwardedDeletion>,
    next_seq: u64,
    taken: Taken,
}

/// What the forwarding state of other members, read from their Leases, says.
#[derive(Debug, Default)]
pub(crate) struct MemberNotes<'a> {
    /// A member's forwarded deletions, as it wrote them.
    pub(crate) forwarded: Option<&'a str>,
    /// What a member says it has taken.
    pub(crate) taken: Option<&'a str>,
}

impl Forwarding {
    /// Nothing owed; `seq`s counted from `first_seq` (a restarted replica must not reuse
    /// the numbers its previous run forwarded under, which holders may have taken).
    pub(crate) fn new(first_seq: u64) -> Self {
        Self {
            owed: BTreeSet::new(),
            outbox: Vec::new(),
            next_seq: first_seq,
            taken: Taken::new(),
        }
    }

    /// `slot` was lost without a handover.
    pub(crate) fn lost(&mut self, slot: u16) {
        self.owed.insert(slot);
    }

    pub(crate) fn owed(&self) -> &BTreeSet<u16> {
        &self.owed
    }

    /// Forwards a deletion seen in `slot`.
    pub(crate) fn forward(
        &mut self,
        slot: u16,
        controller: &str,
        namespace: Option<&str>,
        name: &str,
        uid: &str,
    ) -> Result<(), NotForwarded> {
        if !self.owed.contains(&slot) {
            return Err(NotForwarded::NotOwed);
        }
        if self.outbox.len() >= MAX_FORWARDED {
            return Err(NotForwarded::Full);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.outbox.push(ForwardedDeletion {
            seq,
            slot,
            controller: controller.to_owned(),
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
            uid: uid.to_owned(),
        });
        Ok(())
    }

    /// [`FORWARDED_ANNOTATION`]'s value, `None` when nothing is forwarded.
    pub(crate) fn encode_forwarded(&self) -> Option<String> {
        (!self.outbox.is_empty()).then(|| serde_json::to_string(&self.outbox).unwrap_or_default())
    }

    /// [`TAKEN_ANNOTATION`]'s value, `None` when nothing was taken.
    pub(crate) fn encode_taken(&self) -> Option<String> {
        (!self.taken.is_empty()).then(|| serde_json::to_string(&self.taken).unwrap_or_default())
    }

    /// Takes what other members forward in the slots this replica holds (`held`), and
    /// drops from its own forwards what their holders have taken. Returns the deletions
    /// for this replica's controllers: others' it had not taken yet, and its own in slots
    /// it holds again.
    ///
    /// `members` are the other members' notes by identity; `holder` names a slot's
    /// holder.
    pub(crate) fn exchange(
        &mut self,
        me: &str,
        held: &BTreeSet<u16>,
        members: &BTreeMap<String, MemberNotes<'_>>,
        holder: impl Fn(u16) -> Option<String>,
    ) -> Vec<ForwardedDeletion> {
        let mut deliver = Vec::new();
        let mut taken = Taken::new();
        for (member, notes) in members {
            let Some(forwarded) = notes.forwarded.and_then(parse_forwarded) else {
                continue;
            };
            let already = self.taken.get(member);
            let mut now = BTreeMap::new();
            for deletion in forwarded {
                let seen = now
                    .get(&deletion.slot)
                    .or_else(|| already.and_then(|slots| slots.get(&deletion.slot)))
                    .copied();
                if held.contains(&deletion.slot) && seen.is_none_or(|seen| deletion.seq > seen) {
                    now.insert(deletion.slot, deletion.seq.max(seen.unwrap_or(0)));
                    deliver.push(deletion);
                } else if let Some(seen) = seen {
                    now.entry(deletion.slot).or_insert(seen);
                }
            }
            // Only slots the member still forwards are remembered.
            if !now.is_empty() {
                taken.insert(member.clone(), now);
            }
        }
        self.taken = taken;

        let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.outbox)
            .into_iter()
            .partition(|deletion| held.contains(&deletion.slot));
        deliver.extend(mine);
        self.outbox = others
            .into_iter()
            .filter(|deletion| {
                let Some(holder) = holder(deletion.slot) else {
                    return true;
                };
                let said = members
                    .get(&holder)
                    .and_then(|notes| notes.taken)
                    .and_then(|taken| serde_json::from_str::<Taken>(taken).ok());
                let taken = said
                    .as_ref()
                    .and_then(|taken| taken.get(me))
                    .and_then(|slots| slots.get(&deletion.slot));
                taken.is_none_or(|&taken| taken < deletion.seq)
            })
            .collect();
        deliver
    }

    /// Ends the debt on `slot`: it is held here again, or its holder's cache follows
    /// every change this replica could still forward.
    pub(crate) fn settle(&mut self, slot: u16) {
        self.owed.remove(&slot);
    }
}

fn parse_forwarded(text: &str) -> Option<Vec<ForwardedDeletion>> {
    match serde_json::from_str(text) {
        Ok(forwarded) => Some(forwarded),
        Err(error) => {
            tracing::warn!(%error, "a member's forwarded deletions cannot be read; ignored");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(slots: &[u16]) -> BTreeSet<u16> {
        slots.iter().copied().collect()
    }

    fn notes<'a>(forwarded: Option<&'a str>, taken: Option<&'a str>) -> MemberNotes<'a> {
        MemberNotes { forwarded, taken }
    }

    #[test]
    fn only_deletions_in_a_slot_lost_without_a_handover_are_forwarded() {
        let mut a = Forwarding::new(1);
        assert_eq!(
            a.forward(3, "c", Some("ns"), "x", "u1"),
            Err(NotForwarded::NotOwed)
        );
        a.lost(3);
        assert_eq!(a.forward(3, "c", Some("ns"), "x", "u1"), Ok(()));
        assert_eq!(
            a.forward(4, "c", Some("ns"), "y", "u2"),
            Err(NotForwarded::NotOwed)
        );
        for i in 1..MAX_FORWARDED {
            a.forward(3, "c", None, &format!("n{i}"), "u").unwrap();
        }
        assert_eq!(
            a.forward(3, "c", None, "over", "u"),
            Err(NotForwarded::Full)
        );
        a.settle(3);
        assert!(a.owed().is_empty());
    }

    #[test]
    fn forwarded_deletions_are_taken_once_by_the_holder_and_then_dropped() {
        let mut a = Forwarding::new(10);
        let mut b = Forwarding::new(500);
        a.lost(3);
        a.forward(3, "c", Some("ns"), "x", "u1").unwrap();
        a.forward(3, "c", Some("ns"), "y", "u2").unwrap();
        let a_wrote = a.encode_forwarded().unwrap();

        // b does not hold slot 3 yet: it takes nothing.
        let members = BTreeMap::from([("a".to_owned(), notes(Some(&a_wrote), None))]);
        assert!(b.exchange("b", &held(&[1]), &members, |_| None).is_empty());
        assert_eq!(b.encode_taken(), None);

        // Now it does: both, once.
        let got = b.exchange("b", &held(&[3]), &members, |_| None);
        let names: Vec<&str> = got.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["x", "y"]);
        assert!(b.exchange("b", &held(&[3]), &members, |_| None).is_empty());
        let b_wrote = b.encode_taken().unwrap();

        // a keeps them until the holder says it took them.
        let holder = |_| Some("b".to_owned());
        let members = BTreeMap::from([("b".to_owned(), notes(None, None))]);
        assert!(a.exchange("a", &held(&[]), &members, holder).is_empty());
        assert!(a.encode_forwarded().is_some());
        let members = BTreeMap::from([("b".to_owned(), notes(None, Some(&b_wrote)))]);
        a.forward(3, "c", Some("ns"), "z", "u3").unwrap();
        a.exchange("a", &held(&[]), &members, holder);
        let left: Vec<ForwardedDeletion> =
            serde_json::from_str(&a.encode_forwarded().unwrap()).unwrap();
        assert_eq!(left.len(), 1, "z was forwarded after b's note: {left:?}");
        assert_eq!(left[0].name, "z");

        // b takes z, and forgets a once a forwards nothing.
        let a_wrote = a.encode_forwarded();
        let members = BTreeMap::from([("a".to_owned(), notes(a_wrote.as_deref(), None))]);
        let got = b.exchange("b", &held(&[3]), &members, |_| None);
        assert_eq!(got.len(), 1);
        let members = BTreeMap::from([("a".to_owned(), notes(None, None))]);
        b.exchange("b", &held(&[3]), &members, |_| None);
        assert_eq!(b.encode_taken(), None);
    }

    #[test]
    fn a_replica_that_holds_its_lost_slot_again_takes_its_own_forwards() {
        let mut a = Forwarding::new(1);
        a.lost(2);
        a.forward(2, "c", None, "x", "u1").unwrap();
        let got = a.exchange("a", &held(&[2]), &BTreeMap::new(), |_| None);
        assert_eq!(got.len(), 1);
        assert_eq!(a.encode_forwarded(), None);
    }

    #[test]
    fn unreadable_notes_are_ignored() {
        let mut b = Forwarding::new(1);
        let members = BTreeMap::from([("a".to_owned(), notes(Some("not json"), None))]);
        assert!(b.exchange("b", &held(&[0]), &members, |_| None).is_empty());
    }
}
