//! The cost of applying a relist of 10,000 ConfigMaps to a synced store: atomically
//! (staged, then swapped in with one write, as the informer does) against applying each
//! object as it arrives (what the informer did before relists were atomic), for a relist
//! in which no object, a tenth of them or every one changed, in a store of shared objects
//! and in a compact one.
//!
//! Each iteration lists the other of two states, so every relist finds the changes.

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_main};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_informer::{
    ObjectKey,
    reflector::{ReflectorEvent, ReflectorStore},
    testing::StoreWriter,
};

const OBJECTS: usize = 10_000;

/// Two states of the same objects: `changed` of every 100 differ in resourceVersion and data.
fn states(changed_per_100: usize) -> [Vec<(ObjectKey, Arc<ConfigMap>)>; 2] {
    [0, 1].map(|state| {
        (0..OBJECTS)
            .map(|i| {
                let version = if i % 100 < changed_per_100 { state } else { 0 };
                let mut cm = ConfigMap::default();
                cm.metadata.namespace = Some("bench".into());
                cm.metadata.name = Some(format!("cm-{i:05}"));
                cm.metadata.resource_version = Some(format!("{}", i * 2 + version));
                cm.metadata.labels = Some([("app".to_owned(), format!("app-{}", i % 50))].into());
                cm.data = Some([("v".to_owned(), format!("{version}"))].into());
                (ObjectKey::from_object(&cm).unwrap(), Arc::new(cm))
            })
            .collect()
    })
}

/// How a relist is written.
#[derive(Clone, Copy)]
enum Apply {
    /// Staged and swapped in (the informer's way).
    Atomic,
    /// Each object written as it arrives, then the unlisted removed.
    PerObject,
}

fn relist(writer: &StoreWriter<ConfigMap>, objects: &[(ObjectKey, Arc<ConfigMap>)], apply: Apply) {
    match apply {
        Apply::Atomic => {
            writer.apply(ReflectorEvent::ListStart);
            for (key, obj) in objects {
                writer.apply(ReflectorEvent::Listed {
                    key: key.clone(),
                    object: obj.clone(),
                    raw: None,
                });
            }
            writer.apply(ReflectorEvent::ListEnd(String::new()));
        }
        Apply::PerObject => {
            for (key, obj) in objects {
                writer.apply(ReflectorEvent::Upsert {
                    key: key.clone(),
                    object: obj.clone(),
                    raw: None,
                });
            }
        }
    }
}

fn store(compact: bool) -> StoreWriter<ConfigMap> {
    let writer = if compact {
        StoreWriter::compact()
    } else {
        StoreWriter::new()
    };
    writer
        .add_indexer("app", kube_informer::store::label_index("app"))
        .unwrap();
    writer
}

fn relists(c: &mut Criterion) {
    let mut group = c.benchmark_group("relist");
    group.throughput(Throughput::Elements(OBJECTS as u64));
    group.sample_size(20);
    for changed in [0, 10, 100] {
        let states = states(changed);
        for compact in [false, true] {
            for (name, apply) in [("atomic", Apply::Atomic), ("per-object", Apply::PerObject)] {
                let writer = store(compact);
                // The first list, so every measured one is a relist.
                relist(&writer, &states[0], Apply::Atomic);
                let store_kind = if compact { "compact" } else { "shared" };
                let id = BenchmarkId::new(
                    format!("{name}/{store_kind}"),
                    format!("{changed}% changed"),
                );
                let mut next = 1;
                group.bench_function(id, |b| {
                    b.iter(|| {
                        relist(&writer, &states[next], apply);
                        next = 1 - next;
                    })
                });
            }
        }
    }
    group.finish();
}

/// The group `criterion_main!` runs; the macro cannot document the function it generates.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::relists);
}

criterion_main!(group::benches);
