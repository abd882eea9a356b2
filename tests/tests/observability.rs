//! Seeing a running controller: how stale an informer's cache is, measured against the
//! real API server, through a link stalled with Toxiproxy.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{Api, api::PostParams};
use kube_informer::{CancellationToken, FactoryDefaults, InformerFactory, Scope};
use kube_testenv::{FaultProxy, TestEnv};
use tests::{config_map, eventually, test_namespace, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observability_staleness_rises_through_a_stall_and_falls_after() {
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "staleness").await;
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let proxy = within("the fault proxy to start", FaultProxy::for_apiserver(env))
        .await
        .expect("the fault proxy starts");
    let through_proxy = env
        .client_via(&proxy)
        .await
        .expect("a client via the proxy");
    let factory = InformerFactory::with_defaults(
        through_proxy,
        FactoryDefaults::default().staleness_probe(Duration::from_millis(300)),
    );
    let informer = factory.informer::<ConfigMap>(Scope::namespace(&namespace));
    let cancel = CancellationToken::new();
    factory.start(&cancel);
    within("the informer to sync", informer.wait_synced()).await;

    // Calm, with changes: the cache passes each probe as the changes arrive. The server's
    // revision also moves with writes outside this namespace (its own Leases), which the
    // cache sees only at a bookmark; a write here passes them too.
    let staleness = || informer.staleness().expect("the informer has a probe");
    let mut written = 0;
    while staleness().passed < 3 {
        api.create(
            &PostParams::default(),
            &config_map(&format!("calm-{written}"), &[]),
        )
        .await
        .expect("a ConfigMap");
        written += 1;
        assert!(written < 300, "no probe passed in calm: {:?}", staleness());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Stalled: the watch carries nothing and the probe's reads hang; the age grows.
    proxy.stall().await.expect("the link stalls");
    api.create(&PostParams::default(), &config_map("during", &[]))
        .await
        .expect("a ConfigMap written past the stall");
    eventually("the cache reads as behind", || {
        staleness().behind > Duration::from_secs(2)
    })
    .await;
    let during = staleness();
    assert!(during.failed_reads >= 1, "{during:?}");
    assert!(
        informer.has_synced(),
        "a stalled cache still says it has synced"
    );

    // Lifted: the cache catches up, and the probe with it (a write after the stall passes
    // whatever version the pending probe read).
    proxy.clear().await.expect("the link flows again");
    api.create(&PostParams::default(), &config_map("after", &[]))
        .await
        .expect("a ConfigMap after the stall");
    eventually("the write made during the stall cached", || {
        informer
            .store()
            .get_by_key(format!("{namespace}/during"))
            .is_some()
    })
    .await;
    eventually("the cache reads as current again", || {
        let now = staleness();
        now.behind < Duration::from_secs(1) && now.passed > during.passed
    })
    .await;
    cancel.cancel();
    factory.shutdown().await;
}
