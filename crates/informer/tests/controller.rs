//! The controller's worker loop and error rule, on an in-memory ListWatch
//! under paused time: retries are counted and their spacing measured.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube_informer::{
    Controller, ControllerConfig, Error, ObjectKey, SharedInformer, Verb, testing::FakeListWatch,
};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

type Fake = FakeListWatch<ConfigMap>;

fn fake_with(names: &[&str]) -> Fake {
    let fake = Fake::new("configmaps");
    for name in names {
        fake.add(Fake::object(Some("default"), name));
    }
    fake
}

#[tokio::test(start_paused = true)]
async fn a_failing_key_is_retried_five_times_with_growing_delays_then_dropped() {
    let (dropped_tx, mut dropped) = mpsc::unbounded_channel();
    let controller = Controller::new(
        SharedInformer::builder(fake_with(&["broken"]))
            .paged_list()
            .build(),
        ControllerConfig::named("failing").on_dropped(move |key, error| {
            let _ = dropped_tx.send((key.clone(), error.to_owned()));
        }),
    );
    let stats = controller.stats();
    let attempts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let cancel = CancellationToken::new();
    let recorded = attempts.clone();
    let run = tokio::spawn(controller.run(cancel.clone(), move |_key: ObjectKey| {
        recorded.lock().unwrap().push(Instant::now());
        async { Err::<(), _>("backend unavailable") }
    }));

    let (key, error) = dropped.recv().await.expect("the key is dropped");
    assert_eq!(key.as_str(), "default/broken");
    assert_eq!(error, "backend unavailable");

    let attempts = attempts.lock().unwrap().clone();
    assert_eq!(attempts.len(), 6, "one sync and five retries");
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
    // The default limiter's exponential part: 5 ms doubling per failure.
    let expected: Vec<Duration> = [5, 10, 20, 40, 80].map(Duration::from_millis).to_vec();
    assert_eq!(gaps, expected);
    assert_eq!(stats.failed(), 6);
    assert_eq!(stats.dropped(), 1, "dropped and reported once");

    // Nothing more happens to the dropped key.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(dropped.try_recv().is_err());
    assert_eq!(stats.failed(), 6);

    cancel.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_panicking_sync_does_not_kill_its_worker() {
    let controller = Controller::new(
        SharedInformer::builder(fake_with(&["panics", "fine-1", "fine-2"]))
            .paged_list()
            .build(),
        ControllerConfig::named("panicky")
            .workers(1)
            .max_requeues(Some(1)),
    );
    let stats = controller.stats();
    let (synced_tx, mut synced) = mpsc::unbounded_channel::<String>();
    let cancel = CancellationToken::new();
    let run = tokio::spawn(controller.run(cancel.clone(), move |key: ObjectKey| {
        let synced_tx = synced_tx.clone();
        async move {
            if key.name() == "panics" {
                panic!("sync of {key} panicked");
            }
            let _ = synced_tx.send(key.name().to_owned());
            Ok::<(), std::convert::Infallible>(())
        }
    }));

    let mut names = vec![synced.recv().await.unwrap(), synced.recv().await.unwrap()];
    names.sort();
    assert_eq!(
        names,
        ["fine-1", "fine-2"],
        "the one worker went on after the panic"
    );
    // The panicking key is retried once, then dropped; both attempts are counted.
    while stats.dropped() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(stats.panicked(), 2);
    assert_eq!(stats.synced(), 2);

    cancel.cancel();
    run.await.unwrap().unwrap();
}

fn forbidden() -> Error {
    Error::Forbidden {
        resource: "configmaps".into(),
        verb: Verb::List,
        namespace: Some("default".into()),
        message: "configmaps is forbidden: User \"system:serviceaccount:default:nobody\" cannot list resource \"configmaps\"".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_first_list_still_forbidden_after_the_grace_fails_the_run() {
    let fake = fake_with(&["a"]);
    // More refusals than retries fit into the grace period.
    for _ in 0..20 {
        fake.fail_next_list(forbidden());
    }
    let controller = Controller::new(
        SharedInformer::builder(fake.clone()).paged_list().build(),
        ControllerConfig::named("denied").startup_grace(Duration::from_secs(10)),
    );
    let started = Instant::now();
    let callers = CancellationToken::new();
    let result = controller
        .run(callers.clone(), |_key: ObjectKey| async {
            Ok::<(), String>(())
        })
        .await;
    assert!(
        !callers.is_cancelled(),
        "the controller stops its own tasks, not its caller's"
    );
    let error = result.expect_err("a lasting 403 on the first list ends the run");
    assert!(error.is_forbidden(), "{error}");
    assert!(
        error.to_string().contains("configmaps"),
        "names the resource: {error}"
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(10),
        "gave up when the grace ran out"
    );
    assert!(fake.calls().lists > 1, "retried within the grace");
}

#[tokio::test(start_paused = true)]
async fn a_forbidden_first_list_that_clears_within_the_grace_is_survived() {
    let fake = fake_with(&["a"]);
    fake.fail_next_list(forbidden());
    let controller = Controller::new(
        SharedInformer::builder(fake).paged_list().build(),
        ControllerConfig::named("late-rbac"),
    );
    let (synced_tx, mut synced) = mpsc::unbounded_channel::<String>();
    let cancel = CancellationToken::new();
    let run = tokio::spawn(controller.run(cancel.clone(), move |key: ObjectKey| {
        let _ = synced_tx.send(key.to_string());
        async { Ok::<(), String>(()) }
    }));
    assert_eq!(synced.recv().await.unwrap(), "default/a");
    cancel.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn updates_and_deletes_become_keys_and_success_forgets() {
    let fake = fake_with(&["one"]);
    let controller = Controller::new(
        SharedInformer::builder(fake.clone()).paged_list().build(),
        ControllerConfig::named("keys"),
    );
    let store = controller.store();
    let queue = controller.queue();
    let (seen_tx, mut seen) = mpsc::unbounded_channel::<(String, bool)>();
    let cancel = CancellationToken::new();
    let run = tokio::spawn(controller.run(cancel.clone(), move |key: ObjectKey| {
        let _ = seen_tx.send((key.to_string(), store.get_by_key(&key).is_some()));
        async { Ok::<(), String>(()) }
    }));

    assert_eq!(seen.recv().await.unwrap(), ("default/one".to_owned(), true));
    let mut changed = Fake::object(Some("default"), "one");
    changed.data = Some([("k".to_owned(), "v".to_owned())].into());
    fake.update(changed);
    assert_eq!(seen.recv().await.unwrap(), ("default/one".to_owned(), true));
    fake.delete(Some("default"), "one");
    assert_eq!(
        seen.recv().await.unwrap(),
        ("default/one".to_owned(), false),
        "absent = deleted"
    );
    assert_eq!(
        queue.num_requeues(&ObjectKey::new(Some("default"), "one")),
        0
    );

    cancel.cancel();
    run.await.unwrap().unwrap();
}
