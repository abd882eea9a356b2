//! The manager: what the tutorial's `main.go` sets up with controller-runtime, on
//! kube-informer. Flags, health and readiness probes, Prometheus metrics (the workqueue's),
//! optional leader election on a Lease, the selected controllers, graceful shutdown.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use futures::{FutureExt, future::BoxFuture};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube_client::{Api, Client, api::ListParams};
use kube_core::Resource;
use kube_informer::{
    ApiListWatch, Controller, ControllerConfig, InformerHandle, ObjectKey, SharedInformer, Store,
    leader_election::{LeaderElectionConfig, LeaderElectionError, LeaderElector},
    strip_managed_fields,
    workqueue::{Bucket, ItemExponentialFailure, MaxOf, PrometheusMetrics, RateLimitingQueue},
};
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::{
    crd::TraefikService,
    http::{self, Health},
    kv::{EtcdConfigError, EtcdOptions, TraefikKv},
    pods, services,
    services::UrlTemplate,
    traefik_service,
};

/// The command line: `traefik-operator [OPTIONS]` runs the manager,
/// `traefik-operator crd` prints the CRD manifest.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "traefik-operator",
    version,
    about = "Routes Kubernetes Services and TraefikService objects through Traefik by writing \
             them into Traefik's etcd (KV) provider."
)]
pub struct Cli {
    /// What to do (default: run the manager).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The manager's options.
    #[command(flatten)]
    pub options: Options,
}

/// Subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Print the TraefikService CRD manifest (YAML), generated from the Rust types.
    Crd,
}

/// A controller the manager can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ControllerKind {
    /// `TraefikService` objects become Traefik routes (needs the CRD).
    Traefikservices,
    /// Services annotated with `traefik.kube-informer.dev/entrypoint` become Traefik routes.
    Services,
    /// Log the state changes of Pods (the tutorial's Pod controller).
    Pods,
}

/// The manager's flags (every one also readable from the environment variable shown).
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// How to reach etcd: endpoints, root key, TLS, user and password.
    #[command(flatten)]
    pub etcd: EtcdOptions,

    /// Controllers to run, comma-separated.
    #[arg(
        long,
        env = "CONTROLLERS",
        value_enum,
        value_delimiter = ',',
        default_value = "traefikservices,services"
    )]
    pub controllers: Vec<ControllerKind>,

    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,

    /// Workers per controller.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,

    /// How a Service's backend URL is built; `{scheme}`, `{name}`, `{namespace}`, `{port}`
    /// and `{clusterIP}` are replaced.
    #[arg(long, env = "SERVICE_URL_TEMPLATE", default_value = UrlTemplate::IN_CLUSTER)]
    pub service_url_template: String,

    /// The address `/metrics` binds to; `0` turns it off.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_bind_address: String,

    /// The address `/healthz` and `/readyz` bind to; `0` turns them off.
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub health_probe_bind_address: String,

    /// Enable leader election: only the replica holding the Lease reconciles.
    #[arg(long, env = "LEADER_ELECT")]
    pub leader_elect: bool,

    /// The Lease's name.
    #[arg(long, default_value = "traefik-operator.traefik.kube-informer.dev")]
    pub leader_election_id: String,

    /// The Lease's namespace (default: `$POD_NAMESPACE`, the in-cluster namespace, or `default`).
    #[arg(long)]
    pub leader_election_namespace: Option<String>,

    /// This replica's identity in the Lease (default: `$POD_NAME` or the host name, plus a
    /// unique suffix).
    #[arg(long)]
    pub leader_election_identity: Option<String>,

    /// How long a Lease holds without renewal (e.g. `15s`).
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    pub lease_duration: Duration,

    /// How long the leader retries renewing before it gives up.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub renew_deadline: Duration,

    /// How often to try to acquire or renew the Lease.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub retry_period: Duration,

    /// Re-check every object (and repair etcd) this often.
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    pub resync_period: Duration,

    /// The longest wait before retrying a failed key (the backoff doubles from 5 ms up to it).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub max_retry_delay: Duration,
}

/// Parses `500ms`, `15s`, `2m`, `1h` (a bare number is seconds).
///
/// # Errors
///
/// A message naming the bad value.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 15s, 2m or 1h"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{text:?} has an unknown unit; use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// Why the manager stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// An HTTP endpoint could not be bound.
    #[error("cannot serve {what} on {addr}: {source}")]
    Bind {
        /// `metrics` or `health probes`.
        what: &'static str,
        /// The address.
        addr: String,
        /// The reason.
        source: std::io::Error,
    },
    /// The TraefikService CRD is not installed.
    #[error(
        "the TraefikService CRD is not installed (kubectl apply -f \
         examples/traefik-operator/config/crd/), or leave `traefikservices` out of --controllers"
    )]
    CrdMissing,
    /// RBAC forbids what a controller needs.
    #[error("not allowed to {what} (see examples/traefik-operator/config/rbac/): {source}")]
    Forbidden {
        /// What was attempted.
        what: String,
        /// The API server's answer.
        source: kube_client::Error,
    },
    /// Another API error during start-up.
    #[error("{what} failed: {source}")]
    Kube {
        /// What was attempted.
        what: String,
        /// The client's error.
        source: kube_client::Error,
    },
    /// A controller's cache can never sync.
    #[error("controller {name} stopped: {source}")]
    Controller {
        /// The controller.
        name: &'static str,
        /// The informer's error.
        source: kube_informer::Error,
    },
    /// The etcd settings are unusable (a missing or malformed file, a flag without its pair).
    #[error("unusable etcd settings: {0}")]
    EtcdConfig(#[from] EtcdConfigError),
    /// Leader election failed or leadership was lost.
    #[error(transparent)]
    LeaderElection(#[from] LeaderElectionError),
}

fn bind_address(text: &str) -> Option<Result<SocketAddr, String>> {
    if text == "0" || text.is_empty() {
        return None;
    }
    let text = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_owned()
    };
    Some(text.parse().map_err(|e| format!("{text}: {e}")))
}

fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "traefik-operator".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    format!("{host}_{}_{nanos:08x}", std::process::id())
}

fn default_lease_namespace() -> String {
    std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|n| n.trim().to_owned())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into())
}

/// Runs the manager until `cancel` fires (then stops gracefully and returns `Ok`).
///
/// # Errors
///
/// [`ManagerError`]: an address that cannot be bound, the CRD missing, RBAC forbidding
/// what a controller needs, a cache that can never sync, or lost leadership (a replica that
/// lost the Lease exits, as controller-runtime's do, and is restarted as a candidate).
pub async fn run(
    options: Options,
    client: Client,
    cancel: CancellationToken,
) -> Result<(), ManagerError> {
    let mut registry = Registry::default();
    let metrics = PrometheusMetrics::new(&mut registry);
    let health = Arc::new(Health::new(registry));
    let servers = CancellationToken::new();
    let mut server_tasks = Vec::new();
    for (what, text, paths) in [
        ("metrics", &options.metrics_bind_address, &["/metrics"][..]),
        (
            "health probes",
            &options.health_probe_bind_address,
            &["/healthz", "/readyz"][..],
        ),
    ] {
        let bind_error = |source| ManagerError::Bind {
            what,
            addr: text.clone(),
            source,
        };
        let Some(addr) = bind_address(text) else {
            continue;
        };
        let addr =
            addr.map_err(|e| bind_error(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
        let listener = http::bind(addr).await.map_err(bind_error)?;
        server_tasks.push(tokio::spawn(http::serve(
            listener,
            health.clone(),
            paths,
            servers.clone(),
        )));
    }

    let result = async {
        preflight(&client, &options).await?;
        let kv = Arc::new(TraefikKv::connect_with(&options.etcd)?);
        let parts = Parts {
            options: options.clone(),
            client: client.clone(),
            kv,
            metrics,
            health: health.clone(),
        };
        if options.leader_elect {
            let config = LeaderElectionConfig::new(
                options.leader_election_namespace.clone().unwrap_or_else(default_lease_namespace),
                options.leader_election_id.clone(),
                options.leader_election_identity.clone().unwrap_or_else(default_identity),
            )
            .timing(options.lease_duration, options.renew_deadline, options.retry_period);
            info!(lease = %format!("{}/{}", config.namespace, config.name), identity = %config.identity, "leader election enabled; waiting for the lease");
            let elector = LeaderElector::new(client.clone(), config)?;
            // A standby replica is healthy and ready; it just does not reconcile.
            health.set_ready(true);
            match elector.run(cancel.clone(), |leading| parts.run_controllers(leading)).await? {
                Some(result) => result,
                None => Ok(()),
            }
        } else {
            parts.run_controllers(cancel.child_token()).await
        }
    }
    .await;
    if let Err(err) = &result {
        error!(error = %err, "manager stopped");
    }
    servers.cancel();
    for task in server_tasks {
        let _ = task.await;
    }
    result
}

/// Checks, before anything starts, that the CRD exists and the controllers may list
/// what they watch, so a missing install step gives one clear error.
async fn preflight(client: &Client, options: &Options) -> Result<(), ManagerError> {
    for kind in &options.controllers {
        let (what, result) = match kind {
            ControllerKind::Traefikservices => (
                "list traefikservices",
                probe::<TraefikService>(client, options).await,
            ),
            ControllerKind::Services => ("list services", probe::<Service>(client, options).await),
            ControllerKind::Pods => ("list pods", probe::<Pod>(client, options).await),
        };
        match result {
            Ok(()) => {}
            Err(kube_client::Error::Api(s))
                if s.code == 404 && *kind == ControllerKind::Traefikservices =>
            {
                return Err(ManagerError::CrdMissing);
            }
            Err(source @ kube_client::Error::Api(_)) if matches!(&source, kube_client::Error::Api(s) if s.code == 403) =>
            {
                return Err(ManagerError::Forbidden {
                    what: what.to_owned(),
                    source,
                });
            }
            Err(source) => {
                return Err(ManagerError::Kube {
                    what: what.to_owned(),
                    source,
                });
            }
        }
    }
    Ok(())
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = kube_core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

async fn probe<K>(client: &Client, options: &Options) -> Result<(), kube_client::Error>
where
    K: Resource<Scope = kube_core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    api::<K>(client, options.namespace.as_deref())
        .list_metadata(&ListParams::default().limit(1))
        .await
        .map(|_| ())
}

struct Parts {
    options: Options,
    client: Client,
    kv: Arc<TraefikKv>,
    metrics: PrometheusMetrics,
    health: Arc<Health>,
}

type Task = BoxFuture<'static, Result<(), ManagerError>>;

impl Parts {
    fn informer<K>(&self) -> SharedInformer<K>
    where
        K: Resource<Scope = kube_core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        SharedInformer::builder(ApiListWatch::new(api::<K>(
            &self.client,
            self.options.namespace.as_deref(),
        )))
        .resync_period(self.options.resync_period)
        .transform(strip_managed_fields)
        .build()
    }

    fn config(&self, name: &'static str) -> ControllerConfig {
        let limiter: MaxOf<ObjectKey> = MaxOf::new(vec![
            Box::new(ItemExponentialFailure::new(
                Duration::from_millis(5),
                self.options.max_retry_delay,
            )),
            Box::new(Bucket::new(10.0, 100)),
        ]);
        ControllerConfig::named(name)
            .workers(self.options.workers)
            // Failures are outages (etcd, API server) that end: retry until they do.
            .max_requeues(None)
            .rate_limiter(limiter)
            .metrics(self.metrics.clone())
    }

    /// Runs every selected controller until `token` fires or one fails.
    async fn run_controllers(self, token: CancellationToken) -> Result<(), ManagerError> {
        self.health.set_ready(false);
        if let Err(err) = self.kv.ensure_placeholder().await {
            warn!(error = %err, detail = %err.detail(), "etcd not reachable at start; syncs will retry");
        }
        let mut tasks: Vec<Task> = Vec::new();
        let mut synced: Vec<BoxFuture<'static, ()>> = Vec::new();
        for kind in self.options.controllers.clone() {
            match kind {
                ControllerKind::Traefikservices => {
                    let controller = Controller::new(
                        self.informer::<TraefikService>(),
                        self.config("traefikservices"),
                    );
                    let reconciler = traefik_service::Reconciler {
                        client: self.client.clone(),
                        kv: self.kv.clone(),
                        store: controller.store(),
                    };
                    synced.push(wait_synced(controller.informer()));
                    tokio::spawn(sweep(
                        self.kv.clone(),
                        traefik_service::ROUTE_PREFIX,
                        traefik_service::key_of_route,
                        controller.informer(),
                        controller.queue(),
                        self.options.resync_period,
                        token.clone(),
                    ));
                    tasks.push(named(
                        "traefikservices",
                        controller.run(token.clone(), move |key| {
                            let reconciler = reconciler.clone();
                            async move { reconciler.sync(key).await }
                        }),
                    ));
                }
                ControllerKind::Services => {
                    let controller =
                        Controller::new(self.informer::<Service>(), self.config("services"));
                    let reconciler = services::Reconciler {
                        kv: self.kv.clone(),
                        store: controller.store(),
                        template: UrlTemplate(self.options.service_url_template.clone()),
                    };
                    synced.push(wait_synced(controller.informer()));
                    tokio::spawn(sweep(
                        self.kv.clone(),
                        services::ROUTE_PREFIX,
                        services::key_of_route,
                        controller.informer(),
                        controller.queue(),
                        self.options.resync_period,
                        token.clone(),
                    ));
                    tasks.push(named(
                        "services",
                        controller.run(token.clone(), move |key| {
                            let reconciler = reconciler.clone();
                            async move { reconciler.sync(key).await }
                        }),
                    ));
                }
                ControllerKind::Pods => {
                    let controller = Controller::new(self.informer::<Pod>(), self.config("pods"));
                    let reconciler = pods::Reconciler::new(controller.store());
                    synced.push(wait_synced(controller.informer()));
                    tasks.push(named(
                        "pods",
                        controller.run(token.clone(), move |key| {
                            let reconciler = reconciler.clone();
                            async move { reconciler.sync(key).await }
                        }),
                    ));
                }
            }
        }
        let health = self.health.clone();
        let ready_token = token.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = ready_token.cancelled() => {}
                _ = futures::future::join_all(synced) => {
                    info!("all caches synced; ready");
                    health.set_ready(true);
                }
            }
        });
        // One failing controller (say, forbidden by RBAC) stops the others.
        let tasks = tasks.into_iter().map(|task| {
            let token = token.clone();
            async move {
                let result = task.await;
                if result.is_err() {
                    token.cancel();
                }
                result
            }
        });
        let results = futures::future::join_all(tasks).await;
        results
            .into_iter()
            .collect::<Result<Vec<()>, _>>()
            .map(|_| ())
    }
}

fn named(
    name: &'static str,
    run: impl Future<Output = Result<(), kube_informer::Error>> + Send + 'static,
) -> Task {
    run.map(move |r| r.map_err(|source| ManagerError::Controller { name, source }))
        .boxed()
}

fn wait_synced<K: Resource + Send + Sync + 'static>(
    informer: InformerHandle<K>,
) -> BoxFuture<'static, ()> {
    async move { informer.wait_synced().await }.boxed()
}

/// Once the cache has synced, and every `period` after, enqueues the objects whose routes
/// are in etcd but which no longer exist (deleted while no operator was running), so their
/// sync removes the routes.
async fn sweep<K: Resource + Send + Sync + 'static>(
    kv: Arc<TraefikKv>,
    prefix: &'static str,
    key_of_route: fn(&str) -> Option<ObjectKey>,
    informer: InformerHandle<K>,
    queue: RateLimitingQueue<ObjectKey>,
    period: Duration,
    token: CancellationToken,
) {
    tokio::select! {
        () = token.cancelled() => return,
        () = informer.wait_synced() => {}
    }
    let store: Store<K> = informer.store();
    loop {
        match kv.route_names(prefix).await {
            Ok(names) => {
                for key in names.iter().filter_map(|n| key_of_route(n)) {
                    if !store.contains_key(&key) {
                        info!(%key, "route of a vanished object found in etcd; removing it");
                        queue.add(key);
                    }
                }
            }
            Err(err) => warn!(error = %err, "could not look for leftover routes in etcd"),
        }
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3d").is_err());
    }

    #[test]
    fn flags_parse_with_defaults() {
        let cli = Cli::try_parse_from([
            "traefik-operator",
            "--controllers",
            "pods,services",
            "--leader-elect",
        ])
        .unwrap();
        assert_eq!(
            cli.options.controllers,
            [ControllerKind::Pods, ControllerKind::Services]
        );
        assert!(cli.options.leader_elect);
        assert_eq!(cli.options.etcd.endpoints, ["127.0.0.1:2379"]);
        assert_eq!(cli.options.etcd.max_txn_ops, 128);
        assert_eq!(
            bind_address(":8081").unwrap(),
            Ok("0.0.0.0:8081".parse().unwrap())
        );
        assert!(bind_address("0").is_none());
        let help = Cli::try_parse_from(["traefik-operator", "--help"])
            .unwrap_err()
            .to_string();
        assert!(
            help.contains("--leader-elect") && help.contains("--etcd-endpoints"),
            "{help}"
        );
    }
}
