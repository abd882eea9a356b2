//! The informer behind real network faults (Toxiproxy between it and the API server):
//! after each fault the cache converges to the server, as the informer's own divergence
//! check confirms; every change made during the fault reaches the handlers (a deletion as
//! a final state or a tombstone); objects that did not change get no event.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use kube_informer::{SharedInformer, informer::DivergenceCheck, reflector::BackoffConfig};
use kube_testenv::{FaultProxy, TestEnv};
use serde_json::json;
use tests::{
    Ev, config_map, create_all, error_log, eventually_some, name, next_event, recorder, run,
    test_namespace, wait_errors, within,
};

/// A network fault, and how it is lifted.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// The API server unreachable: connections refused.
    Cut,
    /// Every connection reset.
    Reset,
    /// Every connection silently stalled: no byte passes, none is closed.
    Stall,
}

impl Fault {
    async fn apply(self, proxy: &FaultProxy) -> kube_testenv::Result<()> {
        match self {
            Fault::Cut => proxy.cut().await,
            Fault::Reset => proxy.reset_connections().await,
            Fault::Stall => proxy.stall().await,
        }
    }

    async fn lift(self, proxy: &FaultProxy) -> kube_testenv::Result<()> {
        match self {
            Fault::Cut => proxy.restore().await,
            Fault::Reset | Fault::Stall => proxy.clear().await,
        }
    }
}

/// Whether etcd forgets the history of the fault before it is lifted.
#[derive(Clone, Copy, Debug, PartialEq)]
enum History {
    /// Kept: the informer resumes its watch where it was.
    Kept,
    /// Compacted past the informer's resourceVersion: it gets 410 Gone and relists.
    Compacted,
}

/// Runs one fault: three objects, an informer through the proxy, the fault while the
/// informer is synced, changes made meanwhile, then the fault lifted; checks what the
/// informer made of it.
async fn survives(env: &TestEnv, prefix: &str, fault: Fault, history: History) {
    let (client, namespace) = test_namespace(env, prefix).await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    create_all(
        &api,
        ["gone", "changed", "kept"]
            .iter()
            .map(|n| config_map(n, &[("v", "1")]))
            .collect(),
    )
    .await;
    let proxy = within("the fault proxy", FaultProxy::for_apiserver(env))
        .await
        .unwrap();
    // The informer's own client: HTTP/2, whose pings find a stalled connection.
    let through = kube_informer::client(env.config_via(&proxy).await.unwrap()).unwrap();
    let (errors, hook) = error_log();
    let informer = SharedInformer::builder(Api::<ConfigMap>::namespaced(through, &namespace))
        .backoff(
            BackoffConfig::default()
                .initial(Duration::from_millis(200))
                .max(Duration::from_secs(2)),
        )
        .divergence_check(DivergenceCheck::on_demand())
        .on_watch_error(hook)
        .build();
    let (_registration, mut events) = recorder(&informer);
    let informer = run(informer);
    within("the informer to sync", informer.wait_synced()).await;
    for _ in 0..3 {
        next_event(&mut events, "the initial adds").await;
    }

    fault.apply(&proxy).await.unwrap();
    api.delete("gone", &DeleteParams::default()).await.unwrap();
    let changed = api
        .patch(
            "changed",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "v": "2" } })),
        )
        .await
        .unwrap();
    api.create(&PostParams::default(), &config_map("new", &[("v", "1")]))
        .await
        .unwrap();
    // Lifted once the informer has felt it: a reset connection shows when the server
    // next sends on it, which these changes make it do; a stalled one, when a ping goes
    // unanswered (long before a silent watch's idle timeout).
    wait_errors(&errors, "the informer to feel the fault", |e| !e.is_empty()).await;
    let felt = errors.borrow()[0].clone();
    assert!(
        !felt.idle,
        "felt by the connection, not the idle timeout: {felt:?}"
    );
    if history == History::Compacted {
        env.compact_etcd().await.unwrap();
    }
    fault.lift(&proxy).await.unwrap();

    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.push(next_event(&mut events, "the changes made during the fault").await);
    }
    seen.sort_by_key(Ev::name);
    match &seen[..] {
        [Ev::Update(_, new), Ev::Delete(gone), Ev::Add(added, false)] => {
            assert_eq!(name(&**new), "changed");
            assert_eq!(
                new.metadata.resource_version,
                changed.metadata.resource_version
            );
            assert_eq!(name(&**gone.object()), "gone");
            assert_eq!(name(&**added), "new");
        }
        other => panic!("expected update changed, delete gone, add new; got {other:?}"),
    }
    if history == History::Compacted {
        assert!(
            errors.borrow().iter().any(|e| e.gone),
            "the watch resumed past a compaction: 410 Gone, then a relist: {:?}",
            errors.borrow()
        );
    }
    let drift = eventually_some("a divergence check that compares", || async {
        informer.check_divergence().await.ok().flatten()
    })
    .await;
    assert!(
        drift.is_empty(),
        "the cache converged to the server: {drift}"
    );
    assert!(
        events.try_recv().is_err(),
        "no event for the object that did not change"
    );
    informer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_unreachable_for_a_while() {
    survives(
        TestEnv::shared().await,
        "net-cut",
        Fault::Cut,
        History::Kept,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_unreachable_while_etcd_compacts_its_history() {
    // Without the watch cache the API server serves watches from etcd, so a watch resumed
    // from a compacted revision is refused at once (410 Gone). A control plane of its own:
    // the compaction would reach every other test's informers.
    let env = TestEnv::builder()
        .apiserver_arg("--watch-cache=false")
        .start()
        .await
        .unwrap();
    survives(&env, "net-compact", Fault::Cut, History::Compacted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_reset() {
    survives(
        TestEnv::shared().await,
        "net-reset",
        Fault::Reset,
        History::Kept,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_silently_stalled() {
    survives(
        TestEnv::shared().await,
        "net-stall",
        Fault::Stall,
        History::Kept,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_objects_through_a_slow_link() {
    const OBJECTS: usize = 10_000;
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "net-slow").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    create_all(
        &api,
        (0..OBJECTS)
            .map(|i| config_map(&format!("cm-{i:05}"), &[("v", "1")]))
            .collect(),
    )
    .await;
    let proxy = within("the fault proxy", FaultProxy::for_apiserver(env))
        .await
        .unwrap();
    // A distant API server on a thin link: 100 ms each way, 500 KB/s per connection.
    proxy
        .latency(Duration::from_millis(100), Duration::from_millis(20))
        .await
        .unwrap();
    proxy.bandwidth(500).await.unwrap();
    let through = kube_informer::client(env.config_via(&proxy).await.unwrap()).unwrap();
    let (errors, hook) = error_log();
    let informer = SharedInformer::builder(Api::<ConfigMap>::namespaced(through, &namespace))
        .divergence_check(DivergenceCheck::on_demand())
        .on_watch_error(hook)
        .build();
    let (_registration, mut events) = recorder(&informer);
    let informer = run(informer);
    // Changed while the list is on its way: in the list or as an event after it, the
    // informer ends at this state.
    let changed = api
        .patch(
            "cm-09999",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "v": "2" } })),
        )
        .await
        .unwrap();
    within("the informer to sync", informer.wait_synced()).await;
    let mut initial = 0;
    while initial < OBJECTS {
        match next_event(&mut events, "the initial adds").await {
            Ev::Add(_, true) => initial += 1,
            Ev::Update(_, new) if name(&*new) == "cm-09999" => {}
            other => panic!("only the initial adds and the change: {other:?}"),
        }
    }
    eventually_some("the change made during the list", || async {
        let cached = informer
            .store()
            .get_by_key(format!("{namespace}/cm-09999"))?;
        (cached.metadata.resource_version == changed.metadata.resource_version).then_some(())
    })
    .await;
    let drift = eventually_some("a divergence check that compares", || async {
        informer.check_divergence().await.ok().flatten()
    })
    .await;
    assert!(drift.is_empty(), "the cache is the server's: {drift}");
    assert!(
        errors.borrow().is_empty(),
        "a slow link is no error: {:?}",
        errors.borrow()
    );
    informer.stop().await;
}

/// kube-apiserver caps the streams one HTTP/2 connection carries at 100; the library's
/// client opens another connection past that. 260 watches are all open at once (each has
/// its response before the object is created, so none can be a late watch replaying
/// history), each sees the object, and a request sent while all are open still answers.
/// On one connection the 101st watch would wait for a watch's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_watches_than_one_connection_carries_are_open_at_once_and_follow_the_server() {
    use futures::{StreamExt, TryStreamExt};
    use kube_client::api::{ListParams, WatchEvent, WatchParams};

    const WATCHES: usize = 260;
    let env = TestEnv::shared().await;
    let (admin, namespace) = test_namespace(env, "many-watches").await;
    let client = kube_informer::ClusterSource::default()
        .kubeconfig(env.kubeconfig_path())
        .client()
        .await
        .expect("the library's client");
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let version = api
        .list(&ListParams::default().limit(1))
        .await
        .expect("a list")
        .metadata
        .resource_version
        .expect("a version");
    let all_open = Arc::new(tokio::sync::Barrier::new(WATCHES + 1));
    let mut watches = Vec::new();
    for _ in 0..WATCHES {
        let (api, version, all_open) = (api.clone(), version.clone(), all_open.clone());
        watches.push(tokio::spawn(async move {
            let stream = api
                .watch(&WatchParams::default().timeout(290), &version)
                .await
                .expect("a watch starts");
            all_open.wait().await;
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.try_next().await.expect("a watch event") {
                if let WatchEvent::Added(cm) = event
                    && name(&cm) == "seen-by-all"
                {
                    return;
                }
            }
            panic!("the watch ended before the object arrived");
        }));
    }
    within("every watch to be open at once", all_open.wait()).await;
    within(
        "a request while every watch is open",
        api.list(&ListParams::default().limit(1)),
    )
    .await
    .expect("a list while every watch is open");
    Api::<ConfigMap>::namespaced(admin, &namespace)
        .create(&PostParams::default(), &config_map("seen-by-all", &[]))
        .await
        .expect("the ConfigMap");
    let seen = within(
        "every watch to see the object",
        futures::stream::iter(watches)
            .then(|watch| async move { watch.await.is_ok() })
            .filter(|ok| std::future::ready(*ok))
            .count(),
    )
    .await;
    assert_eq!(seen, WATCHES);
}
