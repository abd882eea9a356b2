//! The decoded working set of a compact store: the objects just delivered to handlers and
//! those read again by key, kept as the shared `Arc<K>`s they were decoded into, within a budget.
//! The full documentation is on [`WorkingSet`].

use std::{
    collections::VecDeque,
    sync::{
        Arc, Weak,
        atomic::{AtomicUsize, Ordering},
    },
};

use std::collections::HashMap;

use super::KeyHasher;
use crate::{key::ObjectKey, list_watch::RawFormat};

/// How much of a compact store stays decoded, and for how long.
///
/// A compact store (an informer's default) keeps each object as bytes and decodes it on a
/// read. Controllers read the same few objects again and again: the object whose event
/// queued the reconcile, then its children. The working set keeps the objects a watch event
/// just delivered (decoded on arrival already) and those read by key a second time while
/// the first read is remembered, as the `Arc<K>` every later reader shares, so that such a
/// read is a pointer copy. The rest stay bytes. Lists, index reads and reads made once use
/// what it holds but do not add to it: kept, the many objects they decode and seldom read
/// again soon would push out the rest and grow the heap.
///
/// An object a read by key decoded is also shared, without being kept, for as long as its
/// reader holds it: a reconcile handed the object that reads it back by key (the client-go
/// tutorials' `sync(key)` form) gets the same `Arc<K>` rather than a second decode, and
/// once the reconcile is done the object is freed, not held for a later read that may never
/// come.
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
///
/// Many stores in one process (a [`Fleet`](crate::fleet::Fleet)'s clusters, say) can share
/// one budget instead, each holding its part of it: see [`SharedBudget`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkingSet {
    budget: Budget,
}

#[derive(Clone, Debug)]
enum Budget {
    Fixed(usize),
    Shared(SharedBudget),
}

impl PartialEq for Budget {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Fixed(a), Self::Fixed(b)) => a == b,
            (Self::Shared(a), Self::Shared(b)) => Arc::ptr_eq(&a.0, &b.0),
            _ => false,
        }
    }
}

impl Eq for Budget {}

/// A budget of decoded objects that the working sets of several compact stores share:
/// each store holds at most the total divided by the stores sharing it at the time.
///
/// Every working set has a budget of its own by default ([`WorkingSet::default`], 1 MiB),
/// which a process with a handful of informers never notices, but a process with one
/// informer per cluster of a fleet pays per cluster: a hundred clusters whose objects
/// were all reconciled once hold a hundred budgets of them. A shared budget bounds the
/// process instead. A store takes its part when it is created and gives it back when it
/// is dropped; a store holding more than its part (because more stores joined since) lets
/// the excess go at its next admission.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{SharedInformer, WorkingSet, store::SharedBudget, testing::FakeListWatch};
///
/// let budget = SharedBudget::new(4 << 20);
/// let informers: Vec<_> = (0..4)
///     .map(|_| {
///         SharedInformer::builder(FakeListWatch::<ConfigMap>::new("configmaps"))
///             .working_set(WorkingSet::shared(&budget))
///             .build()
///     })
///     .collect();
/// assert_eq!(budget.sharers(), 4);
/// assert_eq!(informers[0].store().working_set().budget_bytes, 1 << 20);
/// ```
#[derive(Clone, Debug)]
pub struct SharedBudget(Arc<SharedState>);

#[derive(Debug)]
struct SharedState {
    total: usize,
    sharers: AtomicUsize,
}

impl SharedBudget {
    /// A budget of about `total_bytes` of decoded objects, shared by the stores that use it.
    pub fn new(total_bytes: usize) -> Self {
        Self(Arc::new(SharedState {
            total: total_bytes,
            sharers: AtomicUsize::new(0),
        }))
    }

    /// The budget of all the stores together, in bytes.
    pub fn total_bytes(&self) -> usize {
        self.0.total
    }

    /// The stores sharing it now.
    pub fn sharers(&self) -> usize {
        self.0.sharers.load(Ordering::Relaxed)
    }

    /// Each store's part now.
    fn share(&self) -> usize {
        self.0.total / self.sharers().max(1)
    }

    fn join(&self) -> Sharing {
        self.0.sharers.fetch_add(1, Ordering::Relaxed);
        Sharing(self.clone())
    }
}

/// A store's part of a [`SharedBudget`], given back when dropped.
#[derive(Debug)]
struct Sharing(SharedBudget);

impl Drop for Sharing {
    fn drop(&mut self) {
        self.0.0.sharers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl WorkingSet {
    /// The default budget: 1 MiB, about 70 decoded Pods of the kind the benchmark caches
    /// (with `managedFields`): the objects of the last events, for the reconciles they
    /// queue. In the reconcile-shaped benchmark at 10,000 Pods (BENCHMARKS.md) it served
    /// about 1,500 reads in 1,943 reconciles without decoding, at the throughput, cold-read
    /// cost and RSS of no working set; 8 MiB served more reads but left the heap 14 MiB
    /// larger and cold reads slower (kept objects scatter the heap each decode then
    /// allocates in).
    pub const DEFAULT_BUDGET_BYTES: usize = 1 << 20;

    /// A working set of at most about `bytes` of decoded objects.
    pub const fn budget(bytes: usize) -> Self {
        Self {
            budget: Budget::Fixed(bytes),
        }
    }

    /// A working set whose budget is its part of `budget`, shared with the other stores
    /// given the same one (see [`SharedBudget`]).
    pub fn shared(budget: &SharedBudget) -> Self {
        Self {
            budget: Budget::Shared(budget.clone()),
        }
    }

    /// No working set: every read of a compact store decodes.
    pub const fn off() -> Self {
        Self::budget(0)
    }

    /// The budget, in bytes: for a shared one, a store's part of it now.
    pub fn budget_bytes(&self) -> usize {
        match &self.budget {
            Budget::Fixed(bytes) => *bytes,
            Budget::Shared(shared) => shared.share(),
        }
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
    budget: HotBudget,
    used: usize,
    entries: HashMap<ObjectKey, HotEntry<K>, KeyHasher>,
    /// Keys from least to most recently used, with the tick of that use: an element whose
    /// tick is not its entry's current one is stale and skipped.
    recency: VecDeque<(ObjectKey, u64)>,
    tick: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    /// Keys read once lately, with the write each read decoded, and their order: a second
    /// read of the same write while it is remembered admits the object (see
    /// [`admit_read`](Self::admit_read)).
    read_once: HashMap<ObjectKey, u64, KeyHasher>,
    read_once_order: VecDeque<ObjectKey>,
    /// Objects reads by key decoded lately and did not keep, oldest first, as weak
    /// references: while a reader still holds one, a read of the same write shares it.
    held: VecDeque<Held<K>>,
}

/// An object a read decoded, shared while someone holds it.
struct Held<K> {
    key: ObjectKey,
    generation: u64,
    object: Weak<K>,
}

/// A working set's budget: its own, or its part of a shared one, held while it lives.
enum HotBudget {
    Fixed(usize),
    Shared(Sharing),
}

/// How many keys read once the working set remembers.
const READ_ONCE_REMEMBERED: usize = 4096;

/// How many objects held by their readers the working set can share. Objects are held
/// about as long as a reconcile, so this many covers a controller's workers; it stays
/// small because a weak reference keeps its object's allocation (though not what the
/// object owns) until it is dropped, and the table is scanned on each read that misses.
const HELD_REMEMBERED: usize = 32;

struct HotEntry<K> {
    object: Arc<K>,
    /// The write of the key this object is (see `Encoded::generation`).
    generation: u64,
    size: usize,
    tick: u64,
}

impl<K> Hot<K> {
    pub(super) fn new(config: WorkingSet) -> Self {
        let budget = match config.budget {
            Budget::Fixed(bytes) => HotBudget::Fixed(bytes),
            Budget::Shared(shared) => HotBudget::Shared(shared.join()),
        };
        Self {
            budget,
            used: 0,
            entries: HashMap::default(),
            recency: VecDeque::new(),
            tick: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
            read_once: HashMap::default(),
            read_once_order: VecDeque::new(),
            held: VecDeque::new(),
        }
    }

    /// Whether an object a read of one key just decoded (write `generation` of `key`)
    /// should be kept: on the second read of that write while the first is remembered.
    /// A read made once and never again, as a walk over random keys makes, keeps nothing:
    /// kept objects grow the heap, and each decode after that touches fresh memory
    /// (measured: a cold `get` of the benchmark's Pod went from 7.9 to 13.7 µs at p50 when
    /// every read was kept).
    pub(super) fn admit_read(&mut self, key: &ObjectKey, generation: u64) -> bool {
        if self.is_off() {
            return false;
        }
        match self.read_once.get(key) {
            Some(seen) if *seen == generation => {
                self.read_once.remove(key);
                return true;
            }
            Some(_) => {
                self.read_once.insert(key.clone(), generation);
            }
            None => {
                if self.read_once_order.len() >= READ_ONCE_REMEMBERED
                    && let Some(oldest) = self.read_once_order.pop_front()
                {
                    self.read_once.remove(&oldest);
                }
                self.read_once.insert(key.clone(), generation);
                self.read_once_order.push_back(key.clone());
            }
        }
        false
    }

    pub(super) fn is_off(&self) -> bool {
        self.budget() == 0
    }

    fn budget(&self) -> usize {
        match &self.budget {
            HotBudget::Fixed(bytes) => *bytes,
            HotBudget::Shared(sharing) => sharing.0.share(),
        }
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
            _ => match self.shared_while_held(key, generation) {
                Some(object) => {
                    self.hits += 1;
                    Some(object)
                }
                None => {
                    self.misses += 1;
                    None
                }
            },
        }
    }

    /// The object of write `generation` of `key` if a reader still holds it.
    fn shared_while_held(&mut self, key: &ObjectKey, generation: u64) -> Option<Arc<K>> {
        let at = self.held.iter().position(|h| h.key == *key)?;
        let held = &self.held[at];
        match held.object.upgrade() {
            Some(object) if held.generation == generation => Some(object),
            Some(_) => None,
            None => {
                self.held.remove(at);
                None
            }
        }
    }

    /// Shares `object`, write `generation` of `key` that a read decoded and did not keep,
    /// while its reader holds it. Objects no longer held are let go first, so that their
    /// allocations are not kept by the weak references.
    pub(super) fn hold(&mut self, key: &ObjectKey, generation: u64, object: &Arc<K>) {
        if self.is_off() {
            return;
        }
        self.held
            .retain(|h| h.object.strong_count() > 0 && h.key != *key);
        if self.held.len() >= HELD_REMEMBERED {
            self.held.pop_front();
        }
        self.held.push_back(Held {
            key: key.clone(),
            generation,
            object: Arc::downgrade(object),
        });
    }

    /// Holds `object`, write `generation` of `key`, unless a later write of it is held.
    pub(super) fn put(&mut self, key: &ObjectKey, generation: u64, object: Arc<K>, size: usize) {
        if self.is_off() || size > self.budget() {
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
        self.held.retain(|h| h.key != *key);
    }

    #[cfg(any(test, feature = "testing"))]
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.recency.clear();
        self.read_once.clear();
        self.read_once_order.clear();
        self.held.clear();
        self.used = 0;
    }

    pub(super) fn stats(&self) -> WorkingSetStats {
        WorkingSetStats {
            budget_bytes: self.budget(),
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
        let budget = self.budget();
        while self.used > budget {
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
    fn stores_sharing_a_budget_hold_their_part_of_it() {
        let budget = SharedBudget::new(600);
        let mut first = Hot::new(WorkingSet::shared(&budget));
        for i in 0..6 {
            first.put(&key(i), 1, Arc::new(i), 100);
        }
        assert_eq!(
            first.stats().objects,
            6,
            "alone, a store has the whole budget"
        );
        let mut second = Hot::new(WorkingSet::shared(&budget));
        assert_eq!(budget.sharers(), 2);
        assert_eq!(second.stats().budget_bytes, 300);
        for i in 0..6 {
            second.put(&key(i), 1, Arc::new(i), 100);
        }
        assert_eq!(second.stats().objects, 3, "the second holds its part");
        first.put(&key(6), 1, Arc::new(6), 100);
        assert_eq!(
            first.stats().bytes,
            300,
            "the first lets go of its excess at its next admission"
        );
        drop(second);
        assert_eq!(budget.sharers(), 1);
        assert_eq!(
            first.stats().budget_bytes,
            600,
            "a dropped store gives its part back"
        );
        assert_eq!(
            WorkingSet::shared(&budget),
            WorkingSet::shared(&budget.clone())
        );
        assert_ne!(
            WorkingSet::shared(&budget),
            WorkingSet::shared(&SharedBudget::new(600))
        );
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
    fn a_read_is_kept_the_second_time_it_reads_the_same_write() {
        let mut hot = Hot::<u8>::new(WorkingSet::budget(1000));
        assert!(!hot.admit_read(&key(0), 1), "a first read keeps nothing");
        assert!(!hot.admit_read(&key(0), 2), "another write starts again");
        assert!(hot.admit_read(&key(0), 2));
        assert!(!hot.admit_read(&key(0), 2), "admitted once, then forgotten");
        // One more than it remembers (the admitted key's place counts until it is reached).
        for i in 1..=READ_ONCE_REMEMBERED + 1 {
            hot.admit_read(&key(i), 1);
        }
        assert!(hot.read_once.len() <= READ_ONCE_REMEMBERED);
        assert!(hot.read_once_order.len() <= READ_ONCE_REMEMBERED);
        assert!(!hot.admit_read(&key(1), 1), "the oldest was forgotten");
        assert!(hot.admit_read(&key(READ_ONCE_REMEMBERED), 1));
    }

    #[test]
    fn an_object_is_shared_while_its_reader_holds_it_and_freed_after() {
        let mut hot = Hot::new(WorkingSet::budget(1000));
        let object = Arc::new(String::from("decoded"));
        hot.hold(&key(0), 1, &object);
        let shared = hot.get(&key(0), 1).expect("shared while held");
        assert!(Arc::ptr_eq(&shared, &object));
        assert!(hot.get(&key(0), 2).is_none(), "another write misses");
        assert_eq!((hot.stats().hits, hot.stats().misses), (1, 1));
        assert_eq!(hot.stats().objects, 0, "shared, not kept");
        drop((object, shared));
        assert!(hot.get(&key(0), 1).is_none(), "freed once nobody holds it");
        assert!(hot.held.is_empty(), "a dead reference is let go when found");

        let mut objects = Vec::new();
        for i in 0..HELD_REMEMBERED + 5 {
            let object = Arc::new(format!("o{i}"));
            hot.hold(&key(i), 1, &object);
            objects.push(object);
        }
        assert_eq!(hot.held.len(), HELD_REMEMBERED, "the table stays bounded");
        assert!(hot.get(&key(0), 1).is_none(), "the oldest went first");
        objects.drain(..objects.len() - 3);
        let object = Arc::new(String::from("late"));
        hot.hold(&key(100), 1, &object);
        assert_eq!(
            hot.held.len(),
            4,
            "references to dropped objects are let go"
        );
        assert!(hot.get(&key(HELD_REMEMBERED + 4), 1).is_some());
        hot.forget(&key(100));
        assert!(
            hot.get(&key(100), 1).is_none(),
            "a delete or a write forgets it"
        );
    }

    #[test]
    fn off_holds_nothing() {
        let mut hot = Hot::new(WorkingSet::off());
        hot.put(&key(0), 1, Arc::new(0), 1);
        let held = Arc::new(1);
        hot.hold(&key(1), 1, &held);
        assert!(hot.get(&key(0), 1).is_none());
        assert!(hot.get(&key(1), 1).is_none(), "every read decodes");
        assert_eq!(hot.stats(), WorkingSetStats::default());
    }
}
