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
    assert!(
        informer.has_synced(),
        "a stalled cache still says it has synced"
    );

    // Lifted: the cache catches up, and the probe with it. As in calm, writes here pass
    // whatever version a probe read (other tests' writes move it too).
    proxy.clear().await.expect("the link flows again");
    eventually("the write made during the stall cached", || {
        informer
            .store()
            .get_by_key(format!("{namespace}/during"))
            .is_some()
    })
    .await;
    let mut written = 0;
    loop {
        let now = staleness();
        if now.behind < Duration::from_secs(1) && now.passed > during.passed {
            break;
        }
        api.create(
            &PostParams::default(),
            &config_map(&format!("after-{written}"), &[]),
        )
        .await
        .expect("a ConfigMap after the stall");
        written += 1;
        assert!(
            written < 300,
            "the cache never read as current again: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cancel.cancel();
    factory.shutdown().await;
}

/// What an orphan-deleting controller did with a child: `deleted`, `kept` or `refused`.
type Decisions = std::sync::Arc<std::sync::Mutex<Vec<(String, &'static str)>>>;

/// A controller that deletes ConfigMaps whose owner (the Secret their `owner` label names)
/// its cache does not hold; `guarded`, it confirms the owner's absence first.
fn orphan_deleter(
    name: &'static str,
    children: kube_informer::InformerHandle<ConfigMap>,
    owners: kube_informer::InformerHandle<k8s_openapi::api::core::v1::Secret>,
    client: kube_client::Client,
    guarded: bool,
    decisions: &Decisions,
    cancel: CancellationToken,
) -> impl std::future::Future<Output = Result<(), kube_informer::Error>> + Send + 'static {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Secret;
    use kube_informer::{
        Action, ClientError, Controller, ControllerClient, ObjectKey, ReconcileRequest,
        retry_with_backoff,
    };

    let store = children.store();
    let controller = Controller::new(name, children).watches(owners, move |owner: &Secret| {
        let owner = owner.metadata.name.clone().unwrap_or_default();
        store
            .list()
            .into_iter()
            .filter(|c| c.metadata.labels.as_ref().and_then(|l| l.get("owner")) == Some(&owner))
            .filter_map(|c| ObjectKey::from_object(&*c).ok())
            .collect()
    });
    let writes = Arc::new(controller.client(client));
    let decisions = decisions.clone();
    let reconcile = move |request: ReconcileRequest<ConfigMap>, client: Arc<ControllerClient>| {
        let decisions = decisions.clone();
        async move {
            let ReconcileRequest::Present(child) = request else {
                return Ok(Action::done());
            };
            let key = ObjectKey::from_object(&*child).expect("a cached child has a name");
            let owner = child
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("owner"))
                .cloned()
                .unwrap_or_default();
            let owner = ObjectKey::new(child.metadata.namespace.as_deref(), &owner);
            let record = |what| {
                decisions
                    .lock()
                    .expect("not poisoned")
                    .push((key.name().to_owned(), what));
            };
            let owners = client.store::<Secret>().expect("the owners' cache");
            if owners.get_by_key(&owner).is_some() {
                record("kept");
                return Ok(Action::done());
            }
            if guarded
                && let Err(error) = client
                    .confirm_cached::<Secret>(&owner, Duration::from_secs(1))
                    .await
            {
                record("refused");
                return Err(error);
            }
            client.delete::<ConfigMap>(&key).await?;
            record("deleted");
            Ok::<_, ClientError>(Action::done())
        }
    };
    controller.run((reconcile, retry_with_backoff(), writes), cancel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observability_the_guard_refuses_a_delete_that_a_stale_cache_would_make() {
    use k8s_openapi::api::core::v1::Secret;

    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "guard").await;
    let proxy = within("the fault proxy to start", FaultProxy::for_apiserver(env))
        .await
        .expect("the fault proxy starts");
    // The owners' informer goes through the proxy, with a staleness probe; the children's
    // does not.
    let stalled = InformerFactory::with_defaults(
        env.client_via(&proxy)
            .await
            .expect("a client via the proxy"),
        FactoryDefaults::default().staleness_probe(Duration::from_millis(300)),
    );
    let direct = InformerFactory::new(client.clone());
    let owners = stalled.informer::<Secret>(Scope::namespace(&namespace));
    let decisions = Decisions::default();
    let scope = |guard: &str| Scope::namespace(&namespace).labels(format!("guard={guard}"));
    let cancel = CancellationToken::new();
    stalled.start(&cancel);
    direct.start(&cancel);
    let guarded = tokio::spawn(orphan_deleter(
        "guarded",
        direct.informer::<ConfigMap>(scope("yes")),
        owners.clone(),
        client.clone(),
        true,
        &decisions,
        cancel.clone(),
    ));
    let unguarded = tokio::spawn(orphan_deleter(
        "unguarded",
        direct.informer::<ConfigMap>(scope("no")),
        owners.clone(),
        client.clone(),
        false,
        &decisions,
        cancel.clone(),
    ));
    within("the owners' informer to sync", owners.wait_synced()).await;

    // The owners' link stalls, and the probe says so before anything else happens.
    proxy.stall().await.expect("the link stalls");
    eventually("the owners' cache known to be behind", || {
        owners
            .staleness()
            .is_some_and(|s| s.behind > Duration::from_secs(2))
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let owner: Secret =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": "owner" } }))
            .expect("a Secret");
    secrets
        .create(&PostParams::default(), &owner)
        .await
        .expect("the owner");
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    for guard in ["yes", "no"] {
        let child = tests::labelled(
            &format!("child-{guard}"),
            &[("owner", "owner"), ("guard", guard)],
        );
        configs
            .create(&PostParams::default(), &child)
            .await
            .expect("a child");
    }
    let decided = |child: &str, what: &str| {
        decisions
            .lock()
            .expect("not poisoned")
            .iter()
            .any(|(c, w)| c == child && *w == what)
    };
    // Without the guard, the stale cache's word deletes a child whose owner exists.
    eventually("the unguarded controller deleted its child", || {
        decided("child-no", "deleted")
    })
    .await;
    // With it, the same decision is refused.
    eventually("the guarded controller refused", || {
        decided("child-yes", "refused")
    })
    .await;
    assert!(!decided("child-yes", "deleted"));
    assert!(
        configs
            .get_opt("child-yes")
            .await
            .expect("a read")
            .is_some()
    );
    assert!(configs.get_opt("child-no").await.expect("a read").is_none());

    // Lifted: the owners' cache catches up, and the guarded child is kept.
    proxy.clear().await.expect("the link flows again");
    eventually("the guarded child kept once the cache caught up", || {
        decided("child-yes", "kept")
    })
    .await;
    assert!(!decided("child-yes", "deleted"));
    cancel.cancel();
    for controller in [guarded, unguarded] {
        within("a controller to stop", controller)
            .await
            .expect("its task")
            .expect("it stops cleanly");
    }
}

/// Percent-encodes `text` for a URL's query.
fn query_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A free port on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observability_every_dashboard_query_returns_data_from_a_real_prometheus() {
    use std::{
        collections::HashSet,
        sync::{Arc, Mutex},
    };

    use kube_informer::{Action, ClusterSource, Manager, ReconcileRequest, retry_with_backoff};

    // A manager running a controller, with a staleness probe, on the library's client.
    let env = TestEnv::shared().await;
    let (client, namespace) = test_namespace(env, "dashboard").await;
    let own_client = ClusterSource::default()
        .kubeconfig(env.kubeconfig_path())
        .client()
        .await
        .expect("a client");
    let factory = InformerFactory::with_defaults(
        own_client,
        FactoryDefaults::default().staleness_probe(Duration::from_secs(1)),
    );
    let loopback = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    let mut manager = Manager::with_factory(factory)
        .probe_address(None)
        .metrics_address(loopback);
    let controller = manager.controller::<ConfigMap>("dashboard", Scope::namespace(&namespace));
    // Each object's first reconcile fails, so the error series has data too.
    let failed_once = Arc::new(Mutex::new(HashSet::<String>::new()));
    let reconcile = move |request: ReconcileRequest<ConfigMap>,
                          failed: Arc<Mutex<HashSet<String>>>| async move {
        if failed
            .lock()
            .expect("not poisoned")
            .insert(request.key().to_string())
        {
            return Err(std::io::Error::other("a first attempt fails"));
        }
        Ok(Action::done())
    };
    manager.add_controller(controller, (reconcile, retry_with_backoff(), failed_once));
    let manager = manager.bind().await.expect("the manager binds");
    let metrics = manager.metrics_address().expect("metrics");
    let cancel = CancellationToken::new();
    let running = tokio::spawn(manager.run(cancel.clone()));

    // Changes keep coming while Prometheus scrapes, so rates have data.
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let writer = tokio::spawn({
        let (api, cancel) = (api.clone(), cancel.clone());
        async move {
            let mut i = 0;
            while !cancel.is_cancelled() {
                let _ = api
                    .create(&PostParams::default(), &config_map(&format!("cm-{i}"), &[]))
                    .await;
                i += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    });

    // A real Prometheus scraping it every second.
    let prometheus_bin = std::env::var("PROMETHEUS_BIN").unwrap_or_else(|_| "prometheus".into());
    let dir = tempfile::tempdir().expect("a directory");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: controller\n    static_configs:\n      - targets: ['{metrics}']\n"
        ),
    )
    .expect("the configuration");
    let port = free_port();
    let mut prometheus = tokio::process::Command::new(&prometheus_bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("starting {prometheus_bin} (scripts/test.sh installs Debian's prometheus): {e}")
        });
    let prometheus_addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    tests::eventually_some("Prometheus to be ready", || async {
        tokio::net::TcpStream::connect(prometheus_addr).await.ok()?;
        (tests::http_get(prometheus_addr, "/-/ready").await.0 == 200).then_some(())
    })
    .await;

    // Every query of the dashboard, with Grafana's variables filled in, returns a number.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../dashboards/kube-informer.json"
        ))
        .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let queries: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|target| target["expr"].as_str().map(str::to_owned))
        .collect();
    assert!(queries.len() >= 10, "{queries:?}");
    for query in &queries {
        let filled = query
            .replace("$__rate_interval", "30s")
            .replace("$controller", ".*");
        let path = format!("/api/v1/query?query={}", query_escape(&filled));
        let series = tests::eventually_some(&format!("series for {query}"), || async {
            let (status, body) = tests::http_get(prometheus_addr, &path).await;
            let answer: serde_json::Value = serde_json::from_str(&body).ok()?;
            let result = answer["data"]["result"].as_array()?;
            // A value of NaN is a series with nothing to draw (a histogram without its
            // +Inf bucket gives `histogram_quantile` NaN): at least one must be a number.
            let finite = result.iter().any(|series| {
                series["value"][1]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(f64::is_finite)
            });
            (status == 200 && finite).then_some(result.len())
        })
        .await;
        assert!(series >= 1);
    }

    // Opt-in: the docs' picture of the dashboard, drawn from this Prometheus.
    if let Some(picture) = std::env::var_os("DASHBOARD_PICTURE").filter(|p| !p.is_empty()) {
        let seconds: u64 = std::env::var("DASHBOARD_PICTURE_SECONDS").map_or(150, |s| {
            s.parse()
                .expect("DASHBOARD_PICTURE_SECONDS is a whole number of seconds")
        });
        // Not a wait for anything: the writer and the controller keep going this long so
        // the picture has minutes of rates and quantiles to draw, not the first few seconds.
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let status = tokio::process::Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../scripts/dashboard_picture.py"
            ))
            .arg("--prometheus")
            .arg(format!("http://{prometheus_addr}"))
            .arg("--out")
            .arg(&picture)
            .arg("--minutes")
            .arg(seconds.div_ceil(60).to_string())
            .status()
            .await
            .expect("python3 runs scripts/dashboard_picture.py");
        assert!(status.success(), "dashboard_picture.py: {status}");
        let written = std::fs::metadata(&picture).expect("the picture is written");
        assert!(written.len() > 0, "the picture {picture:?} is empty");
    }

    cancel.cancel();
    let _ = writer.await;
    within("the manager to stop", running)
        .await
        .expect("its task")
        .expect("it stops cleanly");
    let _ = prometheus.kill().await;
}
