//! The informer's promise, a cache that follows the API server, at its edges: handlers
//! added mid-list, panics in user code, versions the server has not reached, watches that
//! never work, a healed start-up error, resync bounds, servers that ignore streaming lists.
//! All on the in-memory `FakeListWatch`, under paused time.

mod support;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube_informer::{
    CancellationToken, Delivery, Error, SharedInformer,
    error::Verb,
    handler_fn,
    informer::DivergenceCheck,
    informer::Repair,
    list_watch::{ListOptions, ListPage, ListStream, ListWatch, WatchOptions, WatchStream},
    testing::{decode_error, status},
};
use support::*;
use tokio::{sync::Semaphore, time::Instant};

/// A fake whose later list pages wait for a permit: the first page is stored, and the
/// rest of the list is held back until the test releases it.
#[derive(Clone)]
struct HeldPages {
    fake: Fake,
    permits: Arc<Semaphore>,
    /// Later pages asked for so far (served or held).
    asked: Arc<AtomicUsize>,
}

impl HeldPages {
    fn new(fake: &Fake, permits: usize) -> Self {
        Self {
            fake: fake.clone(),
            permits: Arc::new(Semaphore::new(permits)),
            asked: Arc::default(),
        }
    }

    async fn hold(&self, options: &ListOptions) {
        if options.continue_token.is_some() {
            self.asked.fetch_add(1, Ordering::SeqCst);
            self.permits.acquire().await.expect("open").forget();
        }
    }
}

impl ListWatch<ConfigMap> for HeldPages {
    fn resource(&self) -> String {
        self.fake.resource()
    }

    async fn list(&self, options: &ListOptions) -> Result<ListPage<ConfigMap>, Error> {
        self.hold(options).await;
        self.fake.list(options).await
    }

    async fn list_stream(&self, options: &ListOptions) -> Result<ListStream<ConfigMap>, Error> {
        self.hold(options).await;
        self.fake.list_stream(options).await
    }

    async fn watch(&self, options: &WatchOptions) -> Result<WatchStream<ConfigMap>, Error> {
        self.fake.watch(options).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_handler_added_while_the_first_list_arrives_gets_every_object() {
    let fake = Fake::new("configmaps");
    for i in 0..1000 {
        fake.add(cm(&format!("o{i:04}")));
    }
    let held = HeldPages::new(&fake, 0);
    let informer = SharedInformer::builder(held.clone())
        .paged_list()
        .page_size(500)
        .build();
    let informer = informer.spawn(CancellationToken::new());
    until("the first page in the store", || {
        informer.store().len() == 500
    })
    .await;

    let seen = Arc::new(AtomicUsize::new(0));
    let initial = Arc::new(AtomicUsize::new(0));
    let (s, i) = (seen.clone(), initial.clone());
    let late = informer
        .add_handler(handler_fn().on_add(move |_: &Arc<ConfigMap>, delivery| {
            s.fetch_add(1, Ordering::SeqCst);
            if delivery == Delivery::InitialList {
                i.fetch_add(1, Ordering::SeqCst);
            }
        }))
        .expect("running");
    held.permits.add_permits(1);
    within("the late handler to sync", late.wait_synced()).await;
    assert_eq!(informer.store().len(), 1000);
    assert_eq!(seen.load(Ordering::SeqCst), 1000, "every object, once");
    assert_eq!(
        initial.load(Ordering::SeqCst),
        1000,
        "all of the initial list"
    );
    informer.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_transform_is_reported_and_the_cache_keeps_following() {
    let fake = Fake::new("configmaps");
    fake.add(cm("a"));
    let armed = Arc::new(AtomicBool::new(true));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let (trigger, log) = (armed.clone(), errors.clone());
    let informer = SharedInformer::builder(fake.clone())
        .paged_list()
        .transform(move |cm: ConfigMap| {
            let bomb = cm.metadata.name.as_deref() == Some("bomb");
            if bomb && trigger.swap(false, Ordering::SeqCst) {
                panic!("transform exploded on bomb");
            }
            cm
        })
        .on_watch_error(move |e| log.lock().unwrap().push(e.to_string()))
        .build()
        .spawn(CancellationToken::new());
    within("the first sync", informer.wait_synced()).await;
    fake.wait_for_calls(|c| c.watches == 1).await;

    fake.add(cm("bomb"));
    until("the panic reported", || !errors.lock().unwrap().is_empty()).await;
    let reported = errors.lock().unwrap()[0].clone();
    assert!(
        reported.contains("panic") && reported.contains("exploded"),
        "{reported}"
    );
    fake.add(cm("after"));
    until("the cache to follow again", || {
        informer.store().contains_key("ns/bomb") && informer.store().contains_key("ns/after")
    })
    .await;
    assert!(fake.calls().lists >= 2, "repaired by a relist");
    informer.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_version_too_large_for_the_server_relists_from_a_consistent_read() {
    let fake = Fake::new("configmaps");
    fake.add(cm("a"));
    let informer = SharedInformer::builder(fake.clone())
        .paged_list()
        .build()
        .spawn(CancellationToken::new());
    within("the first sync", informer.wait_synced()).await;
    fake.wait_for_calls(|c| c.watches == 1).await;
    // A lost event forces a relist from the last version, which a lagging server refuses.
    fake.fail_next_list(Error::from_status(
        status(504, "Timeout", "Too large resource version: 9, current: 3"),
        Verb::List,
        "configmaps",
        Some("ns"),
    ));
    fake.inject(Err(decode_error("configmaps", Verb::Watch)));
    fake.wait_for_calls(|c| c.lists == 3).await;
    let lists = fake.list_requests();
    assert!(
        lists[1]
            .resource_version
            .as_deref()
            .is_some_and(|rv| rv != "0")
    );
    assert_eq!(
        (
            lists[2].resource_version.as_deref(),
            &lists[2].version_match
        ),
        (None, &None),
        "then from resourceVersion \"\": {lists:?}"
    );
    informer.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_is_never_allowed_still_follows_by_relisting() {
    let fake = Fake::new("configmaps");
    fake.add(cm("a"));
    for _ in 0..50 {
        fake.fail_next_watch(Error::from_status(
            status(403, "Forbidden", "cannot watch configmaps"),
            Verb::Watch,
            "configmaps",
            Some("ns"),
        ));
    }
    let informer = SharedInformer::new(fake.clone()).spawn(CancellationToken::new());
    within("the first sync", informer.wait_synced()).await;
    fake.add(cm("b"));
    fake.delete(Some("ns"), "a");
    until("the cache to follow the server by lists", || {
        informer.store().list_keys() == ["ns/b".into()]
    })
    .await;
    assert!(fake.calls().lists >= 2);
    informer.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_start_up_error_that_healed_is_not_reported_later() {
    let fake = Fake::new("configmaps");
    fake.add(cm("a"));
    fake.fail_next_list(Error::from_status(
        status(403, "Forbidden", "not yet"),
        Verb::List,
        "configmaps",
        Some("ns"),
    ));
    let informer = SharedInformer::builder(fake.clone())
        .paged_list()
        .build()
        .spawn(CancellationToken::new());
    within("the sync after the 403", informer.wait_synced()).await;
    for _ in 0..32 {
        let result = informer.wait_synced_or_fatal().await;
        assert!(result.is_ok(), "a healed error came back: {result:?}");
    }
    informer.stop().await;
}

#[tokio::test(start_paused = true)]
async fn resync_periods_below_a_second_are_raised_to_one() {
    let fake = Fake::new("configmaps");
    fake.add(cm("a"));
    let informer = SharedInformer::builder(fake.clone())
        .resync_period(Duration::from_millis(10))
        .build();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let registration = informer
        .add_handler(handler_fn().on_update(move |_, _, _| {
            let _ = tx.send(Instant::now());
        }))
        .expect("an informer that has not run has not stopped");
    let started = Instant::now();
    let informer = informer.spawn(CancellationToken::new());
    within("the handler to sync", registration.wait_synced()).await;
    let first = within("a resync", rx.recv()).await.expect("open");
    let second = within("another resync", rx.recv()).await.expect("open");
    assert!(
        first - started >= Duration::from_secs(1),
        "{:?}",
        first - started
    );
    assert!(
        second - first >= Duration::from_secs(1),
        "{:?}",
        second - first
    );
    informer.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_server_that_ignores_initial_events_is_caught_at_its_first_change() {
    let fake = Fake::new("configmaps");
    fake.set_streaming_lists(false);
    fake.add(cm("a"));
    fake.add(cm("b"));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = errors.clone();
    let informer = SharedInformer::builder(fake.clone())
        .streaming_list()
        .on_watch_error(move |e| log.lock().unwrap().push(e.to_string()))
        .build()
        .spawn(CancellationToken::new());
    fake.wait_for_calls(|c| c.watches == 1).await;
    // The ordinary watch the server opened instead: a new object first, then a change.
    fake.add(cm("c"));
    fake.update(cm("a"));
    until("every object, through a paged list", || {
        let mut keys = informer.store().list_keys();
        keys.sort();
        keys == ["ns/a".into(), "ns/b".into(), "ns/c".into()]
    })
    .await;
    assert!(fake.calls().lists >= 1, "fell back to paged lists");
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors[0].contains("a change arrived before the initial-events-end bookmark"),
        "caught at the change, not after a silence: {errors:?}"
    );
    informer.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_object_that_does_not_decode_keeps_its_last_state_and_the_rest_follows() {
    let fake = Fake::new("configmaps");
    for n in ["a", "b", "c"] {
        fake.add(cm(n));
    }
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = errors.clone();
    let informer = SharedInformer::builder(fake.clone())
        .paged_list()
        .on_watch_error(move |e| log.lock().unwrap().push(e.to_string()))
        .build()
        .spawn(CancellationToken::new());
    within("the first sync", informer.wait_synced()).await;
    fake.wait_for_calls(|c| c.watches == 1).await;
    let last_good = informer.store().get_by_key("ns/b").expect("b cached");

    // b stops decoding; its change arrives on the watch, and on the relist a lost event
    // forces: neither takes b's last good state away nor stops the other objects.
    fake.mark_undecodable("ns/b");
    let mut changed = cm("b");
    changed.data = Some([("v".to_owned(), "2".to_owned())].into());
    fake.update(changed);
    fake.update(cm("a"));
    fake.inject(Err(decode_error("configmaps", Verb::Watch)));
    fake.wait_for_calls(|c| c.lists == 2).await;
    fake.add(cm("d"));
    fake.delete(Some("ns"), "c");
    until("the others to be followed", || {
        let store = informer.store();
        store.contains_key("ns/d") && !store.contains_key("ns/c")
    })
    .await;
    assert_eq!(informer.store().get_by_key("ns/b"), Some(last_good));
    let errors = errors.lock().unwrap().clone();
    let about_b: Vec<&String> = errors.iter().filter(|e| e.contains("ns/b")).collect();
    assert!(
        about_b.iter().any(|e| e.starts_with("watch"))
            && about_b.iter().any(|e| e.starts_with("list")),
        "named on the watch and on the list: {errors:?}"
    );

    // Fixed: its next change is applied.
    fake.mark_decodable("ns/b");
    let fixed = fake.update(cm("b"));
    until("b's fixed state", || {
        informer
            .store()
            .get_by_key("ns/b")
            .is_some_and(|b| b.metadata.resource_version.as_deref() == Some(fixed.as_str()))
    })
    .await;
    informer.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_divergence_check_names_what_the_cache_missed() {
    let fake = Fake::new("configmaps");
    for n in ["a", "b", "c"] {
        fake.add(cm(n));
    }
    let informer = SharedInformer::builder(fake.clone())
        .divergence_check(DivergenceCheck::on_demand())
        .build()
        .spawn(CancellationToken::new());
    within("the first sync", informer.wait_synced()).await;
    fake.wait_for_calls(|c| c.watches == 1).await;
    let clean = informer.check_divergence().await.unwrap().expect("checked");
    assert!(clean.is_empty(), "{clean}");

    // Changes the watch never delivers, as on a proxy that lost them.
    fake.set_broadcast(false);
    let updated = fake.update(cm("a"));
    fake.delete(Some("ns"), "b");
    fake.add(cm("d"));
    let drift = informer.check_divergence().await.unwrap().expect("checked");
    assert_eq!(drift.missing, ["ns/d".into()]);
    assert_eq!(drift.stale, ["ns/b".into()]);
    assert_eq!(drift.outdated.len(), 1);
    assert_eq!(drift.outdated[0].key.as_str(), "ns/a");
    assert_eq!(drift.outdated[0].server, updated);
    let message = drift.to_string();
    assert!(
        message.contains("ns/d") && message.contains("ns/b"),
        "{message}"
    );
    let stats = informer.divergence_stats().expect("configured");
    assert_eq!(
        (stats.checks, stats.drifts, stats.drifted_objects),
        (2, 1, 3)
    );
    // Reported only: the cache is as it was.
    assert!(informer.store().contains_key("ns/b"));
    informer.stop().await;

    let plain = SharedInformer::new(fake.clone()).spawn(CancellationToken::new());
    assert!(matches!(
        plain.check_divergence().await,
        Err(Error::NoDivergenceCheck)
    ));
    plain.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_periodic_divergence_check_repairs_the_cache_by_a_consistent_relist() {
    let fake = Fake::new("configmaps");
    for n in ["a", "b"] {
        fake.add(cm(n));
    }
    let informer = SharedInformer::builder(fake.clone())
        .paged_list()
        .divergence_check(DivergenceCheck::every(Duration::from_secs(60)).repair(Repair::Relist))
        .build()
        .spawn(CancellationToken::new());
    within("the first sync", informer.wait_synced()).await;
    fake.wait_for_calls(|c| c.watches == 1).await;
    fake.set_broadcast(false);
    fake.delete(Some("ns"), "a");
    fake.add(cm("c"));
    until("the drift repaired", || {
        let mut keys = informer.store().list_keys();
        keys.sort();
        keys == ["ns/b".into(), "ns/c".into()]
    })
    .await;
    let stats = informer.divergence_stats().expect("configured");
    assert!(stats.drifts >= 1);
    let relist = fake.list_requests().pop().expect("relisted");
    assert_eq!(
        (relist.resource_version, relist.version_match),
        (None, None),
        "from a consistent read, not the watch cache"
    );
    informer.stop().await;
}

#[tokio::test(start_paused = true)]
async fn each_handler_resyncs_at_its_own_period() {
    let fake = Fake::new("configmaps");
    fake.add(cm("a"));
    let informer = SharedInformer::builder(fake.clone()).build();
    let resyncs = |informer: &SharedInformer<ConfigMap>, period: Option<Duration>| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let handler = handler_fn().on_update(move |_, _, _| {
            let _ = tx.send(Instant::now());
        });
        match period {
            Some(period) => informer.add_handler_with_resync(handler, period),
            None => informer.add_handler(handler),
        }
        .expect("the informer has not stopped");
        rx
    };
    let mut fast = resyncs(&informer, Some(Duration::from_secs(7)));
    let mut slow = resyncs(&informer, Some(Duration::from_secs(20)));
    let mut none = resyncs(&informer, None);
    let started = Instant::now();
    let informer = informer.spawn(CancellationToken::new());
    within("the sync", informer.wait_synced()).await;
    for _ in 0..2 {
        within("a slow resync", slow.recv()).await.expect("open");
    }
    assert_eq!(started.elapsed(), Duration::from_secs(40));
    let mut fast_times = Vec::new();
    while let Ok(at) = fast.try_recv() {
        fast_times.push(at - started);
    }
    let expected: Vec<Duration> = (1..=5).map(|n| Duration::from_secs(7 * n)).collect();
    assert_eq!(
        fast_times, expected,
        "every 7 s, independently of the other handlers"
    );
    assert!(none.try_recv().is_err(), "no period, no resync");
    informer.stop().await;
}

/// What a handler saw: the event, and the store as the handler read it then.
#[derive(Debug, PartialEq)]
struct Seen {
    event: &'static str,
    name: String,
    store_len: usize,
    store_holds_deleted: bool,
}

#[tokio::test(start_paused = true)]
async fn a_relist_is_applied_atomically_and_its_events_follow_in_a_documented_order() {
    let fake = Fake::new("configmaps");
    for i in 0..1000 {
        fake.add(cm(&format!("o{i:04}")));
    }
    let held = HeldPages::new(&fake, 1);
    let informer = SharedInformer::builder(held.clone())
        .paged_list()
        .page_size(500)
        .build();
    let store = informer.store();
    let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
    let record = |event: &'static str| {
        let (seen, store) = (seen.clone(), store.clone());
        move |o: &ConfigMap| {
            seen.lock().unwrap().push(Seen {
                event,
                name: o.metadata.name.clone().unwrap(),
                store_len: store.len(),
                store_holds_deleted: store.contains_key("ns/o0999"),
            })
        }
    };
    let (on_add, on_update, on_delete) = (record("add"), record("update"), record("delete"));
    informer
        .add_handler(
            handler_fn()
                .on_add(move |o: &Arc<ConfigMap>, delivery| {
                    if delivery == Delivery::Live {
                        on_add(o)
                    }
                })
                .on_update(move |_, new: &Arc<ConfigMap>, _| on_update(new))
                .on_delete(move |d| on_delete(d.object())),
        )
        .expect("an informer that has not run has not stopped");
    let informer = informer.spawn(CancellationToken::new());
    within("the first sync", informer.wait_synced()).await;
    fake.wait_for_calls(|c| c.watches == 1).await;

    // Changes the watch never tells of, then a lost event: the informer must relist.
    fake.set_broadcast(false);
    let mut changed = cm("o0000");
    changed.data = Some([("v".to_owned(), "2".to_owned())].into());
    fake.update(changed);
    fake.add(cm("a-new"));
    fake.delete(Some("ns"), "o0999");
    let before: Vec<_> = {
        let mut v: Vec<_> = store
            .list()
            .iter()
            .map(|o| (o.metadata.name.clone(), o.metadata.resource_version.clone()))
            .collect();
        v.sort();
        v
    };
    fake.inject(Err(decode_error("configmaps", Verb::Watch)));
    // The relist's first page is in (its second is asked for, and held back).
    until("the relist's second page asked for", || {
        held.asked.load(Ordering::SeqCst) == 2
    })
    .await;
    let during: Vec<_> = {
        let mut v: Vec<_> = store
            .list()
            .iter()
            .map(|o| (o.metadata.name.clone(), o.metadata.resource_version.clone()))
            .collect();
        v.sort();
        v
    };
    let mixed = during.iter().filter(|o| !before.contains(o)).count();
    assert!(
        during == before,
        "half a relist is not visible: {mixed} of {} objects at new versions",
        during.len()
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "no event before the relist is whole"
    );

    held.permits.add_permits(1);
    until("the relist's three events", || {
        seen.lock().unwrap().len() == 3
    })
    .await;
    let whole = |event, name: &str| Seen {
        event,
        name: name.to_owned(),
        store_len: 1000,
        store_holds_deleted: false,
    };
    assert_eq!(
        *seen.lock().unwrap(),
        [
            whole("delete", "o0999"),
            whole("add", "a-new"),
            whole("update", "o0000"),
        ],
        "deletes first, then adds and updates in list order, each reading the whole new list"
    );
    informer.stop().await;
}

#[tokio::test(start_paused = true)]
async fn each_event_says_whether_it_is_the_initial_list_a_live_change_or_a_resync() {
    let fake = Fake::new("configmaps");
    fake.add(cm("listed"));
    let informer = SharedInformer::builder(fake.clone())
        .resync_period(Duration::from_secs(60))
        .build();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (adds, updates) = (tx.clone(), tx);
    let registration = informer
        .add_handler(
            handler_fn()
                .on_add(move |o: &Arc<ConfigMap>, delivery| {
                    let _ =
                        adds.send(("add", o.metadata.name.clone().unwrap_or_default(), delivery));
                })
                .on_update(move |_, new: &Arc<ConfigMap>, delivery| {
                    let _ = updates.send((
                        "update",
                        new.metadata.name.clone().unwrap_or_default(),
                        delivery,
                    ));
                }),
        )
        .expect("an informer that has not run has not stopped");
    let informer = informer.spawn(CancellationToken::new());
    within("the handler to sync", registration.wait_synced()).await;
    assert_eq!(
        within("an event", rx.recv()).await.expect("open"),
        ("add", "listed".to_owned(), Delivery::InitialList)
    );
    fake.add(cm("created"));
    assert_eq!(
        within("an event", rx.recv()).await.expect("open"),
        ("add", "created".to_owned(), Delivery::Live)
    );
    let mut changed = cm("listed");
    changed.data = Some([("k".to_owned(), "v".to_owned())].into());
    fake.update(changed);
    assert_eq!(
        within("an event", rx.recv()).await.expect("open"),
        ("update", "listed".to_owned(), Delivery::Live)
    );
    let mut resynced = vec![
        within("an event", rx.recv()).await.expect("open"),
        within("an event", rx.recv()).await.expect("open"),
    ];
    resynced.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        resynced,
        [
            ("update", "created".to_owned(), Delivery::Resync),
            ("update", "listed".to_owned(), Delivery::Resync),
        ]
    );
    assert!(resynced.iter().all(|(_, _, d)| d.is_replay()));
    informer.stop().await;
}
