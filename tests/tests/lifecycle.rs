//! Informers over time on a real API server: how far behind each event handler is, as a
//! handler that stops and resumes shows it, and how much a stuck one may hold; informers
//! a factory stops once nothing uses them.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, PodTemplate};
use kube_client::{
    Api,
    api::{Patch, PatchParams},
};
use kube_informer::{
    Action, CancellationToken, Controller, FactoryDefaults, HANDLER_COALESCE_AFTER,
    InformerFactory, ReconcileRequest, Scope, handler_fn, retry_with_backoff,
};
use kube_testenv::TestEnv;
use serde_json::json;
use tests::{
    config_map, create_all, eventually, eventually_some, name, rv, server_state, test_namespace,
};

const OBJECTS: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_a_stuck_handler_s_lag_rises_and_falls_and_no_other_handler_waits() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "lifecycle-lag").await;
    let factory = InformerFactory::new(client.clone());
    let informer = factory.informer::<ConfigMap>(Scope::namespace(&namespace));
    let fast_seen = Arc::new(AtomicUsize::new(0));
    let seen = fast_seen.clone();
    let fast = informer
        .add_named_handler(
            "fast",
            handler_fn().on_add(move |_: &Arc<ConfigMap>, _| {
                seen.fetch_add(1, Ordering::Relaxed);
            }),
        )
        .unwrap();
    // Stuck on its first event until released (off the runtime's worker, as a handler
    // that waits must be).
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = Mutex::new(Some(released));
    let slow = informer
        .add_named_handler(
            "slow",
            handler_fn().on_add(move |_: &Arc<ConfigMap>, _| {
                let wait = released.lock().unwrap().take();
                if let Some(wait) = wait {
                    tokio::task::block_in_place(|| {
                        let _ = wait.recv();
                    });
                }
            }),
        )
        .unwrap();
    let stop = CancellationToken::new();
    factory.start(&stop);
    informer.wait_synced().await;

    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let objects = (0..OBJECTS)
        .map(|i| config_map(&format!("cm-{i:03}"), &[]))
        .collect();
    create_all(&api, objects).await;
    eventually("the fast handler has every object", || {
        fast_seen.load(Ordering::Relaxed) == OBJECTS
    })
    .await;
    // The stuck one holds the others back: all its events wait, the oldest for longer and
    // longer.
    let stuck = slow.stats();
    assert_eq!(stuck.waiting, OBJECTS as u64, "{stuck:?}");
    eventually("the oldest event's age grows", || {
        slow.stats().oldest_waiting > stuck.oldest_waiting
    })
    .await;
    assert_eq!(fast.stats().waiting, 0);
    let by_name: Vec<(String, u64)> = informer
        .handler_stats()
        .into_iter()
        .map(|s| (s.name, s.waiting))
        .collect();
    assert_eq!(
        by_name,
        [("fast".to_owned(), 0), ("slow".to_owned(), OBJECTS as u64)]
    );

    release.send(()).unwrap();
    eventually("the slow handler catches up", || slow.stats().waiting == 0).await;
    let caught_up = slow.stats();
    assert_eq!(caught_up.oldest_waiting, Duration::ZERO);
    assert_eq!(caught_up.delivered, OBJECTS as u64);
    assert!(caught_up.processing_total > Duration::ZERO);
    stop.cancel();
    factory.shutdown().await;
}

/// `name -> resourceVersion` of the last event a handler saw of each object.
type LastSeen = Arc<Mutex<BTreeMap<String, String>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_a_stuck_handler_holds_a_bounded_buffer_while_10_000_events_arrive() {
    const OBJECTS: usize = 100;
    const ROUNDS: usize = 100;
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "lifecycle-bound").await;
    let factory = InformerFactory::new(client.clone());
    let informer = factory.informer::<ConfigMap>(Scope::namespace(&namespace));
    let recording = |last_seen: &LastSeen, events: Arc<AtomicUsize>| {
        let (on_add, on_update) = (last_seen.clone(), last_seen.clone());
        let counted = events.clone();
        handler_fn()
            .on_add(move |cm: &Arc<ConfigMap>, _| {
                counted.fetch_add(1, Ordering::Relaxed);
                on_add.lock().unwrap().insert(name(&**cm), rv(&**cm));
            })
            .on_update(move |_, cm: &Arc<ConfigMap>, _| {
                events.fetch_add(1, Ordering::Relaxed);
                on_update.lock().unwrap().insert(name(&**cm), rv(&**cm));
            })
    };
    let following = LastSeen::default();
    let following_events = Arc::new(AtomicUsize::new(0));
    informer
        .add_named_handler("following", recording(&following, following_events.clone()))
        .unwrap();
    // The stuck handler waits on its first event until released, then records like the
    // other.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = Mutex::new(Some(released));
    let stuck_seen = LastSeen::default();
    let stuck_recording = recording(&stuck_seen, Arc::new(AtomicUsize::new(0)));
    let stuck = informer
        .add_named_handler(
            "stuck",
            handler_fn()
                .on_add(move |cm: &Arc<ConfigMap>, delivery| {
                    let wait = released.lock().unwrap().take();
                    if let Some(wait) = wait {
                        tokio::task::block_in_place(|| {
                            let _ = wait.recv();
                        });
                    }
                    kube_informer::EventHandler::on_add(&stuck_recording, cm, delivery);
                })
                .on_update({
                    let stuck_seen = stuck_seen.clone();
                    move |_, cm: &Arc<ConfigMap>, _| {
                        stuck_seen.lock().unwrap().insert(name(&**cm), rv(&**cm));
                    }
                }),
        )
        .unwrap();
    let stop = CancellationToken::new();
    factory.start(&stop);
    informer.wait_synced().await;

    // 100 objects created, then each updated 100 times: 10,100 events.
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let objects = (0..OBJECTS)
        .map(|i| config_map(&format!("cm-{i:03}"), &[]))
        .collect();
    create_all(&api, objects).await;
    let patches = (0..ROUNDS).flat_map(|round| (0..OBJECTS).map(move |i| (round, i)));
    tokio::time::timeout(
        Duration::from_secs(600),
        futures::stream::iter(patches)
            .map(|(round, i)| {
                let api = api.clone();
                async move {
                    let patch = json!({ "data": { "round": round.to_string() } });
                    api.patch(
                        &format!("cm-{i:03}"),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                }
            })
            .buffer_unordered(32)
            .try_for_each(|_| async { Ok(()) }),
    )
    .await
    .expect("10,000 updates within ten minutes")
    .expect("the updates are accepted");
    let server = server_state(&api).await;
    eventually("the following handler has seen every final state", || {
        *following.lock().unwrap() == server
    })
    .await;

    // Every event reached the stuck handler's buffer, but it holds at most the stated
    // bound: the threshold plus three per object.
    let events = following_events.load(Ordering::Relaxed) as u64;
    assert!(
        events >= (OBJECTS * (ROUNDS + 1)) as u64 - 10,
        "{events} events"
    );
    let held = stuck.stats();
    assert_eq!(held.delivered, 0, "{held:?}");
    assert_eq!(held.waiting + held.coalesced, events, "{held:?}");
    assert!(
        held.waiting <= HANDLER_COALESCE_AFTER + 3 * OBJECTS as u64,
        "{held:?}"
    );

    // Released, it catches up with fewer deliveries than events, and ends on the same
    // state as the handler that kept up.
    release.send(()).unwrap();
    eventually("the stuck handler catches up", || {
        stuck.stats().waiting == 0
    })
    .await;
    assert_eq!(*stuck_seen.lock().unwrap(), server);
    let caught_up = stuck.stats();
    assert_eq!(caught_up.delivered, held.waiting, "{caught_up:?}");
    stop.cancel();
    factory.shutdown().await;
}

/// Watches of `resource` the API server is serving now (its `apiserver_longrunning_requests`
/// gauge, summed over scopes).
async fn watches_served(client: &kube_client::Client, resource: &str) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let metrics = client
        .request_text(request)
        .await
        .expect("the API server's metrics");
    let resource = format!(r#"resource="{resource}""#);
    metrics
        .lines()
        .filter(|line| line.starts_with("apiserver_longrunning_requests{"))
        .filter(|line| line.contains(&resource) && line.contains(r#"verb="WATCH""#))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_the_last_controller_gone_its_informer_stops_and_its_watch_closes() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "lifecycle-unused").await;
    // Nothing else in this test binary watches PodTemplates.
    let before = watches_served(&client, "podtemplates").await;
    let grace = Duration::from_secs(1);
    let factory = InformerFactory::with_defaults(
        client.clone(),
        FactoryDefaults::default().stop_unused_after(grace),
    );
    let templates = factory.informer::<PodTemplate>(Scope::namespace(&namespace));
    let controller = Controller::new("template-user", templates);
    let stop = CancellationToken::new();
    factory.start(&stop);
    let stop_controller = CancellationToken::new();
    let reconciled = Arc::new(AtomicUsize::new(0));
    let count = reconciled.clone();
    let run = tokio::spawn(controller.run(
        move |_: ReconcileRequest<PodTemplate>, _: Arc<()>, _| {
            count.fetch_add(1, Ordering::Relaxed);
            async { Ok::<_, std::io::Error>(Action::done()) }
        },
        retry_with_backoff(),
        Arc::new(()),
        stop_controller.clone(),
    ));
    within_factory_synced(&factory).await;
    eventually_some("the informer's watch on the API server", || async {
        (watches_served(&client, "podtemplates").await == before + 1).then_some(())
    })
    .await;
    let users = factory.informers()[0].users;
    assert!(users >= 2, "the controller's handle and handler: {users}");

    // The controller goes: its handle, store and handler with it.
    stop_controller.cancel();
    run.await.unwrap().unwrap();
    eventually("the informer unused", || {
        factory.informers().first().is_none_or(|i| i.users == 0)
    })
    .await;
    eventually("the factory stops and forgets it", || factory.is_empty()).await;
    eventually_some("its watch closed on the API server", || async {
        (watches_served(&client, "podtemplates").await == before).then_some(())
    })
    .await;
    assert_eq!(
        reconciled.load(Ordering::Relaxed),
        0,
        "nothing to reconcile"
    );
    stop.cancel();
    factory.shutdown().await;
}

async fn within_factory_synced(factory: &InformerFactory) {
    tests::within("the factory's informers to sync", factory.wait_synced())
        .await
        .expect("the informers sync");
}
