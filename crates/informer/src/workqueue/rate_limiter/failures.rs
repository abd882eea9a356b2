//! Per-item failure counts, shared by the per-item limiters.

use std::hash::Hash;

use dashmap::DashMap;

/// How many times each item has failed since it was last forgotten.
///
/// Sharded (a `DashMap`): workers failing different items do not contend for one lock.
pub(super) struct Failures<T> {
    counts: DashMap<T, u32, foldhash::fast::RandomState>,
}

impl<T: Eq + Hash> Failures<T> {
    pub(super) fn new() -> Self {
        Self {
            counts: DashMap::default(),
        }
    }

    /// Counts one more failure of `item`; returns the count before it.
    pub(super) fn record(&self, item: &T) -> u32
    where
        T: Clone,
    {
        // Look up before inserting: cloning the item is only needed on its first failure.
        let mut count = match self.counts.get_mut(item) {
            Some(count) => count,
            None => self.counts.entry(item.clone()).or_insert(0),
        };
        let before = *count;
        *count = count.saturating_add(1);
        before
    }

    /// Forgets `item`'s failures.
    pub(super) fn forget(&self, item: &T) {
        self.counts.remove(item);
    }

    /// `item`'s failures so far.
    pub(super) fn count(&self, item: &T) -> u32 {
        self.counts.get(item).map_or(0, |count| *count)
    }

    /// How many items have failures.
    pub(super) fn tracked(&self) -> usize {
        self.counts.len()
    }

    #[cfg(test)]
    pub(super) fn set(&self, item: T, count: u32) {
        self.counts.insert(item, count);
    }
}
