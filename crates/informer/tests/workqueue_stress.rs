//! Many producers and workers on one queue, on a multi-threaded runtime: the queue's
//! guarantees must hold under real contention, not only in step-by-step unit tests.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, RwLock};

use kube_informer::workqueue::Queue;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEYS: usize = 64;
const PRODUCERS: u64 = 4;
const ADDS_PER_PRODUCER: usize = 50_000;
const WORKERS: u64 = 8;

/// What the workers observed, per key.
struct Ledger {
    /// Bumped before every add of the key, so it counts the adds that must be covered.
    adds: Vec<AtomicU64>,
    /// The value of `adds` the latest worker saw right after `get` returned the key.
    seen_at_get: Vec<AtomicU64>,
    processed: Vec<AtomicU64>,
    in_flight: Vec<AtomicBool>,
    overlaps: AtomicU64,
    /// Read-locked around every add; write-locked once to stop workers from re-adding, so
    /// that after it no add is in progress.
    readds_allowed: RwLock<bool>,
}

impl Ledger {
    fn new() -> Self {
        let counters = || (0..KEYS).map(|_| AtomicU64::new(0)).collect();
        Self {
            adds: counters(),
            seen_at_get: counters(),
            processed: counters(),
            in_flight: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
            overlaps: AtomicU64::new(0),
            readds_allowed: RwLock::new(true),
        }
    }

    fn add(&self, queue: &Queue<usize>, key: usize) {
        self.adds[key].fetch_add(1, SeqCst);
        queue.add(key);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_producers_and_workers_never_overlap_or_lose_an_add() {
    let queue: Queue<usize> = Queue::new();
    let ledger = Arc::new(Ledger::new());

    let workers: Vec<_> = (0..WORKERS)
        .map(|seed| {
            let (queue, ledger) = (queue.clone(), ledger.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(1000 + seed);
                while let Some(key) = queue.get().await {
                    if ledger.in_flight[key].swap(true, SeqCst) {
                        ledger.overlaps.fetch_add(1, SeqCst);
                    }
                    ledger.seen_at_get[key].store(ledger.adds[key].load(SeqCst), SeqCst);
                    ledger.processed[key].fetch_add(1, SeqCst);
                    if rng.random_bool(0.5) {
                        // Give other workers a chance to race for this key.
                        tokio::task::yield_now().await;
                    }
                    if rng.random_bool(0.25) {
                        let allowed = ledger.readds_allowed.read().unwrap();
                        if *allowed {
                            // Often the key in hand: the "changed while processing" case.
                            let readd = if rng.random_bool(0.5) {
                                key
                            } else {
                                rng.random_range(0..KEYS)
                            };
                            ledger.add(&queue, readd);
                        }
                    }
                    ledger.in_flight[key].store(false, SeqCst);
                    queue.done(&key);
                }
            })
        })
        .collect();

    let producers: Vec<_> = (0..PRODUCERS)
        .map(|seed| {
            let (queue, ledger) = (queue.clone(), ledger.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed);
                for i in 0..ADDS_PER_PRODUCER {
                    let key = rng.random_range(0..KEYS);
                    let adding = ledger.readds_allowed.read().unwrap();
                    ledger.add(&queue, key);
                    drop(adding);
                    if i % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();

    for producer in producers {
        producer.await.unwrap();
    }
    *ledger.readds_allowed.write().unwrap() = false;
    // From here on nothing adds: workers drain what is queued (including keys re-queued at
    // `done`) and exit on `None`.
    queue.shutdown();
    for worker in workers {
        worker.await.unwrap();
    }

    assert_eq!(
        ledger.overlaps.load(SeqCst),
        0,
        "a key was processed by two workers at once"
    );
    assert!(queue.is_empty());
    let mut total_adds = 0;
    let mut total_processed = 0;
    for key in 0..KEYS {
        let adds = ledger.adds[key].load(SeqCst);
        let processed = ledger.processed[key].load(SeqCst);
        total_adds += adds;
        total_processed += processed;
        if adds > 0 {
            assert!(
                processed > 0,
                "key {key} added {adds} times, never processed"
            );
        }
        // Every add is either before the last `get` of the key, or it queued the key again.
        assert_eq!(
            ledger.seen_at_get[key].load(SeqCst),
            adds,
            "key {key}: an add after its last processing was lost"
        );
    }
    assert!(total_adds >= PRODUCERS * ADDS_PER_PRODUCER as u64);
    // Duplicates collapse, so there is less processing than adds, but never none.
    assert!(total_processed > 0 && total_processed <= total_adds);
}
