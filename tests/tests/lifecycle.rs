//! Informers over time on a real API server: how far behind each event handler is, as a
//! handler that stops and resumes shows it, and how much a stuck one may hold; informers
//! a factory stops once nothing uses them; an informer whose CRD is deleted and recreated;
//! warm restarts from a snapshot of the cache.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{
    api::core::v1::{ConfigMap, PodTemplate, Secret},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube_client::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    core::CustomResourceExt,
};
use kube_informer::{
    Action, CancellationToken, Controller, FactoryDefaults, InformerFactory, Manager,
    ReconcileRequest, Scope, SharedInformer, handler_fn, informer::HANDLER_COALESCE_AFTER,
    informer::InformerHealth, list_watch::ApiListWatch, reflector::WarmRestart, retry_with_backoff,
    store::NAMESPACE_INDEX,
};
use kube_testenv::TestEnv;
use serde_json::json;
use tests::{
    Recording, cache_state, config_map, create_all, eventually, eventually_some, http_get, name,
    rv, server_state, test_namespace, within,
};
use traefik_operator::crd::{TraefikService, TraefikServiceSpec};

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

/// The sum of the API server's own `metric` series for `resource` and `verb`, summed over
/// scopes (and codes): `apiserver_longrunning_requests` for the watches it serves now,
/// `apiserver_request_total` for the requests it answered.
async fn apiserver_metric(
    client: &kube_client::Client,
    metric: &str,
    resource: &str,
    verb: &str,
) -> u64 {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let metrics = client
        .request_text(request)
        .await
        .expect("the API server's metrics");
    let (series, resource, verb) = (
        format!("{metric}{{"),
        format!(r#"resource="{resource}""#),
        format!(r#"verb="{verb}""#),
    );
    metrics
        .lines()
        .filter(|line| line.starts_with(&series))
        .filter(|line| line.contains(&resource) && line.contains(&verb))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

async fn watches_served(client: &kube_client::Client, resource: &str) -> u64 {
    apiserver_metric(client, "apiserver_longrunning_requests", resource, "WATCH").await
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
        (
            move |_: ReconcileRequest<PodTemplate>, _: Arc<()>| {
                count.fetch_add(1, Ordering::Relaxed);
                async { Ok::<_, std::io::Error>(Action::done()) }
            },
            retry_with_backoff(),
            Arc::new(()),
        ),
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

/// Creates `crd` and waits until its resource is served.
async fn install(
    crds: &Api<CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
    served: &Api<TraefikService>,
) {
    let name = crd.metadata.name.clone().unwrap();
    eventually_some("the CRD created", || async {
        match crds.create(&PostParams::default(), crd).await {
            Ok(_) => Some(()),
            // The previous one may still be going.
            Err(kube_client::Error::Api(status)) if status.code == 409 => None,
            Err(error) => panic!("creating the CRD {name}: {error}"),
        }
    })
    .await;
    eventually_some("its resource served", || async {
        served.list(&ListParams::default()).await.ok().map(|_| ())
    })
    .await;
}

fn traefik_service(name: &str) -> TraefikService {
    TraefikService::new(
        name,
        TraefikServiceSpec {
            entrypoint: "web".into(),
            url: "http://backend.example:8080".into(),
            rule: None,
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_a_crd_deleted_and_recreated_is_reported_once_and_reconciled_again() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "lifecycle-crd").await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = TraefikService::crd();
    let crd_name = crd.metadata.name.clone().unwrap();
    let services: Api<TraefikService> = Api::namespaced(client.clone(), &namespace);
    install(&crds, &crd, &services).await;
    services
        .create(&PostParams::default(), &traefik_service("before"))
        .await
        .unwrap();

    // A controller in a manager, with the default configuration, its probes and metrics
    // served.
    let loopback = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    let mut manager = Manager::new(client.clone())
        .probe_address(loopback)
        .metrics_address(loopback);
    let controller = manager.controller::<TraefikService>("gadgets", Scope::namespace(&namespace));
    let informer = manager
        .factory()
        .informer::<TraefikService>(Scope::namespace(&namespace));
    let seen: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let record = seen.clone();
    manager.add_controller(
        controller,
        (
            move |request: ReconcileRequest<TraefikService>, _: Arc<()>| {
                let present = matches!(request, ReconcileRequest::Present(_));
                let name = request.key().name().to_owned();
                record.lock().unwrap().push((name, present));
                async { Ok::<_, std::io::Error>(Action::done()) }
            },
            retry_with_backoff(),
            Arc::new(()),
        ),
    );
    let bound = manager.bind().await.unwrap();
    let (probes, metrics) = (
        bound.probe_address().unwrap(),
        bound.metrics_address().unwrap(),
    );
    let stop = CancellationToken::new();
    let run = tokio::spawn(bound.run(stop.clone()));
    let missing_series = format!(
        r#"informer_resource_missing{{resource="traefikservices",namespace="{namespace}",label_selector="",field_selector=""}}"#
    );
    let reconciled =
        |name: &str, present: bool| seen.lock().unwrap().contains(&(name.to_owned(), present));
    eventually("the first object reconciled", || reconciled("before", true)).await;
    assert_eq!(informer.health(), InformerHealth::Synced);

    // The CRD deleted: the server deletes its objects, then stops serving it.
    crds.delete(&crd_name, &DeleteParams::default())
        .await
        .unwrap();
    eventually_some("the CRD gone", || async {
        crds.get_opt(&crd_name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let since = eventually_some("the informer to say its resource is missing", || async {
        match informer.health() {
            InformerHealth::ResourceMissing { since } => Some(since),
            _ => None,
        }
    })
    .await;
    // Retried, and still the same report: it said so once.
    let errors = informer.reflector_stats().errors;
    eventually("two more retries", || {
        informer.reflector_stats().errors >= errors + 2
    })
    .await;
    assert_eq!(informer.health(), InformerHealth::ResourceMissing { since });
    assert!(!run.is_finished(), "the controller keeps running");
    // Its health says so: /readyz names the resource, /metrics has the gauge at 1.
    let (status, body) = http_get(probes, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("traefikservices"), "{body}");
    let (_, body) = http_get(metrics, "/metrics").await;
    assert!(body.contains(&format!("{missing_series} 1")), "{body}");

    // The CRD back, with a new object: the informer resumes and the controller reconciles.
    install(&crds, &crd, &services).await;
    services
        .create(&PostParams::default(), &traefik_service("after"))
        .await
        .unwrap();
    eventually("the new object reconciled", || reconciled("after", true)).await;
    // The old one's deletion came as an event before the watch closed, or from the relist.
    eventually("the deleted object reconciled", || {
        reconciled("before", false)
    })
    .await;
    assert_eq!(informer.health(), InformerHealth::Synced);
    let cached: Vec<String> = informer.store().iter().map(|s| tests::name(&*s)).collect();
    assert_eq!(cached, ["after"]);
    assert_eq!(http_get(probes, "/readyz").await.0, 200);
    let (_, body) = http_get(metrics, "/metrics").await;
    assert!(body.contains(&format!("{missing_series} 0")), "{body}");

    stop.cancel();
    run.await.unwrap().unwrap();
    crds.delete(&crd_name, &DeleteParams::default())
        .await
        .unwrap();
}

async fn lists_served(client: &kube_client::Client, resource: &str) -> u64 {
    apiserver_metric(client, "apiserver_request_total", resource, "LIST").await
}

/// The informer of `api`'s objects with a warm restart at `snapshot`, recorded.
fn warm_informer<K: Warm>(
    api: &Api<K>,
    snapshot: &std::path::Path,
) -> (Recording<ApiListWatch<K>>, SharedInformer<K>) {
    let lw = Recording::new(ApiListWatch::new(api.clone()));
    let informer = SharedInformer::builder(lw.clone())
        .warm_restart(WarmRestart::at(snapshot))
        .build();
    (lw, informer)
}

/// What the warm restart tests cache: ConfigMaps, and Secrets where the API server's own
/// count of LISTs must see no other test's.
trait Warm: kube_informer::TypedResource<Scope = k8s_openapi::NamespaceResourceScope> + Unpin {
    fn named(name: &str) -> Self;
}

impl Warm for ConfigMap {
    fn named(name: &str) -> Self {
        config_map(name, &[])
    }
}

impl Warm for Secret {
    fn named(name: &str) -> Self {
        let mut secret = Secret::default();
        secret.metadata.name = Some(name.to_owned());
        secret.string_data = Some([("k".to_owned(), "v".to_owned())].into());
        secret
    }
}

async fn create_named<K: Warm>(api: &Api<K>, names: Vec<String>) {
    within(
        "creating the objects",
        futures::stream::iter(names)
            .map(|name| {
                let api = api.clone();
                async move { api.create(&PostParams::default(), &K::named(&name)).await }
            })
            .buffer_unordered(16)
            .try_for_each(|_| async { Ok(()) }),
    )
    .await
    .expect("the objects are created");
}

/// Changes made while the informer is down: a third of the objects updated, a third deleted,
/// as many new ones created.
async fn change_while_down<K: Warm>(api: &Api<K>, objects: usize) {
    for i in 0..objects / 3 {
        let patch = json!({ "metadata": { "labels": { "while-down": "yes" } } });
        api.patch(
            &format!("o-{i:03}"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
        api.delete(
            &format!("o-{:03}", objects / 3 + i),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    }
    let created = (0..objects / 3).map(|i| format!("new-{i:03}")).collect();
    create_named(api, created).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_a_warm_restart_after_10_s_of_changes_resumes_without_a_list() {
    const OBJECTS: usize = 150;
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "lifecycle-warm").await;
    // Secrets: no other test of this binary lists them, so the API server's count of
    // LISTs is this test's.
    let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    create_named(&api, (0..OBJECTS).map(|i| format!("o-{i:03}")).collect()).await;
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("secrets.snapshot");

    let (_, informer) = warm_informer(&api, &snapshot);
    let informer = informer.spawn(CancellationToken::new());
    within("the first sync", informer.wait_synced()).await;
    assert_eq!(informer.store().len(), OBJECTS);
    informer.stop().await;
    let stopped = std::time::Instant::now();
    assert!(snapshot.exists(), "the snapshot is written at stop");

    // Ten seconds down, with updates, deletes and creates meanwhile.
    change_while_down(&api, OBJECTS).await;
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(stopped.elapsed())).await;

    let lists_before = lists_served(&client, "secrets").await;
    let (lw, informer) = warm_informer(&api, &snapshot);
    let added = Arc::new(AtomicUsize::new(0));
    let count = added.clone();
    informer
        .add_handler(handler_fn().on_add(move |_: &Arc<Secret>, _| {
            count.fetch_add(1, Ordering::Relaxed);
        }))
        .unwrap();
    let informer = informer.spawn(CancellationToken::new());
    within("the warm restart to catch up", informer.wait_synced()).await;
    let server = server_state(&api).await;
    assert_eq!(
        cache_state(&informer),
        server,
        "the cache equals a fresh list"
    );

    // No full list of any kind: the resumed watch, and one read of the version the
    // server's cache is at (a list that selects nothing); no streaming list either.
    let calls = lw.calls();
    assert!(calls.lists.is_empty(), "{:?}", calls.lists);
    assert_eq!(calls.version_reads, 1);
    assert!(
        calls.watches.iter().all(|w| !w.send_initial_events),
        "{:?}",
        calls.watches
    );
    assert_eq!(informer.reflector_stats().lists, 0);
    // The API server agrees: that read and this test's own `server_state` above.
    assert_eq!(lists_served(&client, "secrets").await, lists_before + 2);
    // Every object reached the handler once as an add: the snapshot's and the new ones.
    assert_eq!(added.load(Ordering::Relaxed), OBJECTS + OBJECTS / 3);
    informer.stop().await;

    // Again with a handler that takes keys, as a controller's does: the compact cache
    // takes the snapshot's objects as they are kept, undecoded, the handler gets their
    // keys, and the cache reads them as any other: each decodes (the cache equals a fresh
    // list), a label selector matches the labels kept beside the bytes, the namespace
    // index holds every key.
    let (lw, informer) = warm_informer(&api, &snapshot);
    let keys = Arc::new(AtomicUsize::new(0));
    let count = keys.clone();
    let registration = informer
        .add_key_handler(move |_| {
            count.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
    let informer = informer.spawn(CancellationToken::new());
    within("the second warm restart", informer.wait_synced()).await;
    within("the key handler's sync", registration.wait_synced()).await;
    assert_eq!(keys.load(Ordering::Relaxed), OBJECTS);
    assert_eq!(cache_state(&informer), server_state(&api).await);
    assert!(lw.calls().lists.is_empty(), "{:?}", lw.calls().lists);
    let store = informer.store();
    let mut labelled: Vec<String> = store
        .list_selector(&"while-down=yes".parse().unwrap())
        .iter()
        .filter_map(|secret| secret.metadata.name.clone())
        .collect();
    labelled.sort();
    let patched: Vec<String> = (0..OBJECTS / 3).map(|i| format!("o-{i:03}")).collect();
    assert_eq!(labelled, patched);
    let in_namespace = store.index_keys(NAMESPACE_INDEX, &namespace).unwrap();
    assert_eq!(in_namespace.len(), OBJECTS);
    informer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_a_warm_restart_past_a_compaction_relists_to_the_same_cache() {
    const OBJECTS: usize = 90;
    // Its own control plane: the API server restarts, which would disturb other tests.
    let env = TestEnv::builder().start().await.unwrap();
    let (client, namespace) = test_namespace(&env, "lifecycle-compacted").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    create_named(&api, (0..OBJECTS).map(|i| format!("o-{i:03}")).collect()).await;
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("configmaps.snapshot");
    let (_, informer) = warm_informer(&api, &snapshot);
    let informer = informer.spawn(CancellationToken::new());
    within("the first sync", informer.wait_synced()).await;
    informer.stop().await;

    // Changes, then etcd compacted past the snapshot's version and the API server
    // restarted: its watch cache's history starts after the snapshot too.
    change_while_down(&api, OBJECTS).await;
    env.compact_etcd().await.unwrap();
    env.restart_apiserver().await.unwrap();

    let client = env.client().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let (lw, informer) = warm_informer(&api, &snapshot);
    let informer = informer.spawn(CancellationToken::new());
    within("the relist", informer.wait_synced()).await;
    let server = server_state(&api).await;
    assert_eq!(
        cache_state(&informer),
        server,
        "the same cache as a fresh list"
    );
    let calls = lw.calls();
    let resumed = calls.watches.first().expect("the resumed watch");
    assert!(!resumed.send_initial_events && !resumed.resource_version.is_empty());
    assert!(
        informer.reflector_stats().lists >= 1,
        "the snapshot was too old: a full list replaced it"
    );
    informer.stop().await;
}
