//! The controller run as the client-go tutorials' key loop (an informer it owns, a
//! `sync(key)` function, five retries), on an in-memory ListWatch under paused time:
//! retries are counted and their spacing measured.

mod support;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use kube_informer::{
    Controller, Error, ErrorAction, Failure, ObjectKey, SharedInformer, error::Verb, retry_up_to,
    sync_by_key,
};
use support::*;
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

#[tokio::test(start_paused = true)]
async fn a_failing_key_is_retried_five_times_with_growing_delays_then_dropped() {
    let (dropped_tx, mut dropped) = mpsc::unbounded_channel();
    let controller = Controller::owning(
        "failing",
        SharedInformer::builder(fake_with("default", &["broken"]))
            .paged_list()
            .build(),
    );
    let stats = controller.stats();
    let attempts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let cancel = CancellationToken::new();
    let recorded = attempts.clone();
    let sync = move |_key: ObjectKey, _: Arc<()>| {
        recorded.lock().unwrap().push(Instant::now());
        async { Err::<(), _>(std::io::Error::other("backend unavailable")) }
    };
    let five_retries = retry_up_to(5);
    let policy = move |failure: &Failure<'_, std::io::Error>, ctx: &()| {
        let action = five_retries(failure, ctx);
        if action == ErrorAction::GiveUp {
            let _ = dropped_tx.send((failure.key.clone(), failure.error.to_string()));
        }
        action
    };
    let run =
        tokio::spawn(controller.run((sync_by_key(sync), policy, Arc::new(())), cancel.clone()));

    let (key, error) = dropped.recv().await.expect("the key is dropped");
    assert_eq!(key.as_str(), "default/broken");
    assert_eq!(error, "backend unavailable");

    let attempts = attempts.lock().unwrap().clone();
    assert_eq!(attempts.len(), 6, "one sync and five retries");
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
    // The default limiter's exponential part: 5 ms doubling per failure.
    let expected: Vec<Duration> = [5, 10, 20, 40, 80].map(Duration::from_millis).to_vec();
    assert_eq!(gaps, expected);
    assert_eq!(stats.read().failed, 6);
    assert_eq!(stats.read().dropped, 1, "dropped and reported once");

    // Nothing more happens to the dropped key.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(dropped.try_recv().is_err());
    assert_eq!(stats.read().failed, 6);

    cancel.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_panicking_sync_does_not_kill_its_worker() {
    let controller = Controller::owning(
        "panicky",
        SharedInformer::builder(fake_with("default", &["panics", "fine-1", "fine-2"]))
            .paged_list()
            .build(),
    )
    .workers(1);
    let stats = controller.stats();
    let (synced_tx, mut synced) = mpsc::unbounded_channel::<String>();
    let cancel = CancellationToken::new();
    let sync = move |key: ObjectKey, _: Arc<()>| {
        let synced_tx = synced_tx.clone();
        async move {
            if key.name() == "panics" {
                panic!("sync of {key} panicked");
            }
            let _ = synced_tx.send(key.name().to_owned());
            Ok::<(), std::convert::Infallible>(())
        }
    };
    let run = tokio::spawn(controller.run(
        (sync_by_key(sync), retry_up_to(1), Arc::new(())),
        cancel.clone(),
    ));

    let mut names = vec![synced.recv().await.unwrap(), synced.recv().await.unwrap()];
    names.sort();
    assert_eq!(
        names,
        ["fine-1", "fine-2"],
        "the one worker went on after the panic"
    );
    // The panicking key is retried once, then dropped; both attempts are counted.
    while stats.read().dropped == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(stats.read().panicked, 2);
    assert_eq!(stats.read().synced, 2);

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
    let fake = fake_with("default", &["a"]);
    // More refusals than retries fit into the grace period.
    for _ in 0..20 {
        fake.fail_next_list(forbidden());
    }
    let controller = Controller::owning(
        "denied",
        SharedInformer::builder(fake.clone()).paged_list().build(),
    )
    .startup_grace(Duration::from_secs(10));
    let started = Instant::now();
    let callers = CancellationToken::new();
    let sync = |_key: ObjectKey, _: Arc<()>| async { Ok::<(), std::io::Error>(()) };
    let result = controller
        .run(
            (sync_by_key(sync), retry_up_to(5), Arc::new(())),
            callers.clone(),
        )
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
    let fake = fake_with("default", &["a"]);
    fake.fail_next_list(forbidden());
    let controller = Controller::owning(
        "late-rbac",
        SharedInformer::builder(fake).paged_list().build(),
    );
    let (synced_tx, mut synced) = mpsc::unbounded_channel::<String>();
    let cancel = CancellationToken::new();
    let sync = move |key: ObjectKey, _: Arc<()>| {
        let _ = synced_tx.send(key.to_string());
        async { Ok::<(), std::io::Error>(()) }
    };
    let run = spawn_key_loop(controller, sync, &cancel);
    assert_eq!(synced.recv().await.unwrap(), "default/a");
    cancel.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn updates_and_deletes_become_keys_and_success_forgets() {
    let fake = fake_with("default", &["one"]);
    let controller = Controller::owning(
        "keys",
        SharedInformer::builder(fake.clone()).paged_list().build(),
    );
    let store = controller.store();
    let stats = controller.stats();
    let (seen_tx, mut seen) = mpsc::unbounded_channel::<(String, bool)>();
    let cancel = CancellationToken::new();
    let sync = move |key: ObjectKey, _: Arc<()>| {
        let _ = seen_tx.send((key.to_string(), store.get_by_key(&key).is_some()));
        async { Ok::<(), std::io::Error>(()) }
    };
    let run = spawn_key_loop(controller, sync, &cancel);

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
        (stats.read().synced, stats.read().failed),
        (3, 0),
        "every sync succeeded, so no key waits for a retry"
    );

    cancel.cancel();
    run.await.unwrap().unwrap();
}

/// Runs `controller` in a task as the tutorials' key loop: `sync(key)`, five retries.
fn spawn_key_loop<F, Fut>(
    controller: Controller<k8s_openapi::api::core::v1::ConfigMap>,
    sync: F,
    cancel: &CancellationToken,
) -> tokio::task::JoinHandle<Result<(), Error>>
where
    F: Fn(ObjectKey, Arc<()>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), std::io::Error>> + Send + 'static,
{
    tokio::spawn(controller.run(
        (sync_by_key(sync), retry_up_to(5), Arc::new(())),
        cancel.clone(),
    ))
}
