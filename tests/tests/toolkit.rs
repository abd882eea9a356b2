//! The controller author's toolkit on a real API server: Kubernetes Events folded into
//! series, filtered when an object floods them, and dropped (counted) when RBAC forbids
//! them, never in the publisher's way.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::{core::v1::ConfigMap, events::v1::Event as EventsV1};
use kube_client::{
    Api, Client,
    api::{ListParams, PostParams},
};
use kube_informer::{
    Action, CancellationToken, ReconcileRequest, Scope,
    events::{Event, Recorder, RecorderConfig, Reporter},
    retry_with_backoff,
};
use kube_testenv::TestEnv;
use tests::{config_map, eventually, test_namespace, within};

const CONTROLLER: &str = "example.com/toolkit";

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
    let reconcile = |request: ReconcileRequest<ConfigMap>, recorder: Arc<Recorder>, _| async move {
        if let ReconcileRequest::Present(object) = request {
            recorder.publish_for(Event::normal("Reconciled", "Reconcile"), &*object);
        }
        Ok::<_, std::io::Error>(Action::done())
    };
    manager.add_controller(
        controller,
        reconcile,
        retry_with_backoff(),
        Arc::new(recorder.clone()),
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
