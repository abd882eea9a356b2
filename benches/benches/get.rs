//! The cost of one `get` of the benchmark's Pod (`informer-bench`'s nginx Pod, applied
//! server-side, so with its `managedFields`), read back from a real API server, in each way
//! a store can keep it: the protobuf bytes the server sent (the default), compact JSON, or
//! the decoded object; and from the default's working set, as a reconcile reads the object
//! a watch event just delivered.
//!
//! This is where the default's `get` figure in BENCHMARKS.md comes from, one object at a
//! time and without the other 9,999: run it under `perf record` to see where a `get` goes.
//! The group `get-parts` splits a decode's cost: a deep copy of the decoded Pod (what
//! allocating and freeing its strings, maps and vectors costs, whatever the format), the
//! Pod decoded from JSON with and without its `managedFields`, and those alone; and the
//! field sets of its `managedFields` copied, and rebuilt through serde's visitor, the two
//! ways a decode could take them from a memo instead of parsing them.

use std::sync::Arc;

use criterion::{Criterion, criterion_main};
use futures::StreamExt;
use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry};
use kube_client::{
    Api,
    api::{Patch, PatchParams},
};
use kube_informer::{
    ObjectKey, WorkingSet,
    list_watch::{ApiListWatch, ListItem, ListOptions, ListWatch, RawObject},
    reflector::{ReflectorEvent, ReflectorStore},
    testing::StoreWriter,
};
use kube_testenv::TestEnv;

/// The benchmark's first Pod as the server lists it, with the bytes it arrived in.
async fn listed_pod() -> anyhow::Result<(Pod, RawObject)> {
    let env = TestEnv::builder().controller_manager(false).start().await?;
    let client = env.client().await?;
    let namespace = env.create_namespace("get").await?;
    let pods = Api::<Pod>::namespaced(client, &namespace);
    let params = PatchParams::apply("informer-bench").force();
    pods.patch(
        &benches::pod_name(0),
        &params,
        &Patch::Apply(benches::nginx_pod(0)),
    )
    .await?;
    let mut items = ApiListWatch::new(pods)
        .list_stream(&ListOptions::default())
        .await?;
    while let Some(item) = items.next().await {
        if let ListItem::Decoded { object, raw } = item? {
            return Ok((object, raw));
        }
    }
    anyhow::bail!("the list of the benchmark's Pod held no decoded object")
}

fn get(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let (pod, raw) = runtime
        .block_on(listed_pod())
        .expect("the benchmark's Pod, listed from a local control plane");
    let key = ObjectKey::from_object(&pod).expect("a named Pod");
    // The compact stores but the first read with no working set: each get decodes, as a
    // get of an object neither just delivered nor just read does.
    let stores = [
        (
            "protobuf-bytes-just-delivered",
            StoreWriter::<Pod>::compact(),
            Some(raw.clone()),
        ),
        (
            "protobuf-bytes",
            StoreWriter::<Pod>::compact_with(WorkingSet::off()),
            Some(raw),
        ),
        (
            "compact-json",
            StoreWriter::<Pod>::compact_with(WorkingSet::off()),
            None,
        ),
        ("decoded", StoreWriter::<Pod>::new(), None),
    ];
    let mut group = c.benchmark_group("get");
    for (name, writer, raw) in stores {
        writer.apply(ReflectorEvent::Upsert {
            key: key.clone(),
            object: Arc::new(pod.clone()),
            raw,
        });
        let store = writer.store();
        assert_eq!(store.get_by_key(&key).as_deref(), Some(&pod), "{name}");
        group.bench_function(name, |b| b.iter(|| store.get_by_key(&key)));
    }
    group.finish();
    parts(c, &pod);
}

/// What a decode of `pod` is made of.
fn parts(c: &mut Criterion, pod: &Pod) {
    let json = serde_json::to_vec(pod).expect("a Pod encodes to JSON");
    let mut without = pod.clone();
    without.metadata.managed_fields = None;
    let json_without = serde_json::to_vec(&without).expect("a Pod encodes to JSON");
    let managed_fields =
        serde_json::to_vec(&pod.metadata.managed_fields).expect("managedFields encode to JSON");
    assert!(
        pod.metadata.managed_fields.is_some(),
        "the benchmark's Pod carries managedFields"
    );
    let mut group = c.benchmark_group("get-parts");
    group.bench_function("deep-copy", |b| b.iter(|| pod.clone()));
    group.bench_function("json-decode", |b| {
        b.iter(|| serde_json::from_slice::<Pod>(&json).expect("the Pod decodes"))
    });
    group.bench_function("json-decode-without-managed-fields", |b| {
        b.iter(|| serde_json::from_slice::<Pod>(&json_without).expect("the Pod decodes"))
    });
    group.bench_function("managed-fields-json-decode", |b| {
        b.iter(|| {
            serde_json::from_slice::<Option<Vec<ManagedFieldsEntry>>>(&managed_fields)
                .expect("managedFields decode")
        })
    });
    let fields: Vec<serde_json::Value> = pod
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.fields_v1.as_ref().map(|f| f.0.clone()))
        .collect();
    group.bench_function("fields-v1-rebuild", |b| {
        b.iter(|| {
            fields
                .iter()
                .map(|value| serde::Deserialize::deserialize(value).expect("a Value"))
                .collect::<Vec<serde_json::Value>>()
        })
    });
    group.bench_function("fields-v1-deep-copy", |b| b.iter(|| fields.clone()));
    group.bench_function("managed-fields-deep-copy", |b| {
        b.iter(|| pod.metadata.managed_fields.clone())
    });
    group.finish();
}

/// The group `criterion_main!` runs; the macro cannot document the function it generates.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::get);
}

criterion_main!(group::benches);
