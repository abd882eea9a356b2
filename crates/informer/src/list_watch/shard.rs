//! A shard of a collection: the objects whose 64-bit FNV-1a hash of one metadata field falls
//! in one or more ranges, as Kubernetes' sharded list and watch (KEP-5866,
//! `ListOptions.shardSelector`, alpha behind the kube-apiserver gate `ShardedListAndWatch`)
//! selects them. The same hash is computed here, so a client can apply the shard itself
//! where the server does not, and hold the same objects either way.

use std::fmt;

use kube_core::Resource;

/// The metadata field a [`Shard`] hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShardField {
    /// `metadata.uid`: objects spread evenly, whatever their names and namespaces.
    Uid,
    /// `metadata.namespace`: a namespace's objects stay together.
    Namespace,
    /// The `uid` of the object's controller owner reference (`controller: true`): an
    /// object lands where its owner's [`Uid`](Self::Uid) does, so a sharded controller's
    /// children are cached beside their parent. The API server cannot select on it, so
    /// the informer applies it (every child is still sent, and only kept where its owner
    /// is); an object without a controller owner belongs to no shard. Unlike a UID, it
    /// can change (adoption, orphaning): an object whose owner moves it out of the shard
    /// leaves the cache as a delete.
    ControllerUid,
}

impl ShardField {
    /// The field's path in a shard selector (`object.metadata.uid`).
    pub fn path(self) -> &'static str {
        match self {
            ShardField::Uid => "object.metadata.uid",
            ShardField::Namespace => "object.metadata.namespace",
            ShardField::ControllerUid => "object.metadata.ownerReferences[controller].uid",
        }
    }

    /// Whether the API server can select on the field (KEP-5866 supports the UID and the
    /// namespace); a shard on any other is applied by the informer alone.
    pub fn server_side(self) -> bool {
        matches!(self, ShardField::Uid | ShardField::Namespace)
    }

    /// Whether an object's value of the field can change, so an update can move it out
    /// of a shard.
    pub(crate) fn mutable(self) -> bool {
        matches!(self, ShardField::ControllerUid)
    }
}

/// A range of the hash space, `[start, end)`; `end` may be 2^64 (the whole top).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HashRange {
    start: u64,
    /// Exclusive; up to 2^64.
    end: u128,
}

/// One past the largest hash.
const HASH_SPACE: u128 = 1 << 64;

impl HashRange {
    /// The hashes from `start` up to (not including) `end`; `end` is at most 2^64.
    /// `None` for an empty range or an end past 2^64.
    pub fn new(start: u64, end: u128) -> Option<Self> {
        (u128::from(start) < end && end <= HASH_SPACE).then_some(Self { start, end })
    }

    /// The whole hash space.
    pub fn all() -> Self {
        Self {
            start: 0,
            end: HASH_SPACE,
        }
    }

    /// The `index`-th of `count` equal parts of the hash space (the last takes the
    /// remainder). `None` when `index >= count`.
    pub fn part(index: usize, count: usize) -> Option<Self> {
        if index >= count {
            return None;
        }
        let width = HASH_SPACE / count as u128;
        let start = width * index as u128;
        let end = if index + 1 == count {
            HASH_SPACE
        } else {
            start + width
        };
        Some(Self {
            start: u64::try_from(start).ok()?,
            end,
        })
    }

    /// Which of `count` equal parts, as [`part`](Self::part) cuts them, holds `hash`
    /// (0 for a `count` of 0).
    pub fn part_of(hash: u64, count: usize) -> usize {
        let Some(width) = HASH_SPACE.checked_div(count as u128) else {
            return 0;
        };
        let index = (u128::from(hash) / width).min(count as u128 - 1);
        usize::try_from(index).unwrap_or(0)
    }

    /// The first hash in the range.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// One past the last hash in the range (up to 2^64).
    pub fn end(&self) -> u128 {
        self.end
    }

    /// Whether `hash` falls in the range.
    pub fn contains(&self, hash: u64) -> bool {
        self.start <= hash && u128::from(hash) < self.end
    }
}

/// Which objects of a collection a list and watch return: those whose hash of `field`
/// falls in any of the ranges (KEP-5866's `shardRange(field, start, end) || ...`).
///
/// ```
/// use kube_informer::list_watch::{HashRange, Shard, ShardField};
///
/// // The second of three equal shards by UID.
/// let shard = Shard::new(ShardField::Uid, [HashRange::part(1, 3).unwrap()]).unwrap();
/// assert_eq!(
///     shard.selector(),
///     "shardRange(object.metadata.uid, '0x5555555555555555', '0xaaaaaaaaaaaaaaaa')"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shard {
    field: ShardField,
    ranges: Vec<HashRange>,
}

impl Shard {
    /// The objects whose hash of `field` falls in any of `ranges`. `None` without ranges
    /// (a shard of nothing would be a list that can never be told from an empty one).
    pub fn new(field: ShardField, ranges: impl IntoIterator<Item = HashRange>) -> Option<Self> {
        let mut ranges: Vec<_> = ranges.into_iter().collect();
        ranges.sort();
        ranges.dedup();
        (!ranges.is_empty()).then_some(Self { field, ranges })
    }

    /// Every object with the field: the whole hash space.
    pub fn everything(field: ShardField) -> Self {
        Self {
            field,
            ranges: vec![HashRange::all()],
        }
    }

    /// The field hashed.
    pub fn field(&self) -> ShardField {
        self.field
    }

    /// The ranges, in order.
    pub fn ranges(&self) -> &[HashRange] {
        &self.ranges
    }

    /// The `shardSelector` the API server reads.
    pub fn selector(&self) -> String {
        let path = self.field.path();
        self.ranges
            .iter()
            .map(|r| {
                format!(
                    "shardRange({path}, '{}', '{}')",
                    hex(u128::from(r.start)),
                    hex(r.end)
                )
            })
            .collect::<Vec<_>>()
            .join(" || ")
    }

    /// Whether an object with this field value belongs to the shard.
    pub fn contains_value(&self, value: &str) -> bool {
        let hash = fnv1a_64(value.as_bytes());
        self.ranges.iter().any(|r| r.contains(hash))
    }

    /// Whether `object` belongs to the shard, as the API server decides it.
    pub fn contains<K: Resource>(&self, object: &K) -> bool {
        let meta = object.meta();
        let value = match self.field {
            ShardField::Uid => meta.uid.as_deref(),
            ShardField::Namespace => meta.namespace.as_deref(),
            ShardField::ControllerUid => {
                let owner = meta
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|r| r.controller == Some(true));
                match owner {
                    Some(owner) => Some(owner.uid.as_str()),
                    None => return false,
                }
            }
        };
        self.contains_value(value.unwrap_or_default())
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.selector())
    }
}

/// How the API server spells a bound: `0x` and 16 lowercase hex digits, or
/// `0x10000000000000000` for 2^64.
fn hex(value: u128) -> String {
    format!("0x{value:016x}")
}

/// The 64-bit FNV-1a hash, as Go's `hash/fnv` `New64a` computes it.
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    })
}

/// Whether the API server applied a shard, as the last list said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardMode {
    /// The server selected the shard's objects (it echoed the selector in
    /// `metadata.shardInfo`): only they were sent.
    Server,
    /// The server sent the whole collection (gate off, or an older server); the client
    /// kept the shard's objects.
    Client,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_go_s_fnv_1a() {
        // Values from Go's hash/fnv (New64a).
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn parts_cover_the_space_without_overlap() {
        for count in 1..=7 {
            let parts: Vec<_> = (0..count)
                .map(|i| HashRange::part(i, count).unwrap())
                .collect();
            assert_eq!(parts[0].start(), 0);
            assert_eq!(parts[count - 1].end(), HASH_SPACE);
            for hash in [
                0,
                1 << 40,
                u64::MAX / 3,
                u64::MAX / 2,
                u64::MAX - 1,
                u64::MAX,
            ] {
                let index = HashRange::part_of(hash, count);
                assert!(
                    parts[index].contains(hash),
                    "{hash:#x} in part {index} of {count}"
                );
            }
            for pair in parts.windows(2) {
                assert_eq!(u128::from(pair[1].start()), pair[0].end());
            }
        }
        assert_eq!(HashRange::part(3, 3), None);
    }

    #[test]
    fn a_child_is_in_the_shard_of_its_controller_owner() {
        use k8s_openapi::{
            api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::OwnerReference,
        };
        let owned = |uid: &str, controller| Secret {
            metadata: kube_core::ObjectMeta {
                owner_references: Some(vec![OwnerReference {
                    uid: uid.to_owned(),
                    controller: Some(controller),
                    ..OwnerReference::default()
                }]),
                ..kube_core::ObjectMeta::default()
            },
            ..Secret::default()
        };
        let halves: Vec<Shard> = (0..2)
            .map(|i| {
                Shard::new(ShardField::ControllerUid, [HashRange::part(i, 2).unwrap()]).unwrap()
            })
            .collect();
        for uid in ["a", "b", "c", "d", "e"] {
            let by_uid = Shard::new(ShardField::Uid, halves[0].ranges().to_vec()).unwrap();
            assert_eq!(
                halves[0].contains(&owned(uid, true)),
                by_uid.contains_value(uid)
            );
            assert_ne!(
                halves[0].contains(&owned(uid, true)),
                halves[1].contains(&owned(uid, true))
            );
        }
        // No controller owner: in no shard, not even the whole space.
        let everything = Shard::everything(ShardField::ControllerUid);
        assert!(!everything.contains(&owned("a", false)));
        assert!(!everything.contains(&Secret::default()));
        assert!(!ShardField::ControllerUid.server_side());
    }

    #[test]
    fn the_selector_is_what_the_server_parses() {
        let halves = Shard::new(
            ShardField::Uid,
            [
                HashRange::part(1, 2).unwrap(),
                HashRange::part(0, 2).unwrap(),
            ],
        )
        .unwrap();
        assert_eq!(
            halves.selector(),
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || \
             shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')"
        );
        assert_eq!(Shard::new(ShardField::Namespace, []), None);
        assert_eq!(HashRange::new(5, 5), None);
        assert_eq!(HashRange::new(0, HASH_SPACE + 1), None);
    }

    #[test]
    fn membership_follows_the_hash() {
        let low = Shard::new(ShardField::Uid, [HashRange::part(0, 2).unwrap()]).unwrap();
        let high = Shard::new(ShardField::Uid, [HashRange::part(1, 2).unwrap()]).unwrap();
        for uid in (0..200).map(|i| format!("uid-{i}")) {
            let in_low = low.contains_value(&uid);
            assert_ne!(
                in_low,
                high.contains_value(&uid),
                "{uid} is in exactly one half"
            );
            assert_eq!(in_low, fnv1a_64(uid.as_bytes()) < 1 << 63);
        }
    }
}
