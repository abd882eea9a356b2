//! Throughput of the workqueue: add/get/done with 1 and 4 workers, and `add_after`.
//!
//! Each iteration pushes 10,000 distinct items through a fresh queue while the workers
//! drain it, so the figures are items per second including the hand-off between tasks.
//! The cases live in `benches::workqueue_cases`, which `informer-bench` also runs
//! against client-go's workqueue.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_main};

use benches::workqueue_cases::{
    ITEMS, WORKERS, add_after_fire_1ms, add_after_schedule, add_get_done,
    add_get_done_mixed_priority, names, numbers, runtime,
};

fn queue(c: &mut Criterion) {
    let rt = runtime();
    let numbers = numbers();
    let names = names();

    let mut group = c.benchmark_group("workqueue/add_get_done");
    group.throughput(Throughput::Elements(ITEMS as u64));
    for workers in WORKERS {
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

fn priority(c: &mut Criterion) {
    let rt = runtime();
    let names = names();
    let mut group = c.benchmark_group("workqueue/priority");
    group.throughput(Throughput::Elements(ITEMS as u64));
    for workers in WORKERS {
        group.bench_with_input(
            BenchmarkId::new("plain", workers),
            &workers,
            |b, &workers| {
                b.to_async(&rt).iter(|| add_get_done(&names, workers));
            },
        );
        group.bench_with_input(
            BenchmarkId::new("half_low", workers),
            &workers,
            |b, &workers| {
                b.to_async(&rt)
                    .iter(|| add_get_done_mixed_priority(&names, workers));
            },
        );
    }
    group.finish();
}

fn delaying(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("workqueue/add_after");
    group.throughput(Throughput::Elements(ITEMS as u64));
    group.bench_function("schedule", |b| {
        b.to_async(&rt).iter(add_after_schedule);
    });
    group.bench_function("fire_1ms", |b| {
        b.to_async(&rt).iter(add_after_fire_1ms);
    });
    group.finish();
}

/// The group `criterion_main!` runs; the macro cannot document the function it generates.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::queue, super::priority, super::delaying);
}

criterion_main!(group::benches);
