//! The decoded working set of a compact store: the objects just delivered to handlers and
//! those just read, kept as the shared `Arc<K>`s they were decoded into, within a budget.
//! The full documentation is on [`WorkingSet`].

use std::{collections::VecDeque, sync::Arc};

use std::collections::HashMap;

use super::KeyHasher;
use crate::{key::ObjectKey, list_watch::RawFormat};

/// How much of a compact store stays decoded, and for how long.
///
/// A compact store (an informer's default) keeps each object as bytes and decodes it on a
/// read. Controllers read the same few objects again and again: the object whose event
/// queued the reconcile, then its children. The working set keeps the objects a watch event
/// just delivered (decoded on arrival already) and those just read, as the `Arc<K>` every
/// later reader shares, so that such a read is a pointer copy. The rest stay bytes.
///
/// Its size is an estimate of the decoded objects' memory: each costs its stored bytes
/// times a factor measured for `Pod`s (14 for protobuf, 5 for JSON). When an entry would
/// pass the budget, the least recently used go back to being bytes only.
///
/// The working set is exact: an entry stands for one write of its key, and a later write,
/// a delete or a relist makes it miss; a read never returns an object the store no longer
/// holds.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{SharedInformer, WorkingSet, testing::FakeListWatch};
///
/// let informer = SharedInformer::builder(FakeListWatch::<ConfigMap>::new("configmaps"))
///     .working_set(WorkingSet::budget(64 << 20))
///     .build();
/// assert_eq!(informer.store().working_set().budget_bytes, 64 << 20);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkingSet {
    budget_bytes: usize,
}

impl WorkingSet {
    /// The default budget: 8 MiB, about 550 decoded Pods of the kind the benchmark caches
    /// (with `managedFields`), a tenth of what client-go's cache of 10,000 such Pods takes.
    pub const DEFAULT_BUDGET_BYTES: usize = 8 << 20;

    /// A working set of at most about `bytes` of decoded objects.
    pub const fn budget(bytes: usize) -> Self {
        Self {
            budget_bytes: bytes,
        }
    }

    /// No working set: every read of a compact store decodes.
    pub const fn off() -> Self {
        Self::budget(0)
    }

    /// The budget, in bytes.
    pub const fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }

    /// The memory a decoded object is estimated to take, from the `len` bytes it is kept
    /// in and their format. The factors are the benchmark's Pods (BENCHMARKS.md, 10,000 of
    /// them): decoded, each took about 14 KiB more than kept as its ~1 KiB of protobuf, and
    /// its compact JSON is about three times its protobuf (`k8s-openapi` structs hold every
    /// optional field inline, and `managedFields` decode into trees of maps).
    pub(super) const fn estimated_size(len: usize, format: Option<RawFormat>) -> usize {
        match format {
            Some(RawFormat::Protobuf { .. }) => len * 14,
            _ => len * 5,
        }
    }
}

impl Default for WorkingSet {
    fn default() -> Self {
        Self::budget(Self::DEFAULT_BUDGET_BYTES)
    }
}

/// What a store's working set holds and how well it served reads; from
/// [`Store::working_set`](crate::Store::working_set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkingSetStats {
    /// The budget, in estimated bytes of decoded objects (0: no working set).
    pub budget_bytes: usize,
    /// The estimated bytes of the objects held now.
    pub bytes: usize,
    /// The objects held now.
    pub objects: usize,
    /// Reads of one object served from the working set.
    pub hits: u64,
    /// Reads of one object that decoded it.
    pub misses: u64,
    /// Objects let go to stay within the budget.
    pub evictions: u64,
}

/// The working set's state, behind a mutex of its own: readers update it (a read makes an
/// object recent), so it cannot live under the store's read lock.
pub(super) struct Hot<K> {
    budget: usize,
    used: usize,
    entries: HashMap<ObjectKey, HotEntry<K>, KeyHasher>,
    /// Keys from least to most recently used, with the tick of that use: an element whose
    /// tick is not its entry's current one is stale and skipped.
    recency: VecDeque<(ObjectKey, u64)>,
    tick: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
}

struct HotEntry<K> {
    object: Arc<K>,
    /// The write of the key this object is (see `Encoded::generation`).
    generation: u64,
    size: usize,
    tick: u64,
}

impl<K> Hot<K> {
    pub(super) fn new(config: WorkingSet) -> Self {
        Self {
            budget: config.budget_bytes,
            used: 0,
            entries: HashMap::default(),
            recency: VecDeque::new(),
            tick: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    pub(super) fn is_off(&self) -> bool {
        self.budget == 0
    }

    /// The decoded object of write `generation` of `key`, if held; counts a hit or a miss.
    pub(super) fn get(&mut self, key: &ObjectKey, generation: u64) -> Option<Arc<K>> {
        if self.is_off() {
            return None;
        }
        let tick = self.next_tick();
        match self.entries.get_mut(key) {
            Some(entry) if entry.generation == generation => {
                entry.tick = tick;
                let object = entry.object.clone();
                self.hits += 1;
                self.recency.push_back((key.clone(), tick));
                self.compact_recency();
                Some(object)
            }
            _ => {
                self.misses += 1;
                None
            }
        }
    }

    /// Holds `object`, write `generation` of `key`, unless a later write of it is held.
    pub(super) fn put(&mut self, key: &ObjectKey, generation: u64, object: Arc<K>, size: usize) {
        if self.is_off() || size > self.budget {
            self.forget(key);
            return;
        }
        let tick = self.next_tick();
        match self.entries.get_mut(key) {
            Some(entry) if entry.generation > generation => return,
            Some(entry) => {
                self.used = self.used - entry.size + size;
                *entry = HotEntry {
                    object,
                    generation,
                    size,
                    tick,
                };
            }
            None => {
                self.used += size;
                self.entries.insert(
                    key.clone(),
                    HotEntry {
                        object,
                        generation,
                        size,
                        tick,
                    },
                );
            }
        }
        self.recency.push_back((key.clone(), tick));
        self.evict_to_budget();
        self.compact_recency();
    }

    /// Lets go of the object of `key` (deleted, or written without a decoded object).
    pub(super) fn forget(&mut self, key: &ObjectKey) {
        if let Some(entry) = self.entries.remove(key) {
            self.used -= entry.size;
        }
    }

    #[cfg(any(test, feature = "testing"))]
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.recency.clear();
        self.used = 0;
    }

    pub(super) fn stats(&self) -> WorkingSetStats {
        WorkingSetStats {
            budget_bytes: self.budget,
            bytes: self.used,
            objects: self.entries.len(),
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn evict_to_budget(&mut self) {
        while self.used > self.budget {
            let Some((key, tick)) = self.recency.pop_front() else {
                break;
            };
            if self.entries.get(&key).is_some_and(|e| e.tick == tick)
                && let Some(entry) = self.entries.remove(&key)
            {
                self.used -= entry.size;
                self.evictions += 1;
            }
        }
    }

    /// Drops the stale elements of `recency` once they outnumber the live ones, so that it
    /// stays within a constant factor of the entries however often they are read.
    fn compact_recency(&mut self) {
        if self.recency.len() <= 2 * self.entries.len() + 64 {
            return;
        }
        let entries = &self.entries;
        self.recency
            .retain(|(key, tick)| entries.get(key).is_some_and(|e| e.tick == *tick));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> ObjectKey {
        ObjectKey::from(format!("ns/o{i}").as_str())
    }

    #[test]
    fn least_recently_used_go_first_and_the_budget_holds() {
        let mut hot = Hot::new(WorkingSet::budget(300));
        for i in 0..3 {
            hot.put(&key(i), 1, Arc::new(i), 100);
        }
        // Reading 0 makes 1 the least recently used.
        assert_eq!(hot.get(&key(0), 1).as_deref(), Some(&0));
        hot.put(&key(3), 1, Arc::new(3), 100);
        assert!(hot.get(&key(1), 1).is_none());
        for i in [0, 2, 3] {
            assert!(hot.get(&key(i), 1).is_some(), "{i} held");
        }
        let stats = hot.stats();
        assert_eq!((stats.bytes, stats.objects, stats.evictions), (300, 3, 1));
        assert_eq!((stats.hits, stats.misses), (4, 1));
    }

    #[test]
    fn an_entry_stands_for_one_write() {
        let mut hot = Hot::new(WorkingSet::budget(1000));
        hot.put(&key(0), 2, Arc::new("second"), 10);
        assert!(hot.get(&key(0), 1).is_none(), "another write misses");
        // A reader that decoded the first write late does not displace the second.
        hot.put(&key(0), 1, Arc::new("first"), 10);
        assert_eq!(hot.get(&key(0), 2).as_deref(), Some(&"second"));
        hot.forget(&key(0));
        assert!(hot.get(&key(0), 2).is_none());
        assert_eq!(hot.stats().bytes, 0);
    }

    #[test]
    fn recency_stays_bounded_under_repeated_reads() {
        let mut hot = Hot::new(WorkingSet::budget(1000));
        hot.put(&key(0), 1, Arc::new(0), 10);
        hot.put(&key(1), 1, Arc::new(1), 10);
        for _ in 0..10_000 {
            hot.get(&key(0), 1);
        }
        assert!(hot.recency.len() <= 2 * 2 + 65, "{}", hot.recency.len());
        assert!(hot.get(&key(1), 1).is_some());
    }

    #[test]
    fn off_holds_nothing() {
        let mut hot = Hot::new(WorkingSet::off());
        hot.put(&key(0), 1, Arc::new(0), 1);
        assert!(hot.get(&key(0), 1).is_none());
        assert_eq!(hot.stats(), WorkingSetStats::default());
    }
}
