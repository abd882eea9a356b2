//! The reconciling controller and the informer factory on the real control plane: owned
//! children, mapped and index-backed watches reconcile their primaries; requeue-after
//! reconciles again with nothing changed; a shutdown with 500 keys queued takes none of
//! them and cancels the running reconciles; finalizers are added, compared and swapped,
//! and removed after the cleanup, which runs once per deletion even while the cache lags.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
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
use kube_informer::lease::LeaseConfig;
use kube_informer::{
    Action, CancellationToken, Controller, ControllerClient, Delivery, FactoryDefaults,
    FinalizerError, FinalizerEvent, InformerFactory, ObjectKey, ReconcileRequest, Scope,
    WorkingSet, finalizer, handler_fn, retry_with_backoff,
};
use kube_testenv::TestEnv;
use serde_json::json;
use tests::{create_all, eventually, http_get, labelled, name, test_namespace, within};
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

/// Counts a reconcile that was dropped before it finished (one that finishes forgets it).
struct EndsByDrop(Arc<Mutex<usize>>);

impl Drop for EndsByDrop {
    fn drop(&mut self) {
        *self.0.lock().unwrap() += 1;
    }
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
    let controller = Controller::new("sources", primary_informer)
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
        (
            move |request: ReconcileRequest<ConfigMap>, _: Arc<()>| {
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
        ),
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
        Controller::new("shutdown", informer)
            .workers(2)
            .shutdown_timeout(Duration::from_secs(60))
            .run(
                (
                    move |request: ReconcileRequest<ConfigMap>, _: Arc<()>| {
                        record.lock().unwrap().push(request.key().to_string());
                        let cancelled = EndsByDrop(ended.clone());
                        async move {
                            // A reconcile that waits on something slow; the controller's
                            // stop drops it there.
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            std::mem::forget(cancelled);
                            Ok::<_, std::io::Error>(Action::done())
                        }
                    },
                    retry_with_backoff(),
                    Arc::new(()),
                ),
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
        "the running reconciles ended because they were cancelled, before the deadline"
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_serves_probes_and_metrics_and_stops_its_tasks() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "ctrl-manager").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    create_all(
        &api,
        (0..3).map(|i| labelled(&format!("cm-{i}"), &[])).collect(),
    )
    .await;
    let newest_created = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|cm| cm.metadata.resource_version.as_deref()?.parse::<i64>().ok())
        .max()
        .unwrap();
    let loopback = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    // A client of the library's own, whose requests the REST client metrics count.
    let client = kube_informer::ClusterSource::default()
        .kubeconfig(env.kubeconfig_path())
        .client()
        .await
        .unwrap();
    let mut manager = kube_informer::Manager::new(client)
        .probe_address(loopback)
        .metrics_address(loopback)
        .shutdown_timeout(Duration::from_secs(30));
    let controller = manager.controller::<ConfigMap>("managed", Scope::namespace(&namespace));
    let reconciled = Arc::new(Mutex::new(0usize));
    let count = reconciled.clone();
    let reconcile = move |_: ReconcileRequest<ConfigMap>, _: Arc<()>| {
        *count.lock().unwrap() += 1;
        async { Ok::<_, std::io::Error>(Action::done()) }
    };
    manager.add_controller(controller, (reconcile, retry_with_backoff(), Arc::new(())));
    let stopped_by_cancel = Arc::new(Mutex::new(false));
    let stopped = stopped_by_cancel.clone();
    manager.add("waiter", move |cancel: CancellationToken| async move {
        cancel.cancelled().await;
        *stopped.lock().unwrap() = true;
        Ok::<_, std::io::Error>(())
    });
    let bound = manager.bind().await.unwrap();
    let (probes, metrics) = (
        bound.probe_address().unwrap(),
        bound.metrics_address().unwrap(),
    );
    assert_eq!(
        probes.ip(),
        std::net::Ipv4Addr::LOCALHOST,
        "loopback by default"
    );
    let cancel = CancellationToken::new();
    let run = tokio::spawn(bound.run(cancel.clone()));

    assert_eq!(http_get(probes, "/healthz").await.0, 200);
    tests::eventually_some("ready once the caches synced", || async {
        (http_get(probes, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    eventually("three reconciles", || *reconciled.lock().unwrap() == 3).await;
    let (status, body) = http_get(metrics, "/metrics").await;
    assert_eq!(status, 200);
    for line in [
        r#"controller_runtime_reconcile_total{controller="managed",result="success"} 3"#.to_owned(),
        r#"workqueue_adds_total{name="managed"} 3"#.to_owned(),
        format!(
            r#"informer_objects{{resource="configmaps",namespace="{namespace}",label_selector="",field_selector=""}} 3"#
        ),
        r#"controller_runtime_max_concurrent_reconciles{controller="managed"} 1"#.to_owned(),
        r#"controller_own_write_waits_total{controller="managed"} 0"#.to_owned(),
        r#"controller_own_write_timeouts_total{controller="managed"} 0"#.to_owned(),
        r#"controller_own_write_wait_seconds_count{controller="managed"} 0"#.to_owned(),
        format!(
            r#"informer_handler_waiting{{resource="configmaps",namespace="{namespace}",label_selector="",field_selector="",handler="managed"}} 0"#
        ),
        format!(
            r#"informer_handler_delivered_total{{resource="configmaps",namespace="{namespace}",label_selector="",field_selector="",handler="managed"}} 3"#
        ),
        format!(
            r#"informer_handler_coalesced_total{{resource="configmaps",namespace="{namespace}",label_selector="",field_selector="",handler="managed"}} 0"#
        ),
        format!(
            r#"informer_handler_processing_seconds_count{{resource="configmaps",namespace="{namespace}",label_selector="",field_selector="",handler="managed"}} 3"#
        ),
    ] {
        assert!(body.contains(&line), "{line} in:\n{body}");
    }
    let informer_metric = |name: &str| -> i64 {
        let series = format!(
            r#"{name}{{resource="configmaps",namespace="{namespace}",label_selector="",field_selector=""}} "#
        );
        let line = body
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .unwrap_or_else(|| panic!("{series} in:\n{body}"));
        line.parse().unwrap()
    };
    // The cache has synced at least to the newest object's version (bookmarks move it on).
    assert!(informer_metric("informer_last_sync_resource_version") >= newest_created);
    assert_eq!(
        informer_metric("informer_lists_total"),
        1,
        "one list so far"
    );
    assert!(informer_metric("informer_watch_restarts_total") >= 0);
    // Each reconcile read its object once. Listed objects are not in the cache's working
    // set, and an object read once is not kept there.
    assert_eq!(
        informer_metric("informer_working_set_misses_total"),
        3,
        "one decoding read per reconcile"
    );
    assert_eq!(informer_metric("informer_working_set_hits_total"), 0);
    assert_eq!(informer_metric("informer_working_set_objects"), 0);
    assert_eq!(
        http_get(metrics, "/healthz").await.0,
        404,
        "probes only on the probe address"
    );
    assert_eq!(http_get(probes, "/nothing").await.0, 404);

    // client-go's informer metrics, under its names and labels: a watch event processed.
    let created = api
        .create(&PostParams::default(), &labelled("watched", &[]))
        .await
        .unwrap();
    let created_version: i64 = created.metadata.resource_version.unwrap().parse().unwrap();
    eventually("the watched object reconciled", || {
        *reconciled.lock().unwrap() == 4
    })
    .await;
    let (_, body) = http_get(metrics, "/metrics").await;
    let upstream = |name: &str| -> f64 {
        let labels = r#",group="",version="v1",resource="configmaps"} "#;
        let line = body
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{name=\"")) && l.contains(labels))
            .unwrap_or_else(|| panic!("{name} in:\n{body}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(upstream("informer_queued_items"), 0.0);
    #[allow(clippy::cast_precision_loss)]
    let created_version = created_version as f64;
    assert!(upstream("informer_store_resource_version") >= created_version);
    assert!(upstream("informer_processing_latency_seconds_count") >= 1.0);
    // client-go's REST client metrics: the informer's list, under its names and labels.
    let host = env.apiserver_addr().to_string();
    let rest = |series: String| -> f64 {
        let line = body
            .lines()
            .find(|l| l.starts_with(&series))
            .unwrap_or_else(|| panic!("{series} in:\n{body}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(
        rest(format!(
            r#"rest_client_requests_total{{code="200",host="{host}",method="GET"}}"#
        )) >= 1.0
    );
    assert!(
        rest(format!(
            r#"rest_client_request_duration_seconds_count{{host="{host}",verb="GET"}}"#
        )) >= 1.0
    );

    cancel.cancel();
    within("the manager to stop", run).await.unwrap().unwrap();
    assert!(
        *stopped_by_cancel.lock().unwrap(),
        "its tasks were cancelled"
    );
    assert!(
        tokio::net::TcpStream::connect(probes).await.is_err(),
        "the endpoints are closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_task_stops_the_manager_with_its_error() {
    let env = TestEnv::shared().await;
    let client = env.client().await.unwrap();
    let mut manager = kube_informer::Manager::new(client)
        .probe_address(None)
        .metrics_address(None);
    let cancelled = Arc::new(Mutex::new(false));
    let flag = cancelled.clone();
    manager.add("patient", move |cancel: CancellationToken| async move {
        cancel.cancelled().await;
        *flag.lock().unwrap() = true;
        Ok::<_, std::io::Error>(())
    });
    manager.add("broken", |_| async {
        Err::<(), _>(std::io::Error::other("the backend refused"))
    });
    let result = within(
        "the manager to stop",
        manager.bind().await.unwrap().run(CancellationToken::new()),
    )
    .await;
    match result {
        Err(kube_informer::ManagerError::Task { task, source }) => {
            assert_eq!(task, "broken");
            assert_eq!(source.to_string(), "the backend refused");
        }
        other => panic!("expected the broken task's error, got {other:?}"),
    }
    assert!(*cancelled.lock().unwrap(), "the other task was cancelled");
}

/// A manager that runs its tasks while it holds the Lease `lease` (4 s, renewed within
/// 2 s, tried every 500 ms), serving probes on `probes`, with the ConfigMap informer of
/// `namespace`.
fn leading_manager(
    client: kube_client::Client,
    namespace: &str,
    lease: &str,
    identity: &str,
    probes: Option<std::net::SocketAddr>,
) -> (
    kube_informer::Manager,
    kube_informer::InformerHandle<ConfigMap>,
) {
    let timing = kube_informer::leader_election::LeaderElectionConfig::new(
        LeaseConfig::new(lease)
            .in_namespace(namespace)
            .with_identity(identity)
            .timing(
                Duration::from_secs(4),
                Duration::from_secs(2),
                Duration::from_millis(500),
            ),
    );
    let manager = kube_informer::Manager::new(client)
        .probe_address(probes)
        .metrics_address(None)
        .leader_election(timing);
    let informer = manager
        .factory()
        .informer::<ConfigMap>(Scope::namespace(namespace));
    (manager, informer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_managers_only_the_leader_reconciles_and_the_standby_takes_over() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "ctrl-leader").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    create_all(&api, vec![labelled("watched", &[])]).await;
    let loopback = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    let reconciles: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let start = |identity: &'static str| {
        let (mut manager, informer) =
            leading_manager(client.clone(), &namespace, "managers", identity, loopback);
        let seen = reconciles.clone();
        let reconcile = move |_: ReconcileRequest<ConfigMap>, _: Arc<()>| {
            seen.lock().unwrap().push(identity);
            async { Ok::<_, std::io::Error>(Action::done()) }
        };
        let controller = Controller::new("leader-only", informer);
        manager.add_controller(controller, (reconcile, retry_with_backoff(), Arc::new(())));
        manager
    };
    let first = start("first").bind().await.unwrap();
    let first_cancel = CancellationToken::new();
    let first_run = tokio::spawn(first.run(first_cancel.clone()));
    eventually("the first to reconcile", || {
        reconciles.lock().unwrap().as_slice() == ["first"]
    })
    .await;
    let second = start("second").bind().await.unwrap();
    let second_probes = second.probe_address().unwrap();
    let second_cancel = CancellationToken::new();
    let second_run = tokio::spawn(second.run(second_cancel.clone()));
    // A standby is ready (its cache is warm) but does not reconcile.
    tests::eventually_some("the standby ready", || async {
        (http_get(second_probes, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(http_get(second_probes, "/healthz").await.0, 200);
    api.patch(
        "watched",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "v": "2" } })),
    )
    .await
    .unwrap();
    eventually("the leader to reconcile the change", || {
        reconciles.lock().unwrap().len() == 2
    })
    .await;
    assert_eq!(reconciles.lock().unwrap().as_slice(), ["first", "first"]);

    // A graceful stop releases the lease: the standby leads and reconciles at once.
    first_cancel.cancel();
    within("the first to stop", first_run)
        .await
        .unwrap()
        .unwrap();
    eventually("the second to reconcile", || {
        reconciles.lock().unwrap().last() == Some(&"second")
    })
    .await;
    second_cancel.cancel();
    within("the second to stop", second_run)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leading_manager_cut_off_stops_reconciling_before_the_standby_acquires() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_informer::ManagerError;
    use std::time::SystemTime;

    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "ctrl-fence").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    create_all(&api, vec![labelled("periodic", &[])]).await;
    let proxy = within(
        "the fault proxy",
        kube_testenv::FaultProxy::for_apiserver(env),
    )
    .await
    .unwrap();
    // Every reconcile, by manager, with the wall-clock time (to compare with the Lease's
    // acquireTime, which the apiserver stores in microseconds).
    let reconciles: Arc<Mutex<Vec<(&'static str, SystemTime)>>> = Arc::default();
    let start = |identity: &'static str, client: kube_client::Client| {
        let (mut manager, informer) = leading_manager(client, &namespace, "fenced", identity, None);
        let seen = reconciles.clone();
        // Work that keeps going while leading: a requeue every 50 ms.
        let reconcile = move |_: ReconcileRequest<ConfigMap>, _: Arc<()>| {
            seen.lock().unwrap().push((identity, SystemTime::now()));
            async { Ok::<_, std::io::Error>(Action::requeue_after(Duration::from_millis(50))) }
        };
        let controller = Controller::new("periodic", informer);
        manager.add_controller(controller, (reconcile, retry_with_backoff(), Arc::new(())));
        manager
    };
    let by = |identity: &str| {
        reconciles
            .lock()
            .unwrap()
            .iter()
            .filter(|(who, _)| *who == identity)
            .map(|(_, at)| *at)
            .collect::<Vec<_>>()
    };

    let through_proxy = env.client_via(&proxy).await.unwrap();
    let leader = start("leader", through_proxy).bind().await.unwrap();
    let leader_run = tokio::spawn(leader.run(CancellationToken::new()));
    eventually("the leader to reconcile", || by("leader").len() >= 3).await;
    let standby = start("standby", client.clone()).bind().await.unwrap();
    let standby_cancel = CancellationToken::new();
    let standby_run = tokio::spawn(standby.run(standby_cancel.clone()));

    proxy.cut().await.unwrap();
    let lost = within("the cut-off leader to stop", leader_run)
        .await
        .unwrap();
    assert!(
        matches!(lost, Err(ManagerError::LeaderElection(_))),
        "{lost:?}"
    );
    eventually("the standby to reconcile", || !by("standby").is_empty()).await;
    let leases: Api<Lease> = Api::namespaced(client, &namespace);
    let lease = leases.get("fenced").await.unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some("standby"));
    let acquired = SystemTime::from(lease.acquire_time.unwrap().0);
    let last_by_leader = *by("leader").last().unwrap();
    assert!(
        last_by_leader < acquired,
        "the old leader reconciled {:?} after the standby acquired the lease",
        last_by_leader.duration_since(acquired).unwrap_or_default()
    );
    standby_cancel.cancel();
    within("the standby to stop", standby_run)
        .await
        .unwrap()
        .unwrap();
    proxy.restore().await.unwrap();
}

/// The finalizer the finalizer tests hold.
const CLEANUP: &str = "example.com/cleanup";

fn holds_finalizer(cm: &ConfigMap) -> bool {
    cm.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == CLEANUP)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalizer_is_added_before_apply_and_removed_after_cleanup() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "ctrl-finalizer").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let factory = InformerFactory::new(client.clone());
    let informer = factory.informer::<ConfigMap>(Scope::namespace(&namespace));
    let events: Arc<Mutex<Vec<(String, &'static str)>>> = Arc::default();
    let seen = events.clone();
    let reconcile = move |request: ReconcileRequest<ConfigMap>, client: Arc<ControllerClient>| {
        let seen = seen.clone();
        async move {
            let ReconcileRequest::Present(cm) = request else {
                return Ok(Action::done());
            };
            finalizer(&client, CLEANUP, cm, |event| async move {
                let (cm, step) = match &event {
                    FinalizerEvent::Apply(cm) => (cm, "apply"),
                    FinalizerEvent::Cleanup(cm) => (cm, "cleanup"),
                };
                seen.lock().unwrap().push((name(&**cm), step));
                Ok::<_, std::io::Error>(Action::done())
            })
            .await
        }
    };
    let cancel = CancellationToken::new();
    factory.start(&cancel);
    let controller = Controller::new("finalized", informer);
    let writer = Arc::new(controller.client(client.clone()));
    let run =
        tokio::spawn(controller.run((reconcile, retry_with_backoff(), writer), cancel.clone()));
    create_all(&api, vec![labelled("guarded", &[])]).await;
    eventually("an apply of guarded", || {
        events
            .lock()
            .unwrap()
            .iter()
            .any(|(n, step)| n == "guarded" && *step == "apply")
    })
    .await;
    let stored = api.get("guarded").await.unwrap();
    assert!(
        holds_finalizer(&stored),
        "the finalizer is on the server: {:?}",
        stored.metadata.finalizers
    );

    api.delete("guarded", &Default::default()).await.unwrap();
    tests::eventually_some("guarded gone after its cleanup", || async {
        api.get_opt("guarded")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let steps: Vec<&'static str> = events
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, _)| n == "guarded")
        .map(|(_, step)| *step)
        .collect();
    assert_eq!(steps.first(), Some(&"apply"));
    assert_eq!(steps.last(), Some(&"cleanup"), "{steps:?}");
    assert_eq!(
        steps.iter().filter(|s| **s == "cleanup").count(),
        1,
        "one cleanup: {steps:?}"
    );
    cancel.cancel();
    within("the controller to stop", run)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalizer_write_is_a_compare_and_swap_and_a_vanished_object_is_no_error() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "ctrl-finalizer-cas").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let factory = InformerFactory::new(client.clone());
    let writer = Controller::new(
        "cas",
        factory.informer::<ConfigMap>(Scope::namespace(&namespace)),
    )
    .client(client);
    let created = api
        .create(&PostParams::default(), &labelled("contended", &[]))
        .await
        .unwrap();
    // Someone else changes it after it was cached.
    let patch = json!({ "data": { "changed": "by another writer" } });
    api.patch("contended", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let applied = Arc::new(Mutex::new(false));
    let ran = applied.clone();
    let result = finalizer(&writer, CLEANUP, Arc::new(created), |_| async move {
        *ran.lock().unwrap() = true;
        Ok::<_, std::io::Error>(Action::done())
    })
    .await;
    match result {
        Err(FinalizerError::Add { source, .. }) => {
            assert_eq!(source.status_code(), Some(409), "{source}")
        }
        other => panic!("a stale object's finalizer write conflicts: {other:?}"),
    }
    assert!(
        !*applied.lock().unwrap(),
        "nothing applied after the conflict"
    );
    assert!(!holds_finalizer(&api.get("contended").await.unwrap()));

    // An object being deleted whose deletion completed before the finalizer came off.
    let mut gone = labelled("already-gone", &[]);
    gone.metadata.namespace = Some(namespace.clone());
    gone.metadata.finalizers = Some(vec![CLEANUP.to_owned()]);
    gone.metadata.resource_version = Some("1".to_owned());
    gone.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    let cleaned = Arc::new(Mutex::new(false));
    let ran = cleaned.clone();
    let action = finalizer(&writer, CLEANUP, Arc::new(gone), |event| async move {
        *ran.lock().unwrap() = matches!(event, FinalizerEvent::Cleanup(_));
        Ok::<_, std::io::Error>(Action::done())
    })
    .await
    .expect("a finalizer removed from an object that is gone is no error");
    assert_eq!(action, Action::done());
    assert!(*cleaned.lock().unwrap(), "the cleanup ran");
}

/// The label by which a child Secret names its parent ConfigMap.
const PARENT: &str = "example.com/parent";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalizer_s_cleanup_runs_once_though_the_cache_lags_behind_its_removal() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "ctrl-cleanup-once").await;
    let parents: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let children: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let scope = Scope::namespace(&namespace);
    // The parents' cache reads through Toxiproxy, which delays it later on; the children's
    // does not, so a child's deletion reaches the controller well before the parent's
    // own changes do.
    let proxy = within(
        "the fault proxy",
        kube_testenv::FaultProxy::for_apiserver(env),
    )
    .await
    .unwrap();
    let slow = InformerFactory::new(env.client_via(&proxy).await.unwrap());
    let fast = InformerFactory::new(client.clone());
    let controller = Controller::new(
        "cleanup-once",
        slow.informer::<ConfigMap>(scope.clone().labels("role=parent")),
    )
    .watches(fast.informer::<Secret>(scope), |child: &Secret| {
        let ns = child.metadata.namespace.as_deref();
        child
            .metadata
            .labels
            .iter()
            .flatten()
            .filter(|(k, _)| *k == PARENT)
            .map(|(_, parent)| ObjectKey::new(ns, parent))
            .collect()
    });
    let writer = Arc::new(controller.client(client.clone()));
    let cleanups = Arc::new(AtomicUsize::new(0));
    let reconciled_gone = Arc::new(AtomicBool::new(false));
    let (counted, gone) = (cleanups.clone(), reconciled_gone.clone());
    let reconcile = move |request: ReconcileRequest<ConfigMap>, client: Arc<ControllerClient>| {
        let (counted, gone) = (counted.clone(), gone.clone());
        async move {
            let ReconcileRequest::Present(cm) = request else {
                gone.store(true, Ordering::SeqCst);
                return Ok(Action::done());
            };
            let parent = name(&*cm);
            let child_key =
                ObjectKey::new(cm.metadata.namespace.as_deref(), &format!("{parent}-child"));
            let writer = client.clone();
            finalizer(&client, CLEANUP, cm, |event| async move {
                let client = writer;
                match event {
                    FinalizerEvent::Apply(cm) => {
                        let mut child = Secret::default();
                        child.metadata.name = Some(child_key.name().to_owned());
                        child.metadata.namespace = cm.metadata.namespace.clone();
                        child.metadata.labels = Some([(PARENT.to_owned(), parent)].into());
                        match client.create(&child).await {
                            Err(error) if error.status_code() != Some(409) => return Err(error),
                            _ => {}
                        }
                    }
                    FinalizerEvent::Cleanup(_) => {
                        counted.fetch_add(1, Ordering::SeqCst);
                        match client.delete::<Secret>(&child_key).await {
                            Err(error) if error.status_code() != Some(404) => return Err(error),
                            _ => {}
                        }
                    }
                }
                Ok(Action::done())
            })
            .await
        }
    };
    let cancel = CancellationToken::new();
    slow.start(&cancel);
    fast.start(&cancel);
    let run =
        tokio::spawn(controller.run((reconcile, retry_with_backoff(), writer), cancel.clone()));
    create_all(&parents, vec![labelled("guarded", &[("role", "parent")])]).await;
    tests::eventually_some("the child of guarded", || async {
        children.get_opt("guarded-child").await.unwrap().map(drop)
    })
    .await;

    // From here the parent's changes reach the cache 2 s late: the cleanup's deletion of
    // the child brings a reconcile of the parent long before the cache has seen its
    // finalizer go.
    proxy
        .latency(Duration::from_secs(2), Duration::ZERO)
        .await
        .unwrap();
    parents
        .delete("guarded", &Default::default())
        .await
        .unwrap();
    tests::eventually_some("guarded gone after its cleanup", || async {
        parents
            .get_opt("guarded")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    eventually("the deletion of guarded reconciled", || {
        reconciled_gone.load(Ordering::SeqCst)
    })
    .await;
    assert_eq!(
        cleanups.load(Ordering::SeqCst),
        1,
        "the cleanup ran once for one deletion"
    );
    proxy.clear().await.unwrap();
    cancel.cancel();
    within("the controller to stop", run)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn factory_defaults_apply_to_every_informer_unless_one_overrides_them() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "factory-defaults").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    // Applied server-side, so the server records who manages which field.
    let stored = api
        .patch(
            "kept",
            &PatchParams::apply("factory-defaults-test"),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": "kept" }, "data": { "owned": "by the test" },
            })),
        )
        .await
        .unwrap();
    assert!(
        stored.metadata.managed_fields.is_some(),
        "the server records managed fields"
    );
    let defaults = FactoryDefaults::default()
        .resync_period(Duration::from_secs(1))
        .working_set(WorkingSet::budget(2 << 20))
        .strip_managed_fields();
    let factory = InformerFactory::with_defaults(client.clone(), defaults);
    let stripped = factory.informer::<ConfigMap>(Scope::namespace(&namespace));
    // Another scope, customised: its own transform replaces the default one.
    let labelled_scope = Scope::namespace(&namespace).labels("absent!=true");
    let own = factory.informer_with::<ConfigMap>(labelled_scope, |builder| {
        builder.transform(|cm: ConfigMap| cm)
    });
    let resyncs = Arc::new(Mutex::new(0usize));
    let seen = resyncs.clone();
    stripped
        .add_handler(handler_fn::<ConfigMap>().on_update(move |_, _, delivery| {
            if delivery == Delivery::Resync {
                *seen.lock().unwrap() += 1;
            }
        }))
        .unwrap();
    let cancel = CancellationToken::new();
    factory.start(&cancel);
    within("the caches to sync", factory.wait_synced())
        .await
        .unwrap();
    assert_eq!(stripped.store().working_set().budget_bytes, 2 << 20);
    let key = format!("{namespace}/kept");
    let cached = stripped.store().get_by_key(&key).unwrap();
    assert_eq!(cached.metadata.managed_fields, None, "stripped by default");
    let customised = own.store().get_by_key(&key).unwrap();
    assert!(
        customised.metadata.managed_fields.is_some(),
        "an informer's own transform replaces the default"
    );
    eventually("a resync from the default period", || {
        *resyncs.lock().unwrap() >= 2
    })
    .await;
    cancel.cancel();
    factory.shutdown().await;
}
