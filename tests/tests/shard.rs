//! Sharded informers on a real API server: with the `ShardedListAndWatch` gate on, the
//! server selects each shard's objects (KEP-5866's `shardSelector`) and says so; with it
//! off, the server sends everything and the informer keeps the shard's objects with the
//! same hash. The caches hold the same objects either way.

use std::collections::BTreeSet;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use kube_informer::{
    CancellationToken, InformerFactory, InformerHandle, Scope,
    list_watch::{HashRange, Shard, ShardField, ShardMode},
};
use kube_testenv::TestEnv;
use tests::{config_map, eventually, test_namespace};

const OBJECTS: usize = 300;
const SHARDS: usize = 3;

fn shards() -> Vec<Shard> {
    (0..SHARDS)
        .map(|i| Shard::new(ShardField::Uid, [HashRange::part(i, SHARDS).unwrap()]).unwrap())
        .collect()
}

/// The names of the server's ConfigMaps in `shard`, by the client's hash of their UIDs.
async fn server_shard(api: &Api<ConfigMap>, shard: &Shard) -> BTreeSet<String> {
    let listed = api.list(&ListParams::default()).await.unwrap();
    listed
        .items
        .iter()
        .filter(|cm| shard.contains(*cm))
        .map(|cm| cm.metadata.name.clone().unwrap())
        .collect()
}

fn cached(informer: &InformerHandle<ConfigMap>) -> BTreeSet<String> {
    informer
        .store()
        .list()
        .iter()
        .map(|cm| cm.metadata.name.clone().unwrap())
        .collect()
}

async fn create(api: &Api<ConfigMap>, names: impl Iterator<Item = String>) {
    futures::stream::iter(names)
        .for_each_concurrent(32, |name| async move {
            api.create(&PostParams::default(), &config_map(&name, &[]))
                .await
                .unwrap();
        })
        .await;
}

/// Three shards of 300 ConfigMaps: each cache holds exactly its shard, the three are
/// disjoint and cover the namespace, they follow creates and deletes, and one widened
/// at run time holds its new shard. Returns how
/// the shards were applied and how many objects the informers dropped themselves.
async fn three_shards(client: Client, namespace: &str) -> (Vec<Option<ShardMode>>, u64) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    create(&api, (0..OBJECTS).map(|i| format!("cm-{i:03}"))).await;

    let factory = InformerFactory::new(client);
    let informers: Vec<_> = shards()
        .into_iter()
        .map(|shard| factory.informer::<ConfigMap>(Scope::namespace(namespace).shard(shard)))
        .collect();
    let cancel = CancellationToken::new();
    factory.start(&cancel);
    factory.wait_synced().await.unwrap();

    let mut all = BTreeSet::new();
    for (informer, shard) in informers.iter().zip(shards()) {
        let expected = server_shard(&api, &shard).await;
        assert_eq!(
            cached(informer),
            expected,
            "the cache holds its shard: {shard}"
        );
        assert!(
            expected.len() > OBJECTS / SHARDS / 2,
            "UIDs spread: {}",
            expected.len()
        );
        assert!(all.is_disjoint(&expected), "shards do not overlap");
        all.extend(expected);
    }
    assert_eq!(all.len(), OBJECTS, "the shards cover every object");

    // Changes reach only the shard they belong to.
    create(&api, (0..60).map(|i| format!("new-{i:02}"))).await;
    for i in 0..30 {
        api.delete(&format!("cm-{i:03}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    for (informer, shard) in informers.iter().zip(shards()) {
        let expected = server_shard(&api, &shard).await;
        eventually("the shard's cache follows the server", || {
            cached(informer) == expected
        })
        .await;
    }
    // The first informer takes the second shard too: it relists, and holds both.
    let wider = Shard::new(
        ShardField::Uid,
        [
            HashRange::part(0, SHARDS).unwrap(),
            HashRange::part(1, SHARDS).unwrap(),
        ],
    )
    .unwrap();
    informers[0].reshard(wider.clone()).unwrap();
    let expected = server_shard(&api, &wider).await;
    eventually("the resharded cache holds both shards", || {
        cached(&informers[0]) == expected
    })
    .await;
    let modes = informers
        .iter()
        .map(|i| i.reflector_stats().shard_mode())
        .collect();
    let outside = informers
        .iter()
        .map(|i| i.reflector_stats().outside_shard())
        .sum();
    cancel.cancel();
    factory.shutdown().await;
    (modes, outside)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_with_the_gate_on_the_server_selects_each_shard() {
    let env = TestEnv::builder()
        .apiserver_arg("--feature-gates=ShardedListAndWatch=true")
        .start()
        .await
        .expect("a control plane with the ShardedListAndWatch gate");
    let namespace = env.create_namespace("shard-gate-on").await.unwrap();
    let client = env.client().await.unwrap();
    let (modes, outside) = three_shards(client, &namespace).await;
    assert_eq!(modes, vec![Some(ShardMode::Server); SHARDS]);
    assert_eq!(outside, 0, "the server sent no object from outside a shard");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_with_the_gate_off_the_informer_selects_each_shard() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "shard-gate-off").await;
    let (modes, outside) = three_shards(client, &namespace).await;
    assert_eq!(modes, vec![Some(ShardMode::Client); SHARDS]);
    assert!(
        outside >= (OBJECTS * (SHARDS - 1)) as u64,
        "each informer received the other shards' objects and dropped them: {outside}"
    );
}
