//! How slots are dealt to a ring's members, and what one replica sees of the deal.

use std::collections::BTreeSet;

use crate::list_watch::{HashRange, Shard, ShardField, fnv1a_64};

/// What one replica sees of its ring.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingView {
    /// Live members, sorted.
    pub members: Vec<String>,
    /// Slots dealt to this replica.
    pub assigned: BTreeSet<u16>,
    /// Slots this replica holds: the ones it may reconcile.
    pub held: BTreeSet<u16>,
    /// Slots this replica would be dealt if the members that have not renewed within their
    /// renew deadline (so have stopped reconciling) left: cached ahead, so a replica that
    /// died hands over to warm caches when its Leases expire.
    pub warming: BTreeSet<u16>,
    /// Slots this replica lost without handing them over (its renewals failed for the
    /// renew deadline): still cached, so the deletions it had not seen there when it lost
    /// them reach it and are forwarded to their new holder, until that holder's cache
    /// follows the slot (see [`FORWARDED_ANNOTATION`](super::FORWARDED_ANNOTATION)).
    pub owed: BTreeSet<u16>,
    /// Slots in the ring.
    pub slots: u16,
}

impl RingView {
    /// The objects this replica should cache: those of the slots it is assigned, holds,
    /// is warming or owes (a slot's objects are cached before it is taken, and until it is
    /// let go or, lost, its deletions forwarded). `None` when it has none.
    pub fn shard(&self) -> Option<Shard> {
        self.shard_by(ShardField::Uid)
    }

    /// The same slots over another field: [`ShardField::ControllerUid`] gives the children
    /// whose controller owner is in [`shard`](Self::shard).
    pub fn shard_by(&self, field: ShardField) -> Option<Shard> {
        let slots: BTreeSet<u16> = self
            .assigned
            .iter()
            .chain(&self.held)
            .chain(&self.warming)
            .chain(&self.owed)
            .copied()
            .collect();
        let ranges = merged_ranges(&slots, self.slots);
        Shard::new(field, ranges)
    }
}

/// The slot an object with this UID falls in, of `slots`.
pub fn slot_of(uid: &str, slots: u16) -> u16 {
    let part = HashRange::part_of(fnv1a_64(uid.as_bytes()), usize::from(slots));
    u16::try_from(part).unwrap_or(0)
}

/// Adjacent slots as one range each; slot `s` of `count` is `HashRange::part(s, count)`.
pub(super) fn merged_ranges(slots: &BTreeSet<u16>, count: u16) -> Vec<HashRange> {
    let mut runs: Vec<(u64, u128)> = Vec::new();
    for &slot in slots {
        let Some(part) = HashRange::part(usize::from(slot), usize::from(count)) else {
            continue;
        };
        match runs.last_mut() {
            Some(last) if last.1 == u128::from(part.start()) => last.1 = part.end(),
            _ => runs.push((part.start(), part.end())),
        }
    }
    runs.into_iter()
        .filter_map(|(start, end)| HashRange::new(start, end))
        .collect()
}

/// The owner of each of `slots` among `members` (sorted), as indexes into `members`: by
/// rendezvous hashing with equal capacities (see the [module docs](super)).
pub(super) fn deal(members: &[String], slots: u16) -> Vec<usize> {
    let count = members.len().max(1);
    let base = usize::from(slots) / count;
    let extra = usize::from(slots) % count;
    let capacity = |member: usize| base + usize::from(member < extra);
    let member_hashes: Vec<u64> = members.iter().map(|m| fnv1a_64(m.as_bytes())).collect();
    let mut load = vec![0; count];
    let mut owners = Vec::with_capacity(usize::from(slots));
    for slot in 0..slots {
        let mut ranked: Vec<usize> = (0..members.len()).collect();
        ranked.sort_by_key(|&m| std::cmp::Reverse((mix(member_hashes[m], slot), m)));
        // The capacities add up to the slots, so someone always has room.
        let owner = ranked
            .into_iter()
            .find(|&m| load[m] < capacity(m))
            .unwrap_or(0);
        if let Some(load) = load.get_mut(owner) {
            *load += 1;
        }
        owners.push(owner);
    }
    owners
}

/// A well-spread 64-bit score of a member for a slot (the member's FNV-1a hash and the
/// slot, through MurmurHash3's finaliser).
fn mix(member: u64, slot: u16) -> u64 {
    let mut x = member ^ u64::from(slot).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The slots `me` is dealt of `slots` when `members` (sorted, `me` among them) are the
/// ring's live members: what every member computes (see the [module docs](super)). Empty
/// when `me` is not a member.
///
/// ```
/// use kube_informer::sharding::dealt_slots;
///
/// let members = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
/// let sizes: Vec<usize> = members.iter().map(|m| dealt_slots(&members, m, 16).len()).collect();
/// assert_eq!(sizes, [6, 5, 5]);
/// ```
pub fn dealt_slots(members: &[String], me: &str, slots: u16) -> BTreeSet<u16> {
    let Some(index) = members.iter().position(|m| m == me) else {
        return BTreeSet::new();
    };
    deal(members, slots)
        .into_iter()
        .zip(0..slots)
        .filter(|(owner, _)| *owner == index)
        .map(|(_, slot)| slot)
        .collect()
}
