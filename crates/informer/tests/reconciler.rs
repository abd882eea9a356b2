//! The reconciling controller on in-memory informers under paused time: requeue-after,
//! error policies, predicates, deleted objects with their last state, reconcile timeouts,
//! and a shutdown that takes no new key.

mod support;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube_informer::{
    Action, CancellationToken, Controller, ErrorAction, InformerHandle, ObjectKey, Predicate,
    ReconcileError, ReconcileRequest, Reconciler, RunningInformer, SharedInformer, retry_up_to,
    retry_with_backoff, sync_by_key, testing::FakeListWatch,
};
use support::*;
use tokio::{sync::mpsc, time::Instant};

fn informer<K>(fake: FakeListWatch<K>) -> RunningInformer<K>
where
    K: kube_core::Resource
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    FakeListWatch<K>: kube_informer::list_watch::ListWatch<K>,
{
    SharedInformer::builder(fake)
        .paged_list()
        .build()
        .spawn(CancellationToken::new())
}

/// What a reconcile was called with: the key, whether the object was present, and when.
#[derive(Debug, Clone)]
struct Call {
    key: String,
    present: bool,
    at: Instant,
}

type Calls = Arc<Mutex<Vec<Call>>>;

fn record(calls: &Calls, request: &ReconcileRequest<ConfigMap>) {
    calls.lock().unwrap().push(Call {
        key: request.key().to_string(),
        present: matches!(request, ReconcileRequest::Present(_)),
        at: Instant::now(),
    });
}

fn handle(running: &RunningInformer<ConfigMap>) -> InformerHandle<ConfigMap> {
    running.handle()
}

#[tokio::test(start_paused = true)]
async fn requeue_after_reconciles_again_after_its_delay() {
    let fake = Fake::new("configmaps");
    fake.add(cm("a"));
    let running = informer(fake.clone());
    let calls: Calls = Arc::default();
    let cancel = CancellationToken::new();
    let seen = calls.clone();
    let run = tokio::spawn(Controller::new("requeue", handle(&running)).run(
        (
            move |request, _: Arc<()>| {
                record(&seen, &request);
                async { Ok::<_, std::io::Error>(Action::requeue_after(Duration::from_secs(30))) }
            },
            retry_with_backoff(),
            Arc::new(()),
        ),
        cancel.clone(),
    ));
    until("three reconciles", || calls.lock().unwrap().len() == 3).await;
    let calls = calls.lock().unwrap().clone();
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert_eq!(gaps, [Duration::from_secs(30); 2], "{calls:?}");
    assert!(
        calls.iter().all(|c| c.present && c.key == "ns/a"),
        "{calls:?}"
    );
    cancel.cancel();
    run.await.unwrap().unwrap();
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_error_policy_decides_backoff_requeue_after_or_give_up() {
    let fake = Fake::new("configmaps");
    for name in ["backoff", "later", "hopeless"] {
        fake.add(cm(name));
    }
    let running = informer(fake.clone());
    let calls: Calls = Arc::default();
    let cancel = CancellationToken::new();
    let seen = calls.clone();
    // A requeue after a delay resets the key's backoff (and its retry count), so the
    // policy counts `later`'s failures itself.
    let later_failures = AtomicUsize::new(0);
    let policy = move |failure: &kube_informer::Failure<'_, std::io::Error>, _: &()| match failure
        .key
        .as_str()
    {
        "ns/backoff" if failure.retries < 3 => ErrorAction::Backoff,
        "ns/later" if later_failures.fetch_add(1, Ordering::SeqCst) == 0 => {
            ErrorAction::RequeueAfter(Duration::from_secs(60))
        }
        _ => ErrorAction::GiveUp,
    };
    let run = tokio::spawn(Controller::new("policy", handle(&running)).run(
        (
            move |request, _: Arc<()>| {
                record(&seen, &request);
                async { Err::<Action, _>(std::io::Error::other("backend down")) }
            },
            policy,
            Arc::new(()),
        ),
        cancel.clone(),
    ));
    // backoff: 1 + 3 retries, then given up; later: 1 + 1 after 60 s, then given up;
    // hopeless: given up at once.
    until("every attempt", || calls.lock().unwrap().len() == 4 + 2 + 1).await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let calls = calls.lock().unwrap().clone();
    let count = |key: &str| calls.iter().filter(|c| c.key == key).count();
    assert_eq!(count("ns/backoff"), 4, "{calls:?}");
    assert_eq!(count("ns/later"), 2, "{calls:?}");
    assert_eq!(count("ns/hopeless"), 1, "{calls:?}");
    let later: Vec<_> = calls.iter().filter(|c| c.key == "ns/later").collect();
    assert_eq!(later[1].at - later[0].at, Duration::from_secs(60));
    cancel.cancel();
    run.await.unwrap().unwrap();
    running.stop().await;
}

/// A reconciler on its own type: it keeps its calls, fails `ns/broken` and gives up on it
/// after `give_up_after` retries.
struct Flaky {
    calls: Calls,
    give_up_after: u32,
}

impl Reconciler<ConfigMap> for Flaky {
    type Error = std::io::Error;

    async fn reconcile(
        &self,
        request: ReconcileRequest<ConfigMap>,
    ) -> Result<Action, std::io::Error> {
        record(&self.calls, &request);
        match request.key().as_str() {
            "ns/broken" => Err(std::io::Error::other("backend down")),
            _ => Ok(Action::done()),
        }
    }

    fn error_policy(&self, failure: &kube_informer::Failure<'_, std::io::Error>) -> ErrorAction {
        if failure.retries < self.give_up_after {
            ErrorAction::Backoff
        } else {
            ErrorAction::GiveUp
        }
    }
}

/// Only the reconcile: the error policy is the default one.
struct AlwaysFails(Calls);

impl Reconciler<ConfigMap> for AlwaysFails {
    type Error = std::io::Error;

    async fn reconcile(
        &self,
        request: ReconcileRequest<ConfigMap>,
    ) -> Result<Action, std::io::Error> {
        record(&self.0, &request);
        Err(std::io::Error::other("never works"))
    }
}

#[tokio::test(start_paused = true)]
async fn a_reconciler_type_is_the_reconcile_its_error_policy_and_its_context() {
    let fake = Fake::new("configmaps");
    for name in ["fine", "broken"] {
        fake.add(cm(name));
    }
    let running = informer(fake.clone());
    let calls: Calls = Arc::default();
    let cancel = CancellationToken::new();
    let flaky = Flaky {
        calls: calls.clone(),
        give_up_after: 2,
    };
    let run = tokio::spawn(Controller::new("typed", handle(&running)).run(flaky, cancel.clone()));
    until("every attempt", || calls.lock().unwrap().len() == 1 + 3).await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let count = |key: &str| {
        calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.key == key)
            .count()
    };
    assert_eq!(count("ns/fine"), 1);
    assert_eq!(
        count("ns/broken"),
        3,
        "1 + 2 retries, then its own policy gave up"
    );
    cancel.cancel();
    run.await.unwrap().unwrap();

    // The default policy backs off for as long as the reconcile fails.
    let retried: Calls = Arc::default();
    let cancel = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("default-policy", handle(&running))
            .run(AlwaysFails(retried.clone()), cancel.clone()),
    );
    until("ten attempts at each key", || {
        let retried = retried.lock().unwrap();
        ["ns/fine", "ns/broken"]
            .iter()
            .all(|key| retried.iter().filter(|c| c.key == *key).count() >= 10)
    })
    .await;
    cancel.cancel();
    run.await.unwrap().unwrap();
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_predicate_skips_updates_it_rejects_and_a_deletion_carries_the_last_state() {
    let fake = Fake::new("configmaps");
    fake.add(cm("a"));
    let running = informer(fake.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let run = tokio::spawn(
        Controller::new("predicate", handle(&running))
            .predicate(Predicate::labels_changed())
            .run(
                (
                    move |request: ReconcileRequest<ConfigMap>, _: Arc<()>| {
                        let seen = match &request {
                            ReconcileRequest::Present(o) => (true, o.metadata.labels.clone()),
                            ReconcileRequest::Deleted { last_known, .. } => (
                                false,
                                last_known.as_ref().and_then(|o| o.metadata.labels.clone()),
                            ),
                        };
                        let _ = tx.send(seen);
                        async { Ok::<_, std::io::Error>(Action::done()) }
                    },
                    retry_with_backoff(),
                    Arc::new(()),
                ),
                cancel.clone(),
            ),
    );
    assert_eq!(rx.recv().await.unwrap(), (true, None), "the initial add");
    // Data only: no reconcile. Then a label: one.
    let mut data_only = cm("a");
    data_only.data = Some([("k".to_owned(), "v".to_owned())].into());
    fake.update(data_only.clone());
    let mut labelled = data_only;
    let labels = Some([("app".to_owned(), "web".to_owned())].into());
    labelled.metadata.labels = labels.clone();
    fake.update(labelled);
    assert_eq!(rx.recv().await.unwrap(), (true, labels.clone()));
    fake.delete(Some("ns"), "a");
    assert_eq!(
        rx.recv().await.unwrap(),
        (false, labels),
        "deleted, with its last state"
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(rx.try_recv().is_err(), "nothing for the data-only update");
    cancel.cancel();
    run.await.unwrap().unwrap();
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn owned_children_and_watched_objects_enqueue_their_primaries() {
    let primaries = Fake::new("configmaps");
    primaries.add(cm("owner"));
    primaries.add(cm("named"));
    let secrets = FakeListWatch::<Secret>::new("secrets");
    let running = informer(primaries.clone());
    let secrets_running = informer(secrets.clone());
    let calls: Calls = Arc::default();
    let cancel = CancellationToken::new();
    let seen = calls.clone();
    let run = tokio::spawn(
        Controller::new("sources", handle(&running))
            .owns(secrets_running.handle())
            .watches(secrets_running.handle(), |secret: &Secret| {
                secret
                    .metadata
                    .annotations
                    .iter()
                    .flatten()
                    .filter(|(k, _)| *k == "for")
                    .map(|(_, v)| ObjectKey::new(Some("ns"), v))
                    .collect()
            })
            .run(
                (
                    move |request, _: Arc<()>| {
                        record(&seen, &request);
                        async { Ok::<_, std::io::Error>(Action::done()) }
                    },
                    retry_with_backoff(),
                    Arc::new(()),
                ),
                cancel.clone(),
            ),
    );
    until("the initial reconciles", || {
        calls.lock().unwrap().len() == 2
    })
    .await;
    let mut child = FakeListWatch::<Secret>::object(Some("ns"), "child");
    child.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: "u1".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    secrets.add(child);
    until("the owner reconciled", || {
        calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.key == "ns/owner")
            .count()
            == 2
    })
    .await;
    let mut pointer = FakeListWatch::<Secret>::object(Some("ns"), "pointer");
    pointer.metadata.annotations = Some([("for".to_owned(), "named".to_owned())].into());
    secrets.add(pointer);
    until("the named primary reconciled", || {
        calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.key == "ns/named")
            .count()
            == 2
    })
    .await;
    // Not a controller reference: nothing.
    let mut loose = FakeListWatch::<Secret>::object(Some("ns"), "loose");
    loose.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "named".into(),
        uid: "u2".into(),
        controller: None,
        ..Default::default()
    }]);
    secrets.add(loose);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        calls.lock().unwrap().len(),
        4,
        "{:?}",
        calls.lock().unwrap()
    );
    cancel.cancel();
    run.await.unwrap().unwrap();
    running.stop().await;
    secrets_running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_reconcile_past_its_timeout_is_cancelled_and_reported() {
    let fake = Fake::new("configmaps");
    fake.add(cm("slow"));
    let running = informer(fake.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let dropped = Arc::new(AtomicUsize::new(0));
    let cancel = CancellationToken::new();
    let drops = dropped.clone();
    let run = tokio::spawn(
        Controller::new("timeout", handle(&running))
            .reconcile_timeout(Duration::from_secs(5))
            .run(
                (move |_, _: Arc<()>| {
                    let guard = CountsDrop(drops.clone());
                    async move {
                        let _guard = guard;
                        std::future::pending::<()>().await;
                        Ok::<_, std::io::Error>(Action::done())
                    }
                },
                move |failure: &kube_informer::Failure<'_, std::io::Error>, _: &()| {
                    let timed_out = matches!(failure.error, ReconcileError::TimedOut(d) if *d == Duration::from_secs(5));
                    let _ = tx.send(timed_out);
                    ErrorAction::GiveUp
                },
                Arc::new(())),
                cancel.clone(),
            ),
    );
    assert!(rx.recv().await.unwrap(), "the policy saw a timeout of 5 s");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the reconcile was cancelled (dropped) at its timeout"
    );
    cancel.cancel();
    run.await.unwrap().unwrap();
    running.stop().await;
}

/// Counts the drops of what holds it: a reconcile's future, dropped when cancelled.
struct CountsDrop(Arc<AtomicUsize>);

impl Drop for CountsDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_takes_no_new_key_and_cancels_the_running_reconciles() {
    let fake = Fake::new("configmaps");
    for i in 0..500 {
        fake.add(cm(&format!("o{i:03}")));
    }
    let running = informer(fake.clone());
    let calls: Calls = Arc::default();
    let finished = Arc::new(AtomicUsize::new(0));
    let ended = Arc::new(AtomicUsize::new(0));
    let cancel = CancellationToken::new();
    let (seen, done, drops) = (calls.clone(), finished.clone(), ended.clone());
    let run = tokio::spawn(
        Controller::new("shutdown", handle(&running))
            .workers(2)
            .shutdown_timeout(Duration::from_secs(10))
            .run(
                (
                    move |request, _: Arc<()>| {
                        record(&seen, &request);
                        let (done, guard) = (done.clone(), CountsDrop(drops.clone()));
                        async move {
                            let _guard = guard;
                            // A long reconcile, cancelled at an `.await`.
                            tokio::time::sleep(Duration::from_secs(600)).await;
                            done.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, std::io::Error>(Action::done())
                        }
                    },
                    retry_with_backoff(),
                    Arc::new(()),
                ),
                cancel.clone(),
            ),
    );
    until("both workers busy", || calls.lock().unwrap().len() == 2).await;
    let started = Instant::now();
    cancel.cancel();
    run.await.unwrap().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "within the deadline"
    );
    assert_eq!(calls.lock().unwrap().len(), 2, "no queued key was taken");
    assert_eq!(
        (
            ended.load(Ordering::SeqCst),
            finished.load(Ordering::SeqCst)
        ),
        (2, 0),
        "the running ones were cancelled and ended"
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_key_controller_takes_no_new_key_once_cancelled() {
    let fake = Fake::new("configmaps");
    for i in 0..500 {
        fake.add(cm(&format!("o{i:03}")));
    }
    let controller = Controller::owning(
        "keys",
        SharedInformer::builder(fake.clone()).paged_list().build(),
    )
    .shutdown_timeout(Duration::from_secs(10));
    let synced = Arc::new(Mutex::new(0usize));
    let cancel = CancellationToken::new();
    let count = synced.clone();
    let sync = move |_key: ObjectKey, _: Arc<()>| {
        *count.lock().unwrap() += 1;
        async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<(), std::io::Error>(())
        }
    };
    let run = tokio::spawn(controller.run(
        (sync_by_key(sync), retry_up_to(5), Arc::new(())),
        cancel.clone(),
    ));
    until("the first sync", || *synced.lock().unwrap() == 1).await;
    cancel.cancel();
    tokio::time::timeout(PATIENCE, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        *synced.lock().unwrap(),
        1,
        "no queued key was synced after the cancel"
    );
}

#[tokio::test(start_paused = true)]
async fn reconciles_are_counted_under_controller_runtime_names() {
    use prometheus_client::{encoding::text::encode, registry::Registry};

    let fake = Fake::new("configmaps");
    for name in ["fine", "again", "broken"] {
        fake.add(cm(name));
    }
    let running = informer(fake.clone());
    let mut registry = Registry::default();
    let metrics = kube_informer::controller::ControllerMetrics::new(&mut registry);
    let calls: Calls = Arc::default();
    let cancel = CancellationToken::new();
    let seen = calls.clone();
    let run = tokio::spawn(
        Controller::new("counted", handle(&running))
            .workers(3)
            .reconcile_metrics(metrics)
            .run(
                (
                    move |request: ReconcileRequest<ConfigMap>, _: Arc<()>| {
                        record(&seen, &request);
                        let key = request.key();
                        async move {
                            match key.as_str() {
                                "ns/fine" => Ok(Action::done()),
                                "ns/again" => Ok(Action::requeue_after(Duration::from_secs(3600))),
                                _ => Err(std::io::Error::other("no")),
                            }
                        }
                    },
                    |_: &kube_informer::Failure<'_, std::io::Error>, _: &()| ErrorAction::GiveUp,
                    Arc::new(()),
                ),
                cancel.clone(),
            ),
    );
    until("three reconciles", || calls.lock().unwrap().len() == 3).await;
    cancel.cancel();
    run.await.unwrap().unwrap();
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    for line in [
        r#"controller_runtime_reconcile_total{controller="counted",result="success"} 1"#,
        r#"controller_runtime_reconcile_total{controller="counted",result="requeue_after"} 1"#,
        r#"controller_runtime_reconcile_total{controller="counted",result="error"} 1"#,
        r#"controller_runtime_reconcile_errors_total{controller="counted"} 1"#,
        r#"controller_runtime_terminal_reconcile_errors_total{controller="counted"} 1"#,
        r#"controller_runtime_reconcile_time_seconds_count{controller="counted"} 3"#,
        r#"controller_runtime_active_workers{controller="counted"} 0"#,
        r#"controller_runtime_max_concurrent_reconciles{controller="counted"} 3"#,
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_live_change_is_reconciled_before_the_replayed_initial_list() {
    let fake = Fake::new("configmaps");
    for i in 0..500 {
        fake.add(cm(&format!("o{i:03}")));
    }
    let running = informer(fake.clone());
    let calls: Calls = Arc::default();
    let cancel = CancellationToken::new();
    let seen = calls.clone();
    let run = tokio::spawn(Controller::new("priority", handle(&running)).run(
        (
            move |request, _: Arc<()>| {
                record(&seen, &request);
                async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, std::io::Error>(Action::done())
                }
            },
            retry_with_backoff(),
            Arc::new(()),
        ),
        cancel.clone(),
    ));
    until("the first reconcile", || calls.lock().unwrap().len() == 1).await;
    let mut edited = cm("o400");
    edited.data = Some([("edited".to_owned(), "yes".to_owned())].into());
    fake.update(edited);
    until("the edit reconciled", || {
        calls.lock().unwrap().iter().any(|c| c.key == "ns/o400")
    })
    .await;
    let position = calls
        .lock()
        .unwrap()
        .iter()
        .position(|c| c.key == "ns/o400")
        .unwrap();
    assert!(
        position <= 2,
        "the edit waited behind {position} replayed keys"
    );
    cancel.cancel();
    run.await.unwrap().unwrap();
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn keys_from_a_stream_are_reconciled_present_or_deleted() {
    let fake = Fake::new("configmaps");
    fake.add(cm("cached"));
    let running = informer(fake.clone());
    let calls: Calls = Arc::default();
    let cancel = CancellationToken::new();
    let seen = calls.clone();
    let (keys, received) = mpsc::unbounded_channel::<ObjectKey>();
    let stream = futures::stream::unfold(received, |mut rx| async move {
        rx.recv().await.map(|key| (key, rx))
    });
    let run = tokio::spawn(
        Controller::new("triggered", handle(&running))
            .reconcile_on(stream)
            .run(
                (
                    move |request, _: Arc<()>| {
                        record(&seen, &request);
                        async { Ok::<_, std::io::Error>(Action::done()) }
                    },
                    retry_with_backoff(),
                    Arc::new(()),
                ),
                cancel.clone(),
            ),
    );
    until("the initial reconcile", || calls.lock().unwrap().len() == 1).await;
    // A key of an object that never existed (say, one an external system still holds),
    // and one that is cached.
    keys.send(ObjectKey::new(Some("ns"), "vanished")).unwrap();
    until("the stream's key", || calls.lock().unwrap().len() == 2).await;
    keys.send(ObjectKey::new(Some("ns"), "cached")).unwrap();
    until("the cached key again", || calls.lock().unwrap().len() == 3).await;
    let calls = calls.lock().unwrap().clone();
    let seen: Vec<(&str, bool)> = calls.iter().map(|c| (c.key.as_str(), c.present)).collect();
    assert_eq!(
        seen,
        [
            ("ns/cached", true),
            ("ns/vanished", false),
            ("ns/cached", true)
        ]
    );
    cancel.cancel();
    run.await.unwrap().unwrap();
    // The forwarder stopped with the controller: the stream's receiver is gone.
    until("the stream dropped", || keys.is_closed()).await;
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_periodic_scan_reconciles_its_keys_after_the_sync_and_every_period() {
    let fake = Fake::new("configmaps");
    fake.add(cm("live"));
    let running = informer(fake.clone());
    let calls: Calls = Arc::default();
    let scans: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let cancel = CancellationToken::new();
    let seen = calls.clone();
    let scanned = scans.clone();
    let store = running.store();
    // An external system that still holds `ghost`, whose object is gone.
    let scan = move || {
        let (scanned, store) = (scanned.clone(), store.clone());
        async move {
            assert!(!store.is_empty(), "scanned only once the cache has synced");
            scanned.lock().unwrap().push(Instant::now());
            vec![ObjectKey::new(Some("ns"), "ghost")]
        }
    };
    let run = tokio::spawn(
        Controller::new("scanned", handle(&running))
            .reconcile_every(Duration::from_secs(60), scan)
            .run(
                (
                    move |request, _: Arc<()>| {
                        record(&seen, &request);
                        async { Ok::<_, std::io::Error>(Action::done()) }
                    },
                    retry_with_backoff(),
                    Arc::new(()),
                ),
                cancel.clone(),
            ),
    );
    let ghosts = |calls: &Calls| -> Vec<Call> {
        let calls = calls.lock().unwrap();
        calls
            .iter()
            .filter(|c| c.key == "ns/ghost")
            .cloned()
            .collect()
    };
    until("three scans", || scans.lock().unwrap().len() == 3).await;
    until("the third scan's key reconciled", || {
        ghosts(&calls).len() == 3
    })
    .await;
    let scans = scans.lock().unwrap().clone();
    let gaps: Vec<Duration> = scans.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps, [Duration::from_secs(60); 2]);
    assert!(
        ghosts(&calls).iter().all(|c| !c.present),
        "a scanned key without an object is reconciled as deleted"
    );
    cancel.cancel();
    run.await.unwrap().unwrap();
    running.stop().await;
}
