//! [`FaultProxy`] injects real network faults between a client and the API server: each
//! fault must break a client that goes through the proxy the way it says (an error, a hang,
//! a delay), and lifting it must make the same client work again.
//!
//! Every test shares one control plane and starts its own proxy, so faults never leak from
//! one test into another, nor into the direct clients that set a test up.

use std::{
    io::ErrorKind,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube_client::{
    Api, Client,
    api::{ListParams, PostParams},
};
use kube_testenv::{FaultProxy, TestEnv};
use tests::{config_map, name, test_namespace, within};

/// The clients' own connect, read and write timeouts: a fault that makes a request fail
/// must do so well before this, or it is a hang that a timeout ended.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a stalled request is watched to show it hangs rather than fails.
const STALL: Duration = Duration::from_secs(2);

/// A proxy in front of the shared control plane, and a client that goes through it.
async fn proxied() -> (&'static TestEnv, FaultProxy, Client) {
    let env = TestEnv::shared().await;
    let proxy = within("the fault proxy to start", FaultProxy::for_apiserver(env))
        .await
        .expect("the fault proxy starts");
    let client = client_via(env, &proxy).await;
    (env, proxy, client)
}

async fn client_via(env: &TestEnv, proxy: &FaultProxy) -> Client {
    let mut config = env
        .config_via(proxy)
        .await
        .expect("a configuration via the proxy");
    config.connect_timeout = Some(CLIENT_TIMEOUT);
    config.read_timeout = Some(CLIENT_TIMEOUT);
    config.write_timeout = Some(CLIENT_TIMEOUT);
    Client::try_from(config).expect("a client via the proxy")
}

async fn list_namespaces(client: &Client) -> kube_client::Result<Vec<String>> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let list = namespaces.list(&ListParams::default()).await?;
    Ok(list.items.iter().map(name).collect())
}

/// Lists namespaces, and fails the test if that does not work within the patience.
async fn assert_lists(client: &Client, when: &str) {
    let names = within(&format!("a list {when}"), list_namespaces(client))
        .await
        .unwrap_or_else(|e| panic!("a list {when} failed: {e}"));
    assert!(
        names.iter().any(|n| n == "default"),
        "a list {when} lacks the default namespace: {names:?}"
    );
}

/// Lists namespaces and returns how long that took and how it ended.
async fn timed_list(client: &Client) -> (Duration, kube_client::Result<Vec<String>>) {
    let started = Instant::now();
    let result = within("a timed list", list_namespaces(client)).await;
    (started.elapsed(), result)
}

/// Whether `error` was caused by the connection (refused, reset, closed under the
/// request) rather than by a timeout or by an answer of the server.
fn is_connection_error(error: &kube_client::Error) -> bool {
    io_kinds(error).iter().any(|kind| {
        matches!(
            kind,
            ErrorKind::ConnectionRefused
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::UnexpectedEof
                | ErrorKind::BrokenPipe
        )
    }) || causes(error).any(|cause| {
        cause
            .downcast_ref::<hyper::Error>()
            .is_some_and(|e| e.is_incomplete_message() || e.is_closed() || e.is_canceled())
    })
}

/// The kinds of the I/O errors among `error`'s causes, including those wrapped in another
/// I/O error (the connector wraps the socket's), whose `source()` skips them.
fn io_kinds(error: &kube_client::Error) -> Vec<ErrorKind> {
    let mut kinds = Vec::new();
    for cause in causes(error) {
        let mut io = cause.downcast_ref::<std::io::Error>();
        while let Some(e) = io {
            kinds.push(e.kind());
            io = e.get_ref().and_then(|inner| inner.downcast_ref());
        }
    }
    kinds
}

fn causes(error: &kube_client::Error) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    std::iter::successors(
        Some(error as &(dyn std::error::Error + 'static)),
        |&e: &&(dyn std::error::Error + 'static)| e.source(),
    )
}

#[tokio::test]
async fn a_client_through_the_proxy_lists_namespaces() {
    let (env, proxy, client) = proxied().await;
    let (_, namespace) = test_namespace(env, "via-proxy").await;

    let names = within("a list through the proxy", list_namespaces(&client))
        .await
        .expect("a list through the proxy");
    assert!(
        names.contains(&namespace),
        "the list through {} lacks {namespace}: {names:?}",
        proxy.listen_addr()
    );
    assert_ne!(
        proxy.listen_addr(),
        env.apiserver_addr(),
        "the client must not reach the API server directly"
    );
    assert!(proxy.toxics().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_cut_refuses_connections_until_restored() {
    let (env, proxy, client) = proxied().await;
    assert_lists(&client, "before the cut").await;

    proxy.cut().await.unwrap();
    // The client's pooled connection is closed under it, or it connects anew and is
    // refused: either is a connection error, and comes long before the client's timeout.
    let (took, result) = timed_list(&client).await;
    let error = result.expect_err("a list through a cut proxy fails");
    assert!(
        is_connection_error(&error),
        "not a connection error: {error:?}"
    );
    assert!(
        took < CLIENT_TIMEOUT,
        "the failure took {took:?}: a timeout, not a refusal"
    );
    // A client with no connection yet shows the port itself refuses.
    let fresh = client_via(env, &proxy).await;
    let (took, result) = timed_list(&fresh).await;
    let error = result.expect_err("a new client's list through a cut proxy fails");
    assert!(
        io_kinds(&error).contains(&ErrorKind::ConnectionRefused),
        "not refused: {error:?}"
    );
    assert!(took < CLIENT_TIMEOUT, "the refusal took {took:?}");

    proxy.restore().await.unwrap();
    assert_lists(&client, "after the restore").await;
    assert_lists(&fresh, "by the new client after the restore").await;
}

#[tokio::test]
async fn reset_connections_fails_requests_until_cleared() {
    let (_env, proxy, client) = proxied().await;
    assert_lists(&client, "before the reset").await;

    proxy.reset_connections().await.unwrap();
    let (took, result) = timed_list(&client).await;
    let error = result.expect_err("a list through resetting connections fails");
    assert!(
        is_connection_error(&error),
        "not a connection error: {error:?}"
    );
    assert!(
        took < CLIENT_TIMEOUT,
        "the failure took {took:?}: a timeout, not a reset"
    );
    // The pooled connection is gone now; a new one is reset during its TLS handshake.
    let error = timed_list(&client)
        .await
        .1
        .expect_err("a list on a new connection is reset too");
    assert!(
        is_connection_error(&error),
        "not a connection error: {error:?}"
    );

    proxy.clear().await.unwrap();
    assert!(proxy.toxics().await.unwrap().is_empty());
    assert_lists(&client, "after the toxics are cleared").await;
}

#[tokio::test]
async fn a_stall_hangs_requests_and_clear_lets_new_ones_through() {
    let (_env, proxy, client) = proxied().await;
    assert_lists(&client, "before the stall").await;

    proxy.stall().await.unwrap();
    let hung = tokio::time::timeout(STALL, list_namespaces(&client)).await;
    assert!(
        hung.is_err(),
        "a list through a stalled proxy ended within {STALL:?} instead of hanging: {hung:?}"
    );

    proxy.clear().await.unwrap();
    assert_lists(&client, "after the stall is cleared").await;
}

#[tokio::test]
async fn latency_delays_each_round_trip_until_cleared() {
    let (_env, proxy, client) = proxied().await;
    assert_lists(&client, "before the latency").await;

    proxy
        .latency(Duration::from_millis(300), Duration::ZERO)
        .await
        .unwrap();
    let (took, result) = timed_list(&client).await;
    result.expect("a list through a slow proxy works");
    assert!(
        took >= Duration::from_millis(250),
        "a list with 300 ms of latency took {took:?}"
    );

    proxy.clear().await.unwrap();
    // The fastest of a few lists: a loaded machine may slow one, not all.
    let mut fastest = Duration::MAX;
    for _ in 0..3 {
        let (took, result) = timed_list(&client).await;
        result.expect("a list after the latency is cleared works");
        fastest = fastest.min(took);
    }
    assert!(
        fastest < Duration::from_millis(250),
        "lists still took at least {fastest:?} after the latency was cleared"
    );
}

#[tokio::test]
async fn bandwidth_throttles_a_large_response_until_cleared() {
    let (env, proxy, client) = proxied().await;
    let (direct, namespace) = test_namespace(env, "bandwidth").await;
    // 20 kB of data: at 10 kB/s its list takes two seconds, and without the limit
    // milliseconds.
    let payload = "x".repeat(20_000);
    Api::<ConfigMap>::namespaced(direct, &namespace)
        .create(
            &PostParams::default(),
            &config_map("large", &[("payload", &payload)]),
        )
        .await
        .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let list = async || {
        let started = Instant::now();
        let list = within(
            "a list of the large ConfigMap",
            config_maps.list(&ListParams::default()),
        )
        .await
        .expect("a list of the large ConfigMap");
        assert_eq!(list.items.len(), 1);
        started.elapsed()
    };
    list().await;

    proxy.bandwidth(10).await.unwrap();
    let took = list().await;
    assert!(
        took >= Duration::from_millis(1500),
        "20 kB at 10 kB/s arrived in {took:?}"
    );

    proxy.clear().await.unwrap();
    let fastest = list().await.min(list().await).min(list().await);
    assert!(
        fastest < Duration::from_millis(1000),
        "lists still took at least {fastest:?} after the limit was cleared"
    );
}

#[tokio::test]
async fn a_kubeconfig_via_the_proxy_serves_kubectl_and_sees_the_cut() {
    let (env, proxy, _client) = proxied().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    env.kubeconfig_via(&proxy, &kubeconfig).unwrap();
    let kubectl = env.binaries().kubectl();
    let get_namespaces = || {
        let kubectl = kubectl.clone();
        let kubeconfig = kubeconfig.clone();
        within(
            "kubectl get namespaces",
            tokio::task::spawn_blocking(move || {
                std::process::Command::new(kubectl)
                    .arg("--kubeconfig")
                    .arg(kubeconfig)
                    .args(["get", "namespaces", "-o", "name", "--request-timeout=5s"])
                    .output()
                    .expect("running kubectl")
            }),
        )
    };

    let output = get_namespaces().await.unwrap();
    assert!(output.status.success(), "kubectl via the proxy: {output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("namespace/default"), "{stdout}");

    proxy.cut().await.unwrap();
    let output = get_namespaces().await.unwrap();
    assert!(
        !output.status.success(),
        "kubectl through a cut proxy succeeded"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("refused") && stderr.contains(&proxy.listen_addr().to_string()),
        "kubectl does not say the proxy refused it: {stderr}"
    );
}
