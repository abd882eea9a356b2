//! A label index and the lister's selectors, following relabels and deletes.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
};
use kube_informer::{Error, Selector, SharedInformer, store::label_index};
use kube_testenv::TestEnv;
use serde_json::json;
use tests::{
    create_all, eventually, labelled, name, run, test_namespace, watch_cache_holds, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_index_and_lister_by_selector() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "index").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    create_all(
        &api,
        vec![
            labelled("web-1", &[("app", "web"), ("tier", "front")]),
            labelled("web-2", &[("app", "web"), ("tier", "front")]),
            labelled("web-3", &[("app", "web")]),
            labelled("db-1", &[("app", "db"), ("tier", "back")]),
            labelled("db-2", &[("app", "db")]),
            labelled("plain", &[]),
        ],
    )
    .await;
    watch_cache_holds(&api, 6).await;

    let informer = SharedInformer::builder(api.clone())
        .index_fn("app", label_index("app"))
        .build();
    let informer = run(informer);
    within("the informer to sync", informer.wait_synced()).await;
    let store = informer.store();

    let names_of = |v: Vec<Arc<ConfigMap>>| {
        let mut n: Vec<String> = v.iter().map(|o| name(&**o)).collect();
        n.sort();
        n
    };
    assert_eq!(
        names_of(store.by_index("app", "web").unwrap()),
        ["web-1", "web-2", "web-3"]
    );
    assert_eq!(
        names_of(store.by_index("app", "db").unwrap()),
        ["db-1", "db-2"]
    );
    assert!(store.by_index("app", "none").unwrap().is_empty());
    let mut values = store.list_index_values("app").unwrap();
    values.sort();
    assert_eq!(values, ["db", "web"]);
    assert_eq!(store.index_keys("app", "db").unwrap().len(), 2);
    assert!(matches!(
        store.by_index("missing", "x"),
        Err(Error::IndexNotFound(_))
    ));

    let lister = informer.lister();
    let select = |s: &str| names_of(lister.list_selector(&s.parse::<Selector>().unwrap()));
    assert_eq!(select("app=web"), ["web-1", "web-2", "web-3"]);
    assert_eq!(select("app in (web, db),tier"), ["db-1", "web-1", "web-2"]);
    assert_eq!(select("!app"), ["plain"]);
    assert_eq!(select("app!=web"), ["db-1", "db-2", "plain"]);
    assert_eq!(
        names_of(lister.list_namespace_selector(&namespace, &"tier=back".parse().unwrap())),
        ["db-1"]
    );
    assert!(
        lister
            .list_namespace_selector("elsewhere", &Selector::everything())
            .is_empty()
    );
    assert_eq!(lister.list_namespace(&namespace).len(), 6);
    assert!(lister.get(namespace.as_str(), "plain").is_some());

    // Relabelling and deleting move objects between index values.
    api.patch(
        "web-3",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "labels": { "app": "db" } } })),
    )
    .await
    .unwrap();
    api.delete("db-1", &DeleteParams::default()).await.unwrap();
    eventually("the index to follow the relabel and the delete", || {
        names_of(store.by_index("app", "db").unwrap()) == ["db-2", "web-3"]
    })
    .await;
    assert_eq!(
        names_of(store.by_index("app", "web").unwrap()),
        ["web-1", "web-2"]
    );
    assert_eq!(select("app=db"), ["db-2", "web-3"]);
    informer.stop().await;
}
