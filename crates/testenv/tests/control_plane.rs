//! Crashes and restarts of the control plane's components: etcd stopped or killed under a
//! running kube-apiserver, which must reconnect by itself to the same data, and
//! kube-apiserver killed outright, which must start again on the same port.
//!
//! Each test starts a private control plane, since each breaks it.

use std::{
    future::Future,
    io::ErrorKind,
    net::TcpStream,
    path::Path,
    time::{Duration, Instant},
};

use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use kube_testenv::{Error, TestEnv};

/// How long a component may take to come back, and any one step of a test to finish.
const PATIENCE: Duration = Duration::from_secs(60);

/// How long one request may take before it counts as unanswered.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Awaits `future`, failing the test if it takes longer than [`PATIENCE`].
async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {PATIENCE:?}"))
}

fn config_map(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some([("key".to_owned(), value.to_owned())].into()),
        ..Default::default()
    }
}

/// A private control plane, a namespace in it holding a ConfigMap named `kept`, and the
/// namespace's ConfigMaps.
async fn with_kept_config_map(prefix: &str) -> (TestEnv, String, Api<ConfigMap>) {
    let env = within("the control plane to start", TestEnv::builder().start())
        .await
        .expect("the control plane starts");
    let namespace = env.create_namespace(prefix).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().await.unwrap(), &namespace);
    api.create(&PostParams::default(), &config_map("kept", "before"))
        .await
        .unwrap();
    (env, namespace, api)
}

/// kube-apiserver's `/readyz?verbose`: whether it answered 200, and the list of checks.
async fn readyz(client: &Client) -> Result<(bool, String), String> {
    let request = http::Request::get("/readyz?verbose")
        .body(Vec::new())
        .expect("static request");
    let exchange = async {
        let response = client.send(request.map(Into::into)).await?;
        let ok = response.status().is_success();
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, kube_client::Error>((ok, String::from_utf8_lossy(&body).into_owned()))
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
    }
}

/// Polls `/readyz` until it answers 200 (`ready`) or anything else (not `ready`), failing
/// the test after [`PATIENCE`] with the last answer.
async fn await_readyz(client: &Client, ready: bool) -> String {
    let started = Instant::now();
    loop {
        let answer = readyz(client).await;
        match &answer {
            Ok((ok, body)) if *ok == ready => return body.clone(),
            Err(reason) if !ready => return reason.clone(),
            _ => {}
        }
        assert!(
            started.elapsed() < PATIENCE,
            "kube-apiserver's /readyz did not turn {} within {PATIENCE:?}; last answer: \
             {answer:?}",
            if ready { "ready" } else { "unready" },
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Reads the ConfigMap `kept`, which must hold what was written before, then writes a new
/// one, which must succeed.
///
/// The read is retried until [`PATIENCE`] runs out while it fails for want of storage
/// (`/readyz` may still show a result cached from before an outage), but not when the
/// API server answers that the ConfigMap does not exist: then the data is lost.
async fn assert_kept_and_writable(api: &Api<ConfigMap>, when: &str) {
    let started = Instant::now();
    let kept = loop {
        let error = match tokio::time::timeout(REQUEST_TIMEOUT, api.get("kept")).await {
            Ok(Ok(kept)) => break kept,
            Ok(Err(kube_client::Error::Api(status))) if status.code == 404 => {
                panic!("the ConfigMap is gone {when}: {status:?}")
            }
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {REQUEST_TIMEOUT:?}"),
        };
        assert!(
            started.elapsed() < PATIENCE,
            "reading the ConfigMap {when} still failed after {PATIENCE:?}: {error}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        kept.data.unwrap()["key"],
        "before",
        "the ConfigMap {when} holds what was written before"
    );
    let name = format!("written-{}", when.replace(' ', "-"));
    within(
        &format!("a write {when}"),
        api.create(&PostParams::default(), &config_map(&name, "after")),
    )
    .await
    .unwrap_or_else(|e| panic!("a write {when} failed: {e}"));
    let written = api.get(&name).await.unwrap();
    assert_eq!(written.data.unwrap()["key"], "after");
}

#[tokio::test]
async fn data_survives_an_etcd_restart_under_a_running_apiserver() {
    let (env, _, api) = with_kept_config_map("etcd-restart").await;
    let client = env.client().await.unwrap();
    let etcd_url = env.etcd_url();
    let old_pid = env.etcd_pid();
    let apiserver_pid = env.apiserver_pid().expect("kube-apiserver runs");

    within("etcd to restart", env.restart_etcd())
        .await
        .expect("etcd restarts");
    assert!(env.etcd_running());
    assert!(!process_exists(old_pid), "the old etcd {old_pid} is gone");
    let new_pid = env.etcd_pid();
    assert_ne!(new_pid, old_pid, "a restart runs a new etcd process");
    assert!(process_exists(new_pid));
    assert_eq!(env.etcd_url(), etcd_url, "etcd is back on the same port");
    assert_eq!(
        env.apiserver_pid(),
        Some(apiserver_pid),
        "kube-apiserver was left running"
    );
    let mut pids = env.pids();
    pids.sort_unstable();
    let mut expected = vec![new_pid, apiserver_pid];
    expected.sort_unstable();
    assert_eq!(pids, expected);

    await_readyz(&client, true).await;
    assert_kept_and_writable(&api, "after the etcd restart").await;
    let kept = api.get("kept").await.unwrap();
    let revision = env.compact_etcd().await.expect("compaction works again");
    assert!(
        revision
            > kept
                .metadata
                .resource_version
                .unwrap()
                .parse::<i64>()
                .unwrap(),
        "the new etcd holds the revisions written since the restart"
    );
}

#[tokio::test]
async fn a_killed_etcd_makes_the_apiserver_unready_until_started_again() {
    let (env, _, api) = with_kept_config_map("etcd-kill").await;
    let client = env.client().await.unwrap();
    let old_pid = env.etcd_pid();
    let etcd_port = env
        .etcd_url()
        .rsplit(':')
        .next()
        .unwrap()
        .parse::<u16>()
        .unwrap();

    env.kill_etcd().await;
    assert!(!env.etcd_running());
    assert!(
        !process_exists(old_pid),
        "the killed etcd {old_pid} is gone and reaped"
    );
    assert_eq!(
        env.pids(),
        vec![env.apiserver_pid().expect("kube-apiserver runs")],
        "only kube-apiserver runs"
    );
    let refused = TcpStream::connect(("127.0.0.1", etcd_port)).map(|_| ());
    assert_eq!(
        refused.map_err(|e| e.kind()),
        Err(ErrorKind::ConnectionRefused),
        "nothing listens on etcd's port"
    );
    let compaction = env.compact_etcd().await;
    assert!(
        matches!(compaction, Err(Error::EtcdStopped)),
        "compacting a stopped etcd: {compaction:?}"
    );
    env.kill_etcd().await; // Killing it again does nothing.
    let unready = await_readyz(&client, false).await;
    assert!(
        unready.contains("[-]etcd"),
        "kube-apiserver is unready because of etcd: {unready}"
    );

    within("etcd to start again", env.start_etcd())
        .await
        .expect("etcd starts again");
    assert!(env.etcd_running());
    assert_ne!(env.etcd_pid(), old_pid);
    within("a second start", env.start_etcd())
        .await
        .expect("starting a running etcd does nothing");
    await_readyz(&client, true).await;
    assert_kept_and_writable(&api, "after the etcd crash").await;
}

#[tokio::test]
async fn a_killed_apiserver_is_unreachable_until_started_again() {
    let (env, namespace, api) = with_kept_config_map("apiserver-kill").await;
    let pid = env.apiserver_pid().expect("kube-apiserver runs");
    let log = env.log_path("kube-apiserver");
    // What kube-apiserver logs when it shuts down gracefully, and never when it is killed.
    let graceful = format!("Stopped listening on {}", env.apiserver_addr());
    let graceful_stops = || {
        std::fs::read_to_string(&log)
            .unwrap()
            .matches(&graceful)
            .count()
    };

    env.kill_apiserver().await;
    assert!(!env.apiserver_running());
    assert_eq!(env.apiserver_pid(), None);
    assert!(!process_exists(pid), "the killed kube-apiserver is reaped");
    assert_eq!(graceful_stops(), 0, "kube-apiserver shut down gracefully");
    let refused = TcpStream::connect(env.apiserver_addr()).map(|_| ());
    assert_eq!(
        refused.map_err(|e| e.kind()),
        Err(ErrorKind::ConnectionRefused),
        "nothing listens on the API server's port"
    );
    let error = within("a request to a killed API server to fail", api.get("kept"))
        .await
        .expect_err("a request to a killed API server fails");
    assert!(
        error.to_string().to_lowercase().contains("connect"),
        "the error says the server cannot be reached: {error}"
    );
    assert_eq!(env.pids(), vec![env.etcd_pid()], "only etcd runs");

    within("kube-apiserver to start again", env.start_apiserver())
        .await
        .expect("kube-apiserver starts again");
    assert!(env.apiserver_running());
    assert_ne!(env.apiserver_pid(), Some(pid));
    let api: Api<ConfigMap> = Api::namespaced(env.client().await.unwrap(), &namespace);
    assert_kept_and_writable(&api, "after the kube-apiserver crash").await;

    // The marker above is real: a graceful stop does log it.
    env.stop_apiserver().await;
    assert_eq!(graceful_stops(), 1, "a graceful stop logs {graceful:?}");
}
