//! Informers of typed Pods, of a CRD's objects through `DynamicObject`, of metadata only,
//! and of `LazyObject<Pod>`s.

use k8s_openapi::{
    api::core::v1::{ConfigMap, Pod},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube_client::{
    Api,
    api::{Patch, PatchParams, PostParams},
    core::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta},
};
use kube_informer::{
    SharedInformer,
    list_watch::LazyObject,
    list_watch::{ApiListWatch, ListWatch, WireFormat},
    store::label_index,
};
use kube_testenv::TestEnv;
use serde_json::json;
use tests::{
    Ev, eventually, eventually_some, labelled, name, next_event, recorder, run, rv, test_namespace,
    within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_dynamic_and_metadata_only_informers() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "kinds").await;

    // Pods (no nodes: they stay Pending).
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let pod_informer = SharedInformer::new(pods.clone());
    let pod_informer = run(pod_informer);
    within("the Pod informer to sync", pod_informer.wait_synced()).await;
    for i in 0..3 {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": format!("pod-{i}"), "labels": { "app": "demo" } },
            "spec": { "containers": [{ "name": "c", "image": "busybox" }] }
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    eventually("the Pods in the cache", || pod_informer.store().len() == 3).await;
    let pod = pod_informer
        .lister()
        .get(namespace.as_str(), "pod-1")
        .unwrap();
    assert_eq!(
        pod.spec.as_ref().unwrap().containers[0].image.as_deref(),
        Some("busybox")
    );
    pod_informer.stop().await;

    // A CRD, served once Established, through DynamicObject.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": { "name": "widgets.test.kube-informer.dev" },
        "spec": {
            "group": "test.kube-informer.dev",
            "scope": "Namespaced",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList" },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } }
                } }
            }]
        }
    }))
    .unwrap();
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube_client::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating the CRD: {e}"),
    }
    eventually_some("the CRD to be Established", || async {
        let current = crds.get("widgets.test.kube-informer.dev").await.unwrap();
        current
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;
    let gvk = GroupVersionKind::gvk("test.kube-informer.dev", "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &ar);
    assert_eq!(
        ListWatch::<DynamicObject>::resource(&widgets),
        "widgets.test.kube-informer.dev"
    );
    let widget_informer = SharedInformer::new(widgets.clone());
    let (_reg, mut widget_rx) = recorder(&widget_informer);
    let widget_informer = run(widget_informer);
    // Discovery may lag Established by a moment; the reflector retries until served.
    within("the widget informer to sync", widget_informer.wait_synced()).await;
    let widget = DynamicObject::new("w1", &ar).data(json!({ "spec": { "size": 3 } }));
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    match next_event(&mut widget_rx, "the widget's add").await {
        Ev::Add(w, false) => {
            assert_eq!(name(&*w), "w1");
            assert_eq!(w.data["spec"]["size"], 3);
            assert_eq!(w.types.as_ref().unwrap().kind, "Widget");
        }
        other => panic!("expected the widget's add, got {other:?}"),
    }
    widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "size": 4 } })),
        )
        .await
        .unwrap();
    match next_event(&mut widget_rx, "the widget's update").await {
        Ev::Update(old, new) => {
            assert_eq!(old.data["spec"]["size"], 3);
            assert_eq!(new.data["spec"]["size"], 4);
        }
        other => panic!("expected the widget's update, got {other:?}"),
    }
    widget_informer.stop().await;

    // Metadata only (kube-client asks for PartialObjectMetadata).
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let created = config_maps
        .create(
            &PostParams::default(),
            &labelled("meta", &[("app", "demo")]),
        )
        .await
        .unwrap();
    let metas: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client, &namespace);
    let meta_informer = SharedInformer::builder(metas)
        .index_fn("app", label_index("app"))
        .build();
    let meta_informer = run(meta_informer);
    within("the metadata informer to sync", meta_informer.wait_synced()).await;
    // Its list may predate the create in the watch cache; the watch brings it then.
    eventually("the ConfigMap's metadata in the cache", || {
        meta_informer
            .store()
            .get_by_key(format!("{namespace}/meta"))
            .is_some()
    })
    .await;
    let cached = meta_informer
        .store()
        .get_by_key(format!("{namespace}/meta"))
        .expect("the ConfigMap's metadata is cached");
    assert_eq!(rv(&*cached), rv(&created));
    assert_eq!(cached.types.as_ref().unwrap().kind, "PartialObjectMetadata");
    assert_eq!(
        meta_informer.store().by_index("app", "demo").unwrap().len(),
        1
    );
    meta_informer.stop().await;
}

/// Informers of `LazyObject<Pod>`, through protobuf and a streaming list (the defaults) and
/// through JSON and paged lists: the metadata is there on arrival for the handlers and the
/// index, and each cached object decodes to exactly the Pod the server returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_objects_carry_their_metadata_and_decode_to_the_servers_objects() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "lazy").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    for i in 0..3 {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": format!("pod-{i}"), "labels": { "app": "demo" } },
            "spec": { "containers": [{ "name": "c", "image": "busybox" }] }
        }))
        .unwrap();
        // Server-side apply, so that the Pods have managedFields.
        pods.patch(
            &format!("pod-{i}"),
            &PatchParams::apply("lazy-test").force(),
            &Patch::Apply(pod),
        )
        .await
        .unwrap();
    }
    let lazy_pods: Api<LazyObject<Pod>> = Api::namespaced(client, &namespace);
    for (wire_format, paged) in [(WireFormat::Protobuf, false), (WireFormat::Json, true)] {
        let what = format!("{wire_format:?}, paged list: {paged}");
        let builder =
            SharedInformer::builder(ApiListWatch::new(lazy_pods.clone()).wire_format(wire_format))
                .index_fn("app", label_index("app"));
        let informer = if paged {
            builder.paged_list()
        } else {
            builder.streaming_list()
        }
        .build();
        let (_registration, mut events) = recorder(&informer);
        let informer = run(informer);
        within("the lazy informer to sync", informer.wait_synced()).await;
        let mut added = Vec::new();
        while added.len() < 3 {
            match next_event(&mut events, "the Pods' adds").await {
                Ev::Add(pod, _) => added.push(name(&*pod)),
                other => panic!("{what}: expected an add, got {other:?}"),
            }
        }
        added.sort();
        assert_eq!(added, ["pod-0", "pod-1", "pod-2"], "{what}");
        let store = informer.store();
        assert_eq!(store.by_index("app", "demo").unwrap().len(), 3, "{what}");
        for i in 0..3 {
            let cached = store
                .get_by_key(format!("{namespace}/pod-{i}"))
                .expect("the Pod is cached");
            assert_eq!(cached.metadata.managed_fields, None, "{what}");
            let server = pods.get(&format!("pod-{i}")).await.unwrap();
            assert!(
                server.metadata.managed_fields.is_some(),
                "applied server-side"
            );
            assert_eq!(cached.decode().unwrap(), server, "{what}");
        }

        let patched = set_app_label(&pods, "pod-1", "other").await;
        match next_event(&mut events, "pod-1's update").await {
            Ev::Update(old, new) => {
                assert_eq!(old.metadata.labels.as_ref().unwrap()["app"], "demo");
                assert_eq!(new.metadata.labels.as_ref().unwrap()["app"], "other");
                assert_eq!(new.decode().unwrap(), patched, "{what}");
            }
            other => panic!("{what}: expected pod-1's update, got {other:?}"),
        }
        assert_eq!(store.by_index("app", "demo").unwrap().len(), 2, "{what}");
        // Put the label back for the next round.
        set_app_label(&pods, "pod-1", "demo").await;
        match next_event(&mut events, "pod-1's update back").await {
            Ev::Update(_, new) => assert_eq!(new.metadata.labels.as_ref().unwrap()["app"], "demo"),
            other => panic!("{what}: expected pod-1's update, got {other:?}"),
        }
        informer.stop().await;
    }
}

/// Sets the `app` label of the Pod `name`; returns the Pod as patched.
async fn set_app_label(pods: &Api<Pod>, name: &str, app: &str) -> Pod {
    pods.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "labels": { "app": app } } })),
    )
    .await
    .unwrap()
}
