//! The reconciling controller and the informer factory on the real control plane: owned
//! children, mapped and index-backed watches reconcile their primaries; requeue-after
//! reconciles again with nothing changed; a shutdown with 500 keys queued takes none of
//! them and cancels the running reconciles.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{ConfigMap, Secret, ServiceAccount},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube_client::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use kube_informer::{
    Action, CancellationToken, ControllerBuilder, InformerFactory, ObjectKey, ReconcileRequest,
    Scope, retry_with_backoff,
};
use kube_testenv::TestEnv;
use serde_json::json;
use tests::{create_all, eventually, labelled, name, test_namespace, within};
use tokio::time::Instant;

/// The annotation by which a primary names the Secret it uses (the index-backed watch).
const USES: &str = "example.com/uses-secret";
/// The annotation by which a ServiceAccount names the primary it is for (the mapped watch).
const FOR: &str = "example.com/for";

/// Reconciles seen, per primary name: whether it was present, and when.
type Seen = Arc<Mutex<BTreeMap<String, Vec<(bool, Instant)>>>>;

fn count(seen: &Seen, primary: &str) -> usize {
    seen.lock().unwrap().get(primary).map_or(0, Vec::len)
}

fn annotated(mut cm: ConfigMap, key: &str, value: &str) -> ConfigMap {
    cm.metadata.annotations = Some([(key.to_owned(), value.to_owned())].into());
    cm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_mapped_and_indexed_sources_reconcile_their_primaries() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "ctrl-sources").await;
    let primaries: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
    let primary = |name: &str| labelled(name, &[("role", "primary")]);
    let owner = primaries
        .create(&PostParams::default(), &primary("owner"))
        .await
        .unwrap();
    for p in [
        annotated(primary("user"), USES, "shared"),
        primary("mapped"),
        primary("periodic"),
    ] {
        primaries.create(&PostParams::default(), &p).await.unwrap();
    }

    let factory = InformerFactory::new(client.clone());
    let scope = Scope::namespace(&namespace);
    let primary_informer =
        factory.informer_with::<ConfigMap>(scope.clone().labels("role=primary"), |builder| {
            builder.indexer("uses-secret", |cm: &ConfigMap| {
                let ns = cm.metadata.namespace.clone().unwrap_or_default();
                cm.metadata
                    .annotations
                    .iter()
                    .flatten()
                    .filter(|(k, _)| *k == USES)
                    .map(|(_, v)| format!("{ns}/{v}"))
                    .collect()
            })
        });
    let secret_informer = factory.informer::<Secret>(scope.clone());
    let _same = factory.informer::<Secret>(scope.clone());
    assert_eq!(factory.len(), 2, "the second ask shared the first informer");
    let controller = ControllerBuilder::new("sources", primary_informer)
        .owns(secret_informer.clone())
        .watches_by_index(secret_informer, "uses-secret")
        .watches(
            factory.informer::<ServiceAccount>(scope.clone()),
            |sa: &ServiceAccount| {
                let ns = sa.metadata.namespace.as_deref();
                sa.metadata
                    .annotations
                    .iter()
                    .flatten()
                    .filter(|(k, _)| *k == FOR)
                    .map(|(_, v)| ObjectKey::new(ns, v))
                    .collect()
            },
        );
    let seen: Seen = Arc::default();
    let cancel = CancellationToken::new();
    factory.start(&cancel);
    within("the factory's informers to sync", factory.wait_synced())
        .await
        .unwrap();
    let record = seen.clone();
    let run = tokio::spawn(controller.run(
        move |request: ReconcileRequest<ConfigMap>, _: Arc<()>, _| {
            let key = request.key();
            let primary = key
                .as_str()
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            let present = matches!(request, ReconcileRequest::Present(_));
            record
                .lock()
                .unwrap()
                .entry(primary.clone())
                .or_default()
                .push((present, Instant::now()));
            async move {
                Ok::<_, std::io::Error>(if primary == "periodic" {
                    Action::requeue_after(Duration::from_secs(2))
                } else {
                    Action::done()
                })
            }
        },
        retry_with_backoff(),
        Arc::new(()),
        cancel.clone(),
    ));
    eventually("every primary reconciled once", || {
        ["owner", "user", "mapped", "periodic"]
            .iter()
            .all(|p| count(&seen, p) >= 1)
    })
    .await;

    // An owned child: its controller reference names the primary.
    let mut child = Secret::default();
    child.metadata.name = Some("child".into());
    child.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: owner.metadata.uid.clone().unwrap(),
        controller: Some(true),
        ..Default::default()
    }]);
    secrets
        .create(&PostParams::default(), &child)
        .await
        .unwrap();
    eventually("the owner reconciled for its child", || {
        count(&seen, "owner") >= 2
    })
    .await;

    // The Secret a primary names, through the primary's index.
    let mut shared = Secret::default();
    shared.metadata.name = Some("shared".into());
    secrets
        .create(&PostParams::default(), &shared)
        .await
        .unwrap();
    eventually("the user reconciled for its Secret", || {
        count(&seen, "user") >= 2
    })
    .await;

    // A ServiceAccount mapped to a primary by its annotation.
    let mut account = ServiceAccount::default();
    account.metadata.name = Some("robot".into());
    account.metadata.annotations = Some([(FOR.to_owned(), "mapped".to_owned())].into());
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    eventually("the mapped primary reconciled", || {
        count(&seen, "mapped") >= 2
    })
    .await;

    // Requeue-after: reconciled again with nothing changed, 2 s apart.
    eventually("the periodic primary reconciled three times", || {
        count(&seen, "periodic") >= 3
    })
    .await;
    let periodic = seen.lock().unwrap()["periodic"].clone();
    for pair in periodic.windows(2) {
        assert!(
            pair[1].1 - pair[0].1 >= Duration::from_secs(2),
            "requeued after its delay: {periodic:?}"
        );
    }

    // A deletion reaches the reconcile as one.
    primaries
        .delete("mapped", &Default::default())
        .await
        .unwrap();
    eventually("the deletion reconciled", || {
        seen.lock().unwrap()["mapped"]
            .last()
            .is_some_and(|(present, _)| !present)
    })
    .await;
    // A change to a ConfigMap outside the primaries' label selector reconciles nothing.
    let before = seen.lock().unwrap().len();
    primaries
        .create(&PostParams::default(), &labelled("bystander", &[]))
        .await
        .unwrap();
    primaries
        .patch(
            "bystander",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "v": "2" } })),
        )
        .await
        .unwrap();
    cancel.cancel();
    within("the controller to stop", run)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        seen.lock().unwrap().len(),
        before,
        "{:?}",
        seen.lock().unwrap().keys()
    );
    assert!(!seen.lock().unwrap().contains_key("bystander"));
    factory.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_with_500_keys_queued_takes_none_and_cancels_the_running() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "ctrl-shutdown").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    create_all(
        &api,
        (0..500)
            .map(|i| labelled(&format!("cm-{i:03}"), &[]))
            .collect(),
    )
    .await;
    let factory = InformerFactory::new(client);
    let informer = factory.informer::<ConfigMap>(Scope::namespace(&namespace));
    let cancel = CancellationToken::new();
    factory.start(&cancel);
    // Every key is queued by the time the workers start: the handler synced first.
    let started: Arc<Mutex<Vec<String>>> = Arc::default();
    let ended_by_cancel: Arc<Mutex<usize>> = Arc::default();
    let (record, ended) = (started.clone(), ended_by_cancel.clone());
    let run = tokio::spawn(
        ControllerBuilder::new("shutdown", informer)
            .workers(2)
            .shutdown_timeout(Duration::from_secs(60))
            .run(
                move |request: ReconcileRequest<ConfigMap>,
                      _: Arc<()>,
                      token: CancellationToken| {
                    record.lock().unwrap().push(request.key().to_string());
                    let ended = ended.clone();
                    async move {
                        // A reconcile that waits on something slow, and stops when told to.
                        tokio::select! {
                            () = token.cancelled() => *ended.lock().unwrap() += 1,
                            () = tokio::time::sleep(Duration::from_secs(3600)) => {}
                        }
                        Ok::<_, std::io::Error>(Action::done())
                    }
                },
                retry_with_backoff(),
                Arc::new(()),
                cancel.clone(),
            ),
    );
    eventually("both workers busy", || started.lock().unwrap().len() == 2).await;
    cancel.cancel();
    within("the controller to stop", run)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        started.lock().unwrap().len(),
        2,
        "none of the 498 queued keys was taken"
    );
    assert_eq!(
        *ended_by_cancel.lock().unwrap(),
        2,
        "the running reconciles ended because their tokens were cancelled, before the deadline"
    );
    factory.shutdown().await;
    let names: Vec<String> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(name)
        .collect();
    assert_eq!(names.len(), 500);
}
