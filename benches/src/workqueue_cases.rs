//! The workqueue benchmark's cases, shared by the criterion bench (`benches/workqueue.rs`)
//! and the `subject-workqueue` process that `informer-bench` runs against client-go's
//! workqueue (`go-subject/workqueue`, which mirrors these functions).
//!
//! Each iteration pushes [`ITEMS`] distinct items through a fresh queue while the workers
//! drain it, so the figures are items per second including the hand-off between tasks.

use std::hash::Hash;
use std::hint::black_box;
use std::time::{Duration, Instant};

use kube_informer::ObjectKey;
use kube_informer::workqueue::{DelayingQueue, Priority, Queue};
use serde::{Deserialize, Serialize};
use tokio::runtime::Runtime;

/// Distinct items per iteration of every case.
pub const ITEMS: usize = 10_000;

/// The worker counts of the add/get/done cases.
pub const WORKERS: [usize; 2] = [1, 4];

/// The runtime the cases run on: tokio's multi-threaded one, a worker thread per CPU.
///
/// # Panics
///
/// If the runtime cannot be built.
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The integer items: `0..ITEMS`.
pub fn numbers() -> Vec<u64> {
    (0..ITEMS as u64).collect()
}

/// Object keys as a controller queues them: [`ObjectKey`]s `default/object-00000` and on.
///
/// An `ObjectKey` is one shared, immutable string (`Arc<str>`), so queueing a clone copies
/// a pointer, as passing a Go string to client-go's queue copies its header: like for like
/// with the Go subject's `string` keys.
pub fn names() -> Vec<ObjectKey> {
    (0..ITEMS)
        .map(|i| ObjectKey::from(format!("default/object-{i:05}")))
        .collect()
}

/// Adds every key while `workers` tasks get and mark them done; returns once all are done.
///
/// # Panics
///
/// If a worker task panics.
pub async fn add_get_done<T>(keys: &[T], workers: usize)
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    add_get_done_at(keys, workers, |_| Priority::Normal).await;
}

/// [`add_get_done`] with every other key added at [`Priority::Low`]: the cost of the
/// priority queue's second lane beside the plain queue.
///
/// # Panics
///
/// If a worker task panics.
pub async fn add_get_done_mixed_priority<T>(keys: &[T], workers: usize)
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    add_get_done_at(keys, workers, |i| {
        if i % 2 == 0 {
            Priority::Low
        } else {
            Priority::Normal
        }
    })
    .await;
}

/// Adds the `i`th key at `priority(i)` while `workers` tasks drain the queue.
async fn add_get_done_at<T>(keys: &[T], workers: usize, priority: impl Fn(usize) -> Priority)
where
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    let queue = Queue::new();
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let queue = queue.clone();
            tokio::spawn(async move {
                while let Some(key) = queue.get().await {
                    black_box(&key);
                    queue.done(&key);
                }
            })
        })
        .collect();
    for (i, key) in keys.iter().enumerate() {
        queue.add_with_priority(key.clone(), priority(i));
    }
    queue.shutdown();
    for handle in handles {
        handle.await.expect("worker");
    }
}

/// Scheduling only: [`ITEMS`] `add_after` calls with delays far off (60 s + `i % 1000` s),
/// then shutdown, so this is the cost of the timer heap.
pub async fn add_after_schedule() {
    let queue = DelayingQueue::new();
    for i in 0..ITEMS as u64 {
        queue.add_after(i, Duration::from_secs(60 + i % 1000));
    }
    queue.shutdown();
}

/// [`ITEMS`] items scheduled over the next millisecond (1 + `i % 1000` µs) and drained by
/// one worker: heap, timer task and queue together (at least 1 ms of waiting).
///
/// # Panics
///
/// If the worker panics, which it does if the queue shuts down before every item came.
pub async fn add_after_fire_1ms() {
    let queue = DelayingQueue::new();
    let worker = tokio::spawn({
        let queue = queue.clone();
        async move {
            for _ in 0..ITEMS {
                let key = queue.get().await.expect("an item");
                queue.done(&key);
            }
        }
    });
    for i in 0..ITEMS as u64 {
        queue.add_after(i, Duration::from_micros(1 + i % 1000));
    }
    worker.await.expect("worker");
    queue.shutdown();
}

/// One case's figure, as a subject reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseResult {
    /// The case, e.g. `add_get_done/u64/4` or `add_after/schedule`.
    pub name: String,
    /// Timed iterations.
    pub iterations: usize,
    /// Their total time, ms.
    pub elapsed_ms: f64,
    /// `iterations * ITEMS / elapsed`.
    pub items_per_sec: f64,
}

/// The one line a workqueue subject prints (`subject-workqueue` here, the Go subject in
/// `go-subject/workqueue`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkqueueLine {
    /// Which subject: `kube-informer` or `client-go`.
    pub subject: String,
    /// The minimum time per case it was given, ms.
    pub min_ms: u64,
    /// Every case, in the order run.
    pub cases: Vec<CaseResult>,
}

/// Runs one case: one untimed iteration, then iterations until `min_time` has passed and
/// at least `min_iterations` ran; the same scheme as the Go subject.
pub fn measure<F, Fut>(
    rt: &Runtime,
    name: &str,
    min_time: Duration,
    min_iterations: usize,
    mut iteration: F,
) -> CaseResult
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    rt.block_on(async {
        iteration().await;
        let mut n = 0;
        let start = Instant::now();
        while n < min_iterations || start.elapsed() < min_time {
            iteration().await;
            n += 1;
        }
        let elapsed = start.elapsed();
        CaseResult {
            name: name.to_owned(),
            iterations: n,
            elapsed_ms: elapsed.as_secs_f64() * 1000.0,
            items_per_sec: (n * ITEMS) as f64 / elapsed.as_secs_f64(),
        }
    })
}

/// Every case through kube-informer's workqueue, in the Go subject's order.
pub fn run_all(min_time: Duration, min_iterations: usize) -> Vec<CaseResult> {
    let rt = runtime();
    let numbers = numbers();
    let names = names();
    let mut cases = Vec::new();
    for workers in WORKERS {
        cases.push(measure(
            &rt,
            &format!("add_get_done/u64/{workers}"),
            min_time,
            min_iterations,
            || add_get_done(&numbers, workers),
        ));
        cases.push(measure(
            &rt,
            &format!("add_get_done/string/{workers}"),
            min_time,
            min_iterations,
            || add_get_done(&names, workers),
        ));
    }
    cases.push(measure(
        &rt,
        "add_after/schedule",
        min_time,
        min_iterations,
        add_after_schedule,
    ));
    cases.push(measure(
        &rt,
        "add_after/fire_1ms",
        min_time,
        min_iterations,
        add_after_fire_1ms,
    ));
    cases
}
