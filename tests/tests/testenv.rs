//! The local control plane behaves like a real cluster: paged lists,
//! watches, workloads turning into Pods, data surviving an API server
//! restart, compaction, and clear errors when it is unreachable.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap, core::v1::Pod};
use kube_client::{
    Api,
    api::{ListParams, PostParams, WatchEvent, WatchParams},
};
use kube_testenv::TestEnv;
use tests::{PATIENCE, config_map, eventually_some, test_namespace, within};

#[tokio::test]
async fn config_maps_list_in_pages_and_watch() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "paging").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    for i in 0..25 {
        let name = format!("cm-{i:02}");
        api.create(
            &PostParams::default(),
            &config_map(&name, &[("key", &name)]),
        )
        .await
        .unwrap();
    }

    let mut names = Vec::new();
    let mut pages = 0;
    let mut params = ListParams::default().limit(10);
    let resource_version = loop {
        let page = api.list(&params).await.unwrap();
        pages += 1;
        names.extend(page.items.iter().filter_map(|cm| cm.metadata.name.clone()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break page.metadata.resource_version.unwrap(),
        }
    };
    assert_eq!(pages, 3);
    names.sort();
    assert_eq!(
        names,
        (0..25).map(|i| format!("cm-{i:02}")).collect::<Vec<_>>()
    );

    let mut events = api
        .watch(&WatchParams::default(), &resource_version)
        .await
        .unwrap()
        .boxed();
    api.create(
        &PostParams::default(),
        &config_map("late", &[("key", "late")]),
    )
    .await
    .unwrap();
    let event = within("the watch to send the new ConfigMap", events.try_next())
        .await
        .unwrap();
    match event {
        Some(WatchEvent::Added(cm)) => assert_eq!(cm.metadata.name.as_deref(), Some("late")),
        other => panic!("expected the new ConfigMap to be added, got {other:?}"),
    }
}

#[tokio::test]
async fn a_deployment_becomes_three_pods() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "deploy").await;
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "nginx" },
        "spec": {
            "replicas": 3,
            "selector": { "matchLabels": { "app": "nginx" } },
            "template": {
                "metadata": { "labels": { "app": "nginx" } },
                "spec": { "containers": [{ "name": "nginx", "image": "nginx:1.27" }] }
            }
        }
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let params = ListParams::default().labels("app=nginx");
    eventually_some("the Deployment's 3 Pods", || async {
        (pods.list(&params).await.unwrap().items.len() == 3).then_some(())
    })
    .await;
}

#[tokio::test]
async fn data_survives_an_apiserver_restart_and_a_stopped_one_fails_fast() {
    let env = TestEnv::builder().start().await.unwrap();
    let (client, namespace) = test_namespace(&env, "restart").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    api.create(
        &PostParams::default(),
        &config_map("kept", &[("key", "kept")]),
    )
    .await
    .unwrap();

    env.stop_apiserver().await;
    assert!(!env.apiserver_running());
    let error = within(
        "a stopped API server to give an error, not a hang",
        api.get("kept"),
    )
    .await
    .unwrap_err();
    let message = error.to_string();
    assert!(
        message.to_lowercase().contains("connect") || message.contains("refused"),
        "the error says the server cannot be reached: {message}"
    );

    env.start_apiserver().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().await.unwrap(), &namespace);
    let kept = api.get("kept").await.unwrap();
    assert_eq!(kept.data.unwrap()["key"], "kept");

    let pids = env.pids();
    let dir = env.dir().to_owned();
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver run");
    drop(env);
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "{pid} was stopped and reaped"
        );
    }
    assert!(!dir.exists(), "the environment's directory is removed");
}

#[tokio::test]
async fn compaction_makes_old_resource_versions_gone() {
    // Without the watch cache, watches are served by etcd itself, so a
    // compacted revision is refused at once rather than when it ages out.
    let env = TestEnv::builder()
        .apiserver_arg("--watch-cache=false")
        .start()
        .await
        .unwrap();
    let (client, namespace) = test_namespace(&env, "compact").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let first = api
        .create(&PostParams::default(), &config_map("a", &[("key", "a")]))
        .await
        .unwrap();
    let old_version = first.metadata.resource_version.unwrap();
    // etcd keeps the revision compacted to, and a watch from `old_version`
    // starts one after it: two later writes put that start below the
    // compaction point.
    for name in ["b", "c"] {
        api.create(&PostParams::default(), &config_map(name, &[("key", name)]))
            .await
            .unwrap();
    }

    let revision = env.compact_etcd().await.unwrap();
    assert!(
        revision > old_version.parse::<i64>().unwrap() + 1,
        "{revision} {old_version}"
    );

    // The 410 may come as the response or as the stream's first event.
    let outcome = match api.watch(&WatchParams::default(), &old_version).await {
        Err(err) => err.to_string(),
        Ok(stream) => {
            let mut stream = stream.boxed();
            let mut last = String::new();
            while let Ok(Some(Ok(event))) = tokio::time::timeout(PATIENCE, stream.next()).await {
                if let WatchEvent::Error(status) = event {
                    last = format!("{} {}", status.code, status.message);
                    break;
                }
            }
            last
        }
    };
    assert!(
        outcome.contains("410") || outcome.contains("too old"),
        "got {outcome:?}"
    );
}

#[tokio::test]
async fn a_wrong_kubeconfig_gives_a_clear_error() {
    let env = TestEnv::shared().await;
    let dir = tempfile_dir();
    let wrong = dir.join("kubeconfig");
    let text = std::fs::read_to_string(env.kubeconfig_path()).unwrap();
    // Point the same credentials at a port nothing listens on.
    let port = env.server_url().rsplit(':').next().unwrap().to_owned();
    std::fs::write(&wrong, text.replace(&format!(":{port}"), ":1")).unwrap();

    let kubeconfig = kube_client::config::Kubeconfig::read_from(&wrong).unwrap();
    let config = kube_client::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube_client::Client::try_from(config).unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let error = within(
        "an unreachable server to give an error, not a hang",
        api.list(&ListParams::default()),
    )
    .await
    .unwrap_err();
    assert!(
        error.to_string().to_lowercase().contains("connect"),
        "{error}"
    );

    let missing = kube_client::config::Kubeconfig::read_from(dir.join("absent"));
    let message = missing.unwrap_err().to_string();
    assert!(
        message.contains("absent"),
        "a missing kubeconfig names the file: {message}"
    );
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kube-testenv-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
