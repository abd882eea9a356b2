//! Informers of typed Pods, of a CRD's objects through `DynamicObject`, and of metadata only.

use k8s_openapi::{
    api::core::v1::{ConfigMap, Pod},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube_client::{
    Api,
    api::{Patch, PatchParams, PostParams},
    core::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta},
};
use kube_informer::{ListWatch, SharedInformer, label_index};
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
