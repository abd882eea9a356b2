//! The controller author's toolkit on a real API server: Kubernetes Events folded into
//! series, filtered when an object floods them, and dropped (counted) when RBAC forbids
//! them, never in the publisher's way; status conditions and server-side apply.

use std::{sync::Arc, time::Duration};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::{
    api::{
        core::v1::{ConfigMap, Service, ServicePort, ServiceSpec, ServiceStatus},
        events::v1::Event as EventsV1,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube_client::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams, PostParams},
};
use kube_informer::{
    Action, CancellationToken, ClientError, Controller, ControllerClient, InformerFactory,
    ReconcileRequest, Scope,
    apply::{ApplyError, Conflicts, FieldConflict, install_crd},
    conditions::{ConditionStatus, NewCondition, find_condition, set_condition},
    events::{Event, Recorder, RecorderConfig, Reporter},
    retry_with_backoff,
};
use kube_testenv::TestEnv;
use tests::{config_map, eventually, test_namespace, within};

const CONTROLLER: &str = "example.com/toolkit";

/// The client of a controller named `field_manager` (its field manager), whose informer
/// never starts: its writes go to the server, as a reconcile's do.
fn controller_client(client: &Client, namespace: &str, field_manager: &str) -> ControllerClient {
    let factory = InformerFactory::new(client.clone());
    Controller::new(
        field_manager,
        factory.informer::<ConfigMap>(Scope::namespace(namespace)),
    )
    .client(client.clone())
}

/// A ConfigMap created in `namespace`, as the server returns it (with its uid).
async fn subject(client: &Client, namespace: &str, name: &str) -> ConfigMap {
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &config_map(name, &[]))
        .await
        .expect("the ConfigMap is created")
}

/// The Events about the object named `name` in `namespace`.
async fn events_about(client: &Client, namespace: &str, name: &str) -> Vec<EventsV1> {
    Api::<EventsV1>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .expect("Events are listed")
        .items
}

/// How many occurrences an Event stands for.
fn occurrences(event: &EventsV1) -> i64 {
    event.series.as_ref().map_or(1, |s| i64::from(s.count))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolkit_200_identical_warnings_become_one_event_counting_200() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "events-series").await;
    let object = subject(&client, &namespace, "flapping").await;
    let recorder = Recorder::new(
        client.clone(),
        Reporter::new(CONTROLLER).instance("replica-0"),
    );
    for _ in 0..200 {
        recorder.publish_for(
            Event::warning("SyncFailed", "Sync").note("the backend refused the route"),
            &object,
        );
        tokio::task::yield_now().await;
    }
    within(
        "the recorder to write what it buffered",
        recorder.shutdown(),
    )
    .await;

    let events = events_about(&client, &namespace, "flapping").await;
    assert!(
        (1..=3).contains(&events.len()),
        "a few Event objects, not one per warning: {}",
        events.len()
    );
    assert_eq!(events.iter().map(occurrences).sum::<i64>(), 200);
    let event = &events[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reason.as_deref(), Some("SyncFailed"));
    assert_eq!(event.action.as_deref(), Some("Sync"));
    assert_eq!(event.reporting_controller.as_deref(), Some(CONTROLLER));
    assert_eq!(event.reporting_instance.as_deref(), Some("replica-0"));
    assert_eq!(
        event.regarding.as_ref().and_then(|r| r.uid.as_deref()),
        object.metadata.uid.as_deref()
    );
    let stats = recorder.stats();
    assert_eq!(stats.published, 200);
    assert_eq!(stats.dropped(), 0, "{stats:?}");
    assert_eq!(stats.created, events.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolkit_an_object_flooding_new_events_is_cut_off_by_the_spam_filter() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "events-spam").await;
    let object = subject(&client, &namespace, "noisy").await;
    let config = RecorderConfig::default().spam_filter(5, Duration::from_secs(3600));
    let recorder = Recorder::with_config(client.clone(), Reporter::new(CONTROLLER), config);
    let quiet = subject(&client, &namespace, "quiet").await;
    for i in 0..12 {
        recorder.publish_for(
            Event::normal("Progress", "Sync").note(format!("step {i}")),
            &object,
        );
    }
    recorder.publish_for(Event::normal("Synced", "Sync"), &quiet);
    within(
        "the recorder to write what it buffered",
        recorder.shutdown(),
    )
    .await;

    assert_eq!(events_about(&client, &namespace, "noisy").await.len(), 5);
    assert_eq!(events_about(&client, &namespace, "quiet").await.len(), 1);
    let stats = recorder.stats();
    assert_eq!((stats.created, stats.dropped_spam), (6, 7), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolkit_events_forbidden_by_rbac_are_dropped_and_counted() {
    let env = TestEnv::shared().await;
    let (admin, namespace) = test_namespace(env, "events-rbac").await;
    let object = subject(&admin, &namespace, "guarded").await;
    let stranger = env
        .client_as(&format!("system:serviceaccount:{namespace}:nobody"))
        .await
        .unwrap();
    let recorder = Recorder::new(stranger, Reporter::new(CONTROLLER));
    // `publish` is not async: a reconcile that publishes cannot wait on the API server.
    for i in 0..50 {
        recorder.publish_for(
            Event::warning("Refused", "Register").note(format!("host {i} is not allowed")),
            &object,
        );
    }
    eventually("every forbidden Event to be counted as dropped", || {
        recorder.stats().dropped() == 50
    })
    .await;
    let stats = recorder.stats();
    assert_eq!((stats.published, stats.created), (50, 0), "{stats:?}");
    assert!(
        stats.dropped_failed >= 1,
        "the writes were refused: {stats:?}"
    );
    assert!(events_about(&admin, &namespace, "guarded").await.is_empty());
    within("the recorder to stop", recorder.shutdown()).await;
    let before = recorder.stats().dropped_failed;
    recorder.publish_for(Event::normal("Late", "Sync"), &object);
    assert_eq!(
        recorder.stats().dropped_failed,
        before + 1,
        "published after shutdown"
    );
}

/// `GET /metrics` on `addr`: the body.
async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = "GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolkit_a_managers_recorder_publishes_from_reconciles_and_flushes_at_shutdown() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "events-manager").await;
    for name in ["one", "two", "three"] {
        subject(&client, &namespace, name).await;
    }
    let loopback = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    let mut manager = kube_informer::Manager::new(client.clone())
        .probe_address(None)
        .metrics_address(loopback);
    let recorder = manager.recorder(CONTROLLER);
    let controller = manager.controller::<ConfigMap>("events", Scope::namespace(&namespace));
    let reconcile = |request: ReconcileRequest<ConfigMap>, recorder: Arc<Recorder>| async move {
        if let ReconcileRequest::Present(object) = request {
            recorder.publish_for(Event::normal("Reconciled", "Reconcile"), &*object);
        }
        Ok::<_, std::io::Error>(Action::done())
    };
    manager.add_controller(
        controller,
        (reconcile, retry_with_backoff(), Arc::new(recorder.clone())),
    );
    let bound = manager.bind().await.unwrap();
    let metrics = bound.metrics_address().unwrap();
    let cancel = CancellationToken::new();
    let run = tokio::spawn(bound.run(cancel.clone()));

    eventually("three Events published", || recorder.stats().published == 3).await;
    let body = scrape(metrics).await;
    let line = format!(r#"events_published_total{{controller="{CONTROLLER}"}} 3"#);
    assert!(body.contains(&line), "{line} in:\n{body}");
    assert!(
        body.contains(&format!(
            r#"events_dropped_total{{controller="{CONTROLLER}",reason="write_failed"}} 0"#
        )),
        "{body}"
    );
    cancel.cancel();
    within("the manager to stop", run).await.unwrap().unwrap();
    for name in ["one", "two", "three"] {
        let events = events_about(&client, &namespace, name).await;
        assert_eq!(events.len(), 1, "{name}: {events:?}");
        assert_eq!(events[0].reason.as_deref(), Some("Reconciled"));
    }
    assert_eq!(recorder.stats().dropped(), 0);
}

/// A ClusterIP Service named `name` in `namespace`, created: its status has conditions
/// (`metav1.Condition`) and no controller in the test control plane writes them.
async fn service(client: &Client, namespace: &str, name: &str) -> Service {
    let service = Service {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                port: 80,
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    Api::<Service>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &service)
        .await
        .expect("the Service is created")
}

/// The status a reconcile of `current` would apply: its conditions with `Ready` set.
fn ready_status(current: &Service, status: ConditionStatus, message: &str) -> (Service, bool) {
    let mut conditions = current
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let changed = set_condition(
        &mut conditions,
        NewCondition::new("Ready", status, "Checked", message).observed_from(current),
    );
    let desired = Service {
        metadata: ObjectMeta {
            name: current.metadata.name.clone(),
            namespace: current.metadata.namespace.clone(),
            ..ObjectMeta::default()
        },
        status: Some(ServiceStatus {
            conditions: Some(conditions),
            ..ServiceStatus::default()
        }),
        ..Service::default()
    };
    (desired, changed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolkit_a_status_applied_again_unchanged_keeps_its_version_and_transition_time() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "apply-status").await;
    let created = service(&client, &namespace, "web").await;
    let applier = controller_client(&client, &namespace, CONTROLLER);

    let (desired, changed) = ready_status(&created, ConditionStatus::True, "serving");
    assert!(changed, "a new condition");
    let first = applier
        .apply_status(&desired, Conflicts::Refuse)
        .await
        .unwrap();
    let ready = |s: &Service| {
        find_condition(
            s.status.as_ref().unwrap().conditions.as_deref().unwrap(),
            "Ready",
        )
        .cloned()
        .unwrap()
    };
    assert_eq!(ready(&first).status, "True");
    assert_eq!(
        ready(&first).observed_generation,
        created.metadata.generation
    );

    // The next reconcile reads the applied object and finds nothing to change.
    let (desired, changed) = ready_status(&first, ConditionStatus::True, "serving");
    assert!(!changed, "the same status again is no change");
    let second = applier
        .apply_status(&desired, Conflicts::Refuse)
        .await
        .unwrap();
    assert_eq!(
        second.metadata.resource_version, first.metadata.resource_version,
        "an apply that changes nothing writes nothing"
    );
    assert_eq!(
        ready(&second).last_transition_time,
        ready(&first).last_transition_time
    );

    // A new status moves the transition time (the API keeps whole seconds).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (desired, changed) = ready_status(&second, ConditionStatus::False, "backend gone");
    assert!(changed);
    let third = applier
        .apply_status(&desired, Conflicts::Refuse)
        .await
        .unwrap();
    assert_ne!(
        third.metadata.resource_version,
        second.metadata.resource_version
    );
    assert!(ready(&third).last_transition_time.0 > ready(&second).last_transition_time.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolkit_an_apply_over_another_managers_field_is_a_conflict_naming_it() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "apply-conflict").await;
    let settings = |mode: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some("settings".to_owned()),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        data: Some([("mode".to_owned(), mode.to_owned())].into()),
        ..ConfigMap::default()
    };
    let other = controller_client(&client, &namespace, "someone-else");
    other
        .apply(&settings("slow"), Conflicts::Refuse)
        .await
        .unwrap();

    let ours = controller_client(&client, &namespace, CONTROLLER);
    let err = ours
        .apply(&settings("fast"), Conflicts::Refuse)
        .await
        .unwrap_err();
    match &err {
        ClientError::Apply(ApplyError::Conflict { manager, conflicts }) => {
            assert_eq!(manager, CONTROLLER);
            assert_eq!(
                conflicts,
                &[FieldConflict {
                    manager: "someone-else".to_owned(),
                    field: ".data.mode".to_owned(),
                }]
            );
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(err.to_string().contains("someone-else"), "{err}");
    let unchanged = Api::<ConfigMap>::namespaced(client.clone(), &namespace)
        .get("settings")
        .await
        .unwrap();
    assert_eq!(
        unchanged.data.unwrap()["mode"],
        "slow",
        "nothing was written"
    );

    let taken = ours
        .apply(&settings("fast"), Conflicts::TakeOwnership)
        .await
        .unwrap();
    assert_eq!(taken.data.unwrap()["mode"], "fast");
}

/// A CRD of kind `kind` named `<plural>.<group>`, its spec free-form.
fn crd(group: &str, plural: &str, kind: &str) -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("{plural}.{group}") },
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": { "plural": plural, "kind": kind },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } }
                } }
            }]
        }
    }))
    .expect("a valid CRD")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolkit_an_installed_crd_is_established_and_serves_its_kind_when_install_returns() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "install-crd").await;
    const INSTALLER: &str = "example.com/installer";
    let group = "install.toolkit.kube-informer.dev";
    let installed = within(
        "the CRD to install",
        install_crd(
            &client,
            INSTALLER,
            &crd(group, "gizmos", "Gizmo"),
            Duration::from_secs(60),
        ),
    )
    .await
    .expect("the CRD is established");
    assert!(
        installed
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")),
        "returned as established"
    );
    // Served at once: no retry, no wait.
    let resource = ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: "Gizmo".into(),
        plural: "gizmos".into(),
    };
    let gizmos: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
    let gizmo = DynamicObject::new("first", &resource).data(serde_json::json!({ "spec": {} }));
    gizmos
        .create(&PostParams::default(), &gizmo)
        .await
        .expect("a Gizmo is created right after the install");
    // Installing again changes nothing and returns at once.
    within(
        "the CRD to install again",
        install_crd(
            &client,
            INSTALLER,
            &crd(group, "gizmos", "Gizmo"),
            Duration::from_secs(60),
        ),
    )
    .await
    .expect("installed again");

    // A second CRD claiming the same kind in the group is never accepted.
    let clash = install_crd(
        &client,
        INSTALLER,
        &crd(group, "gadgets", "Gizmo"),
        Duration::from_secs(3),
    )
    .await;
    match clash {
        Err(ApplyError::NotEstablished {
            name, conditions, ..
        }) => {
            assert_eq!(name, format!("gadgets.{group}"));
            assert!(conditions.contains("NamesAccepted=False"), "{conditions}");
        }
        other => panic!("a kind clash is reported: {other:?}"),
    }
}
