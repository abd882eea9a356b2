//! The controller wiring, through the public API only: an informer feeds object keys to a
//! queue, and a worker reads each object back from the store by key (absent = deleted).

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_informer::{
    Lister, ObjectKey, Selector, SharedInformer, store::label_index, wait_for_cache_sync,
};
use support::*;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[tokio::test(start_paused = true)]
async fn keys_to_queue_and_back_from_the_store() {
    let fake = Fake::new("configmaps");
    fake.add(labelled_in("default", "web-1", "web"));
    fake.add(labelled_in("default", "web-2", "web"));
    fake.add(labelled_in("default", "db-1", "db"));

    let informer = SharedInformer::builder(fake.clone())
        .index_fn("app", label_index("app"))
        .build();
    let (queue, mut keys) = mpsc::unbounded_channel::<ObjectKey>();
    let registration = informer
        .add_key_handler(move |key| {
            let _ = queue.send(key);
        })
        .expect("an informer that has not run has not stopped");

    let informer = informer.spawn(CancellationToken::new());
    wait_for_cache_sync(&[&informer, &registration], Duration::from_secs(10))
        .await
        .expect("synced");

    let store = informer.store();
    let mut initial = Vec::new();
    for _ in 0..3 {
        let key = keys.recv().await.expect("key");
        assert!(store.get_by_key(&key).is_some(), "{key} cached");
        initial.push(key.to_string());
    }
    initial.sort();
    assert_eq!(initial, ["default/db-1", "default/web-1", "default/web-2"]);

    assert_eq!(store.by_index("app", "web").expect("index").len(), 2);
    let lister: Lister<ConfigMap> = informer.lister();
    let db: Selector = "app=db".parse().expect("selector");
    assert_eq!(lister.list_selector(&db).len(), 1);
    assert!(lister.get("default", "web-2").is_some());

    fake.wait_for_calls(|c| c.watches == 1).await;
    fake.delete(Some("default"), "web-1");
    let key = keys.recv().await.expect("key");
    assert_eq!(key.as_str(), "default/web-1");
    assert!(
        store.get_by_key(&key).is_none(),
        "a worker sees the deletion"
    );
    assert_eq!(store.index_keys("app", "web").expect("index").len(), 1);

    informer.stop().await;
}
