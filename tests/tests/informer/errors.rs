//! Errors from the real server: RBAC's 403 at start and after, and objects that do not decode.

use std::{borrow::Cow, time::Duration};

use k8s_openapi::{
    NamespaceResourceScope,
    api::core::v1::{ConfigMap, ServiceAccount},
    api::rbac::v1::{Role, RoleBinding},
};
use kube_client::{
    Api, Client, Config,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
    config::{AuthInfo, KubeConfigOptions, Kubeconfig},
    core::Resource,
};
use kube_informer::{
    Error, SharedInformer,
    error::Verb,
    list_watch::{ListOptions, ListWatch, WatchOptions},
    reflector::BackoffConfig,
};
use kube_testenv::TestEnv;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tests::{
    Ev, cache_state, config_map, error_log, name, next_event, recorder, run, test_namespace,
    wait_errors, within,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_forbidden_is_fatal_at_start_and_heals_when_granted() {
    let env = TestEnv::shared().await;
    let (admin, namespace) = test_namespace(env, "rbac").await;
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("reader".to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let mut kubectl = env.kubectl();
    kubectl.args(["create", "token", "reader", "-n", &namespace]);
    let output = tokio::task::spawn_blocking(move || kubectl.output())
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let token = String::from_utf8(output.stdout).unwrap().trim().to_owned();

    let kubeconfig = Kubeconfig::read_from(env.kubeconfig_path()).unwrap();
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.auth_info = AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let client = Client::try_from(config).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);

    // The `Api` list-watch sorts the 403 for both verbs.
    let list = ListWatch::<ConfigMap>::list(&api, &ListOptions::default())
        .await
        .unwrap_err();
    assert!(list.is_forbidden(), "{list}");
    let watch = ListWatch::<ConfigMap>::watch(
        &api,
        &WatchOptions {
            resource_version: "0".into(),
            timeout: Some(Duration::from_secs(10)),
            allow_bookmarks: true,
            send_initial_events: false,
            shard: None,
        },
    )
    .await
    .err()
    .expect("watching is forbidden too");
    assert!(
        matches!(
            &watch,
            Error::Forbidden {
                verb: Verb::Watch,
                ..
            }
        ),
        "{watch}"
    );

    let (errors, hook) = error_log();
    let informer = SharedInformer::builder(api.clone())
        .on_watch_error(hook)
        .build();
    let informer = run(informer);
    let error = within("the first sync to fail", informer.wait_synced_or_fatal())
        .await
        .unwrap_err();
    match &error {
        Error::Forbidden {
            resource,
            verb,
            namespace: ns,
            message,
        } => {
            assert_eq!(resource, "configmaps");
            // The first sync is a streaming list: a watch.
            assert_eq!(*verb, Verb::Watch);
            assert_eq!(ns.as_deref(), Some(namespace.as_str()));
            assert!(
                message.contains(&format!("system:serviceaccount:{namespace}:reader")),
                "{message}"
            );
        }
        other => panic!("expected Forbidden, got {other}"),
    }
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "cannot watch configmaps in namespace \"{namespace}\""
        )),
        "{text}"
    );
    assert!(errors.borrow().iter().all(|e| e.forbidden));
    assert!(!informer.has_synced());

    // The reflector keeps retrying: granting the permission lets it sync.
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": "read-config-maps" },
        "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"] }]
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "reader-reads-config-maps" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-config-maps" },
        "subjects": [{ "kind": "ServiceAccount", "name": "reader", "namespace": namespace }]
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin, &namespace)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    within("the informer to sync once allowed", informer.wait_synced()).await;
    informer.stop().await;
}

/// A ConfigMap as a stricter program sees it: `data.required` must exist.
#[derive(Clone, Debug, Deserialize, Serialize)]
struct StrictConfigMap {
    metadata: ObjectMeta,
    #[allow(dead_code)]
    data: StrictData,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
struct StrictData {
    #[allow(dead_code)]
    required: String,
}

impl Resource for StrictConfigMap {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ConfigMap".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "configmaps".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// An object that does not decode is reported by key, on the watch and on a relist, and
/// only it waits: the cache keeps following every other object (creates, deletes), and
/// once the object is fixed its next change reaches the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_object_is_reported_by_key_while_the_others_are_followed() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "decode").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    api.create(
        &PostParams::default(),
        &config_map("good", &[("required", "x")]),
    )
    .await
    .unwrap();

    let (errors, hook) = error_log();
    let informer = SharedInformer::builder(Api::<StrictConfigMap>::namespaced(
        env.client().await.unwrap(),
        &namespace,
    ))
    .backoff(
        BackoffConfig::default()
            .initial(Duration::from_millis(100))
            .max(Duration::from_secs(1)),
    )
    .on_watch_error(hook)
    .build();
    let (_reg, mut rx) = recorder(&informer);
    let informer = run(informer);
    within("the informer to sync", informer.wait_synced()).await;
    assert!(matches!(
        next_event(&mut rx, "the initial add").await,
        Ev::Add(_, true)
    ));

    api.create(
        &PostParams::default(),
        &config_map("bad", &[("other", "y")]),
    )
    .await
    .unwrap();
    let bad_key = format!("{namespace}/bad");
    wait_errors(&errors, "the bad object named on the watch", |e| {
        e.iter()
            .any(|e| e.undecodable.as_deref() == Some(bad_key.as_str()))
    })
    .await;
    assert!(errors.borrow()[0].text.contains("configmaps"));
    assert!(informer.has_synced());

    // Everything else goes on: a new object, and a deletion.
    api.create(
        &PostParams::default(),
        &config_map("later", &[("required", "y")]),
    )
    .await
    .unwrap();
    match next_event(&mut rx, "the next good object's add").await {
        Ev::Add(o, false) => assert_eq!(name(&*o), "later"),
        other => panic!("expected the add of later, got {other:?}"),
    }
    api.delete("good", &DeleteParams::default()).await.unwrap();
    match next_event(&mut rx, "the deletion of good").await {
        Ev::Delete(d) => assert_eq!(name(&**d.object()), "good"),
        other => panic!("expected the deletion of good, got {other:?}"),
    }
    assert_eq!(
        cache_state(&informer).keys().collect::<Vec<_>>(),
        ["later"],
        "the bad object is not cached, the others are"
    );

    api.patch(
        "bad",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "required": "now" } })),
    )
    .await
    .unwrap();
    match next_event(&mut rx, "the fixed object's add").await {
        Ev::Add(o, false) => assert_eq!(name(&*o), "bad"),
        other => panic!("expected the fixed object's add, got {other:?}"),
    }
    assert_eq!(cache_state(&informer).len(), 2);
    assert!(
        errors
            .borrow()
            .iter()
            .all(|e| e.undecodable.as_deref() == Some(bad_key.as_str())),
        "no other error: {:?}",
        errors.borrow()
    );
    informer.stop().await;
}
