//! The fleet-propagator example (examples/fleet-propagator) on three real control planes:
//! a hub and two members, registered as kubeconfig Secrets on the hub.

use std::collections::BTreeMap;

use fleet_propagator::{
    crd::{PROPAGATED, PropagatedConfig, PropagatedConfigSpec, member_finalizer},
    run::{Options, run},
};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace, Secret},
    events::v1::Event,
};
use kube_client::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use kube_informer::{
    CancellationToken,
    conditions::find_condition,
    fleet::{KUBECONFIG_SECRET_KEY, KUBECONFIG_SECRET_LABEL},
};
use kube_testenv::TestEnv;
use tests::{eventually_some, within};

const NAMESPACE: &str = "team-config";

async fn create_namespace(client: &Client, name: &str) {
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name } }))
            .expect("a namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("the namespace is created");
}

/// Member `cluster`'s `Propagated` status and message, if its entry has one.
async fn propagated(configs: &Api<PropagatedConfig>, cluster: &str) -> Option<(String, String)> {
    let config = configs.get_opt("settings").await.ok()??;
    let entry = config.member_status(cluster)?;
    let condition = find_condition(&entry.conditions, PROPAGATED)?;
    Some((condition.status.clone(), condition.message.clone()))
}

/// The data of member's copy, `None` while it has none.
async fn copy_data(member: &Client) -> Option<BTreeMap<String, String>> {
    let copy = Api::<ConfigMap>::namespaced(member.clone(), NAMESPACE)
        .get_opt("settings")
        .await
        .ok()??;
    Some(copy.data.unwrap_or_default())
}

fn data(value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("log-level".to_owned(), value.to_owned())])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_propagator_copies_reports_repairs_and_removes() {
    let (hub_env, a_env, b_env) = tokio::join!(
        TestEnv::builder().start(),
        TestEnv::builder().start(),
        TestEnv::builder().start()
    );
    let (hub_env, a_env, b_env) = (
        hub_env.expect("the hub"),
        a_env.expect("member a"),
        b_env.expect("member b"),
    );
    let hub = hub_env.client().await.expect("a hub client");
    let (a, b) = (
        a_env.client().await.expect("a client of a"),
        b_env.client().await.expect("a client of b"),
    );
    create_namespace(&hub, "fleet-system").await;
    // Member b lacks the namespace at first: its copy fails.
    for client in [&hub, &a] {
        create_namespace(client, NAMESPACE).await;
    }
    let secrets = Api::<Secret>::namespaced(hub.clone(), "fleet-system");
    for (name, env) in [("a", &a_env), ("b", &b_env)] {
        let kubeconfig = std::fs::read_to_string(env.kubeconfig_path()).expect("a kubeconfig");
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { KUBECONFIG_SECRET_LABEL: "true" } },
            "stringData": { KUBECONFIG_SECRET_KEY: kubeconfig },
        }))
        .expect("a Secret");
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("the member's Secret");
    }
    let cancel = CancellationToken::new();
    let options = Options {
        secrets_namespace: "fleet-system".into(),
        workers: 4,
    };
    let (view_tx, view_rx) = tokio::sync::oneshot::channel();
    let manager = kube_informer::Manager::new(hub.clone())
        .probe_address(None)
        .metrics_address(None);
    let propagator = tokio::spawn(run(manager, options, cancel.clone(), move |view| {
        let _ = view_tx.send(view);
    }));
    let view = within("the propagator to start", view_rx)
        .await
        .expect("the fleet's view");

    let configs = Api::<PropagatedConfig>::namespaced(hub.clone(), NAMESPACE);
    let sample = PropagatedConfig::new(
        "settings",
        PropagatedConfigSpec {
            data: data("debug"),
            clusters: Vec::new(),
        },
    );
    configs
        .create(&PostParams::default(), &sample)
        .await
        .expect("the PropagatedConfig");

    // a gets its copy; b's fails, in b's status entry and as an Event on the hub object.
    let (status, message) = eventually_some("b's failure reported", || async {
        let b = propagated(&configs, "b").await?;
        (b.0 == "False").then_some(b)
    })
    .await;
    assert_eq!(status, "False");
    assert!(message.contains("not found"), "{message}");
    eventually_some("a's copy", || async {
        (copy_data(&a).await? == data("debug")).then_some(())
    })
    .await;
    assert_eq!(
        propagated(&configs, "a").await.map(|c| c.0).as_deref(),
        Some("True")
    );
    let events = Api::<Event>::namespaced(hub.clone(), NAMESPACE);
    let warning = eventually_some("the failure's Event on the hub", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("PropagationFailed")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("settings")
        })
    })
    .await;
    assert!(
        warning
            .note
            .as_deref()
            .is_some_and(|n| n.contains("cluster b")),
        "{warning:?}"
    );
    assert_eq!(view.clusters().len(), 2);

    // b gets the namespace; its retried copy follows.
    create_namespace(&b, NAMESPACE).await;
    eventually_some("b's copy after the repair", || async {
        let current = propagated(&configs, "b").await?.0 == "True";
        (current && copy_data(&b).await? == data("debug")).then_some(())
    })
    .await;

    // A change of the data reaches both; a copy deleted in a member is put back.
    configs
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "data": { "log-level": "info" } } })),
        )
        .await
        .expect("the data changed");
    for member in [&a, &b] {
        eventually_some("the new data in a member", || async {
            (copy_data(member).await? == data("info")).then_some(())
        })
        .await;
    }
    Api::<ConfigMap>::namespaced(a.clone(), NAMESPACE)
        .delete("settings", &DeleteParams::default())
        .await
        .expect("a's copy deleted by hand");
    eventually_some("a's copy put back", || async {
        (copy_data(&a).await? == data("info")).then_some(())
    })
    .await;

    // b is no longer named: its copy, its status entry and its finalizer go.
    configs
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "clusters": ["a"] } })),
        )
        .await
        .expect("only a named");
    eventually_some("b withdrawn", || async {
        let config = configs.get("settings").await.ok()?;
        let finalizers = config.metadata.finalizers.clone().unwrap_or_default();
        let withdrawn = copy_data(&b).await.is_none()
            && config.member_status("b").is_none()
            && !finalizers.contains(&member_finalizer("b"))
            && finalizers.contains(&member_finalizer("a"));
        withdrawn.then_some(())
    })
    .await;
    assert!(copy_data(&a).await.is_some(), "a keeps its copy");

    // Every member named again: b gets its copy back.
    configs
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "clusters": null } })),
        )
        .await
        .expect("every member named");
    eventually_some("b's copy back", || async {
        (copy_data(&b).await? == data("info")).then_some(())
    })
    .await;

    // b leaves the fleet; then the object is deleted. a removes its copy and its
    // finalizer; b's finalizer is released, as b can no longer act; b keeps its copy.
    secrets
        .delete("b", &DeleteParams::default())
        .await
        .expect("b's Secret deleted");
    eventually_some("b gone from the fleet", || async {
        (view.clusters().len() == 1).then_some(())
    })
    .await;
    configs
        .delete("settings", &DeleteParams::default())
        .await
        .expect("the PropagatedConfig deleted");
    eventually_some("a's copy and the object gone", || async {
        let object_gone = matches!(configs.get_opt("settings").await, Ok(None));
        (object_gone && copy_data(&a).await.is_none()).then_some(())
    })
    .await;
    assert_eq!(
        copy_data(&b).await,
        Some(data("info")),
        "a member that left keeps its copy"
    );

    cancel.cancel();
    within("the propagator to stop", propagator)
        .await
        .expect("the propagator's task")
        .expect("the propagator ends without an error");
}
