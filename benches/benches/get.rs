//! The cost of one `get` of the benchmark's Pod (`informer-bench`'s nginx Pod, applied
//! server-side, so with its `managedFields`), read back from a real API server, in each way
//! a store can keep it: the protobuf bytes the server sent (the default), compact JSON, or
//! the decoded object.
//!
//! This is where the default's `get` figure in BENCHMARKS.md comes from, one object at a
//! time and without the other 9,999: run it under `perf record` to see where a `get` goes.

use std::sync::Arc;

use criterion::{Criterion, criterion_main};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube_client::{
    Api,
    api::{Patch, PatchParams},
};
use kube_informer::{
    ApiListWatch, ListItem, ListOptions, ListWatch, ObjectKey, RawObject, ReflectorStore,
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
    let stores = [
        ("protobuf-bytes", StoreWriter::<Pod>::compact(), Some(raw)),
        ("compact-json", StoreWriter::<Pod>::compact(), None),
        ("decoded", StoreWriter::<Pod>::new(), None),
    ];
    let mut group = c.benchmark_group("get");
    for (name, writer, raw) in stores {
        ReflectorStore::upsert(&writer, key.clone(), Arc::new(pod.clone()), raw);
        let store = writer.store();
        assert_eq!(store.get_by_key(&key).as_deref(), Some(&pod), "{name}");
        group.bench_function(name, |b| b.iter(|| store.get_by_key(&key)));
    }
    group.finish();
}

/// The group `criterion_main!` runs; the macro cannot document the function it generates.
#[allow(missing_docs)]
mod group {
    criterion::criterion_group!(benches, super::get);
}

criterion_main!(group::benches);
