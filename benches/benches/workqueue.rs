//! Throughput of the workqueue: add/get/done with 1 and 4 workers, and `add_after`.
//!
//! Each iteration pushes 10,000 distinct items through a fresh queue while the workers
//! drain it, so the figures are items per second including the hand-off between tasks.

use std::hash::Hash;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_main};
use kube_informer::workqueue::{DelayingQueue, Queue};
use tokio::runtime::Runtime;

const ITEMS: usize = 10_000;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Adds every key while `workers` tasks get and mark them done; returns once all are done.
async fn add_get_done<T>(keys: &[T], workers: usize)
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
    for key in keys {
        queue.add(key.clone());
    }
    queue.shutdown();
    for handle in handles {
        handle.await.expect("worker");
    }
}

fn queue(c: &mut Criterion) {
    let rt = runtime();
    let numbers: Vec<u64> = (0..ITEMS as u64).collect();
    // Object keys as a controller builds them.
    let names: Vec<String> = (0..ITEMS)
        .map(|i| format!("default/object-{i:05}"))
        .collect();

    let mut group = c.benchmark_group("workqueue/add_get_done");
    group.throughput(Throughput::Elements(ITEMS as u64));
    for workers in [1, 4] {
        group.bench_with_input(BenchmarkId::new("u64", workers), &workers, |b, &workers| {
            b.to_async(&rt).iter(|| add_get_done(&numbers, workers));
        });
        group.bench_with_input(
            BenchmarkId::new("string", workers),
            &workers,
            |b, &workers| {
                b.to_async(&rt).iter(|| add_get_done(&names, workers));
            },
        );
    }
    group.finish();
}

fn delaying(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("workqueue/add_after");
    group.throughput(Throughput::Elements(ITEMS as u64));

    // Scheduling only: the delays are far off, so this is the cost of the timer heap.
    group.bench_function("schedule", |b| {
        b.to_async(&rt).iter(|| async {
            let queue = DelayingQueue::new();
            for i in 0..ITEMS as u64 {
                queue.add_after(i, Duration::from_secs(60 + i % 1000));
            }
            queue.shutdown();
        });
    });

    // Scheduled over the next millisecond and drained by one worker: heap, timer task and
    // queue together (at least 1 ms of waiting per iteration).
    group.bench_function("fire_1ms", |b| {
        b.to_async(&rt).iter(|| async {
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
        });
    });
    group.finish();
}

/// The group `criterion_main!` runs; the macro cannot document the function it generates.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::queue, super::delaying);
}

criterion_main!(group::benches);
