//! Per-test namespaces on a control plane, and reads and writes against it.

use std::{collections::BTreeMap, time::Duration};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube_client::{
    Api, Client,
    api::{ListParams, PostParams},
    core::Resource,
};
use kube_testenv::TestEnv;

use crate::{
    fixtures::{name, rv},
    wait::within,
};

/// A fresh namespace named after `prefix`, and an admin client for it.
///
/// Tests of one binary share a control plane ([`TestEnv::shared`]), so each works in a
/// namespace of its own; the client is new because a client is tied to the runtime of the
/// test that creates it.
pub async fn test_namespace(env: &TestEnv, prefix: &str) -> (Client, String) {
    let namespace = env
        .create_namespace(prefix)
        .await
        .expect("the namespace is created");
    let client = env.client().await.expect("an admin client");
    (client, namespace)
}

/// Creates `objects` concurrently, as a burst of writes would come.
pub async fn create_all(api: &Api<ConfigMap>, objects: Vec<ConfigMap>) {
    let created: Vec<ConfigMap> = within(
        "creating ConfigMaps",
        futures::stream::iter(objects)
            .map(|cm| {
                let api = api.clone();
                async move { api.create(&PostParams::default(), &cm).await }
            })
            .buffer_unordered(32)
            .try_collect(),
    )
    .await
    .expect("ConfigMaps are created");
    assert!(!created.is_empty());
}

/// Waits until a list served from the API server's watch cache (resourceVersion "0", as an
/// informer's first list) returns at least `count` objects: that cache may lag the writes
/// just made, and a test that expects its informer to sync with them must wait for it.
pub async fn watch_cache_holds<K>(api: &Api<K>, count: usize)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    within("the watch cache to take in the writes", async {
        while api
            .list(&ListParams::default().match_any())
            .await
            .unwrap()
            .items
            .len()
            < count
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// `name -> resourceVersion` of what the API server lists now.
pub async fn server_state<K>(api: &Api<K>) -> BTreeMap<String, String>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| (name(o), rv(o)))
        .collect()
}

/// Who holds the Lease `lease` now; `None` if it is free, missing or cannot be read.
pub async fn lease_holder(leases: &Api<Lease>, lease: &str) -> Option<String> {
    leases
        .get_opt(lease)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}
