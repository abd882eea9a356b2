//! The informer behind real network faults (Toxiproxy between it and the API server):
//! after each fault the cache converges to the server, as the informer's own divergence
//! check confirms; every change made during the fault reaches the handlers (a deletion as
//! a final state or a tombstone); objects that did not change get no event.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use kube_informer::{BackoffConfig, DivergenceCheck, SharedInformer};
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

/// Runs one fault: three objects, an informer through the proxy, the fault while the
/// informer is synced, changes made meanwhile, then the fault lifted; checks what the
/// informer made of it.
async fn survives(prefix: &str, fault: Fault) {
    let env = TestEnv::shared().await;
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
        .backoff(BackoffConfig {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(2),
            ..Default::default()
        })
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
    survives("net-cut", Fault::Cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_reset() {
    survives("net-reset", Fault::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_silently_stalled() {
    survives("net-stall", Fault::Stall).await;
}
