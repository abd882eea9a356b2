//! The operator's command line: what the tutorial's `main.go` takes as flags, each also
//! readable from the environment variable shown in `--help`.

use std::{net::SocketAddr, time::Duration};

use kube_informer::{
    ObjectKey, Scope,
    leader_election::{self, LeaderElectionConfig},
    workqueue::{Bucket, ItemExponentialFailure, MaxOf},
};

use super::{
    etcd::EtcdOptions,
    policy::{Cidr, DEFAULT_DENIED_BACKENDS, HostPolicy, Policy},
    services::UrlTemplate,
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

    /// The address `/metrics` binds to (`:8080` for every interface); `0` turns it off.
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = "127.0.0.1:8080")]
    pub metrics_bind_address: String,

    /// The address `/healthz` and `/readyz` bind to (`:8081` for every interface); `0`
    /// turns them off.
    #[arg(
        long,
        env = "HEALTH_PROBE_BIND_ADDRESS",
        default_value = "127.0.0.1:8081"
    )]
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

    /// Routes' hosts are `<name>.<namespace>.<domain>` (`<name>.<namespace>` when empty):
    /// the default rule, and the only host a rule may use with `--host-policy=own-name`.
    #[arg(long, env = "ROUTE_DOMAIN", default_value = "")]
    pub domain: String,

    /// Which hosts a namespace's rules may claim: `own-name` (`<name>.<namespace>.<domain>`),
    /// `namespace` (anything under `<namespace>.<domain>`), or `any` (any host no other
    /// namespace holds).
    #[arg(long, env = "HOST_POLICY", value_enum, default_value = "own-name")]
    pub host_policy: HostPolicy,

    /// The Traefik entrypoints routes may use, comma-separated.
    #[arg(
        long,
        env = "ALLOWED_ENTRYPOINTS",
        value_delimiter = ',',
        default_value = "web,websecure"
    )]
    pub allowed_entrypoints: Vec<String>,

    /// Backend address ranges refused, comma-separated (default: loopback, link-local and
    /// cloud metadata addresses).
    #[arg(long, env = "DENY_BACKENDS", value_delimiter = ',', default_value = DEFAULT_DENIED_BACKENDS)]
    pub deny_backends: Vec<Cidr>,

    /// Backend address ranges allowed even when denied, comma-separated (etcd's own
    /// endpoints are refused regardless).
    #[arg(long, env = "ALLOW_BACKENDS", value_delimiter = ',')]
    pub allow_backends: Vec<Cidr>,

    /// This operator instance's name in the route ownership records: operators with
    /// different names (for different namespaces or tenants) share one Traefik root, and
    /// each touches only its own routes.
    #[arg(long, env = "INSTANCE", default_value = "traefik-operator")]
    pub instance: String,

    /// Where route ownership records are kept in etcd (default
    /// `kube-informer/traefik-operator/<root key>/`); outside the root key, since Traefik
    /// would read them as configuration. The etcd user needs readwrite here too.
    #[arg(long, env = "ETCD_OWNER_PREFIX")]
    pub etcd_owner_prefix: Option<String>,

    /// How long reconciles get to finish once a shutdown starts (keep it under the Pod's
    /// termination grace period).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub graceful_shutdown_timeout: Duration,

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

impl Options {
    /// What the informers watch: `--namespace`, or every namespace.
    pub fn scope(&self) -> Scope {
        match &self.namespace {
            Some(namespace) => Scope::namespace(namespace),
            None => Scope::all(),
        }
    }

    /// Where the probes are served (`None`: nowhere).
    ///
    /// # Errors
    ///
    /// The flag's text when it is not an address.
    pub fn probe_address(&self) -> Result<Option<SocketAddr>, String> {
        bind_address(&self.health_probe_bind_address).transpose()
    }

    /// Where `/metrics` is served (`None`: nowhere).
    ///
    /// # Errors
    ///
    /// The flag's text when it is not an address.
    pub fn metrics_address(&self) -> Result<Option<SocketAddr>, String> {
        bind_address(&self.metrics_bind_address).transpose()
    }

    /// The retry backoff of every controller: 5 ms doubling up to `--max-retry-delay` per
    /// key, at most 10 retries a second (bursts of 100) overall.
    pub fn retry_limiter(&self) -> MaxOf<ObjectKey> {
        MaxOf::new(vec![
            Box::new(ItemExponentialFailure::new(
                Duration::from_millis(5),
                self.max_retry_delay,
            )),
            Box::new(Bucket::new(10.0, 100)),
        ])
    }

    /// Where the route ownership records are.
    pub fn owner_prefix(&self) -> String {
        self.etcd_owner_prefix.clone().unwrap_or_else(|| {
            format!(
                "kube-informer/traefik-operator/{}/",
                self.etcd.root_key.trim_matches('/')
            )
        })
    }

    /// The route policy the flags set.
    ///
    /// # Errors
    ///
    /// `--host-policy=namespace` without `--domain`.
    pub fn policy(&self) -> Result<Policy, String> {
        if self.host_policy == HostPolicy::Namespace && self.domain.is_empty() {
            return Err(
                "--host-policy=namespace needs --domain: without one, namespace `com` \
                        could claim any host under .com"
                    .into(),
            );
        }
        Ok(Policy {
            domain: self.domain.trim_matches('.').to_ascii_lowercase(),
            hosts: self.host_policy,
            entrypoints: self.allowed_entrypoints.clone(),
            denied_backends: self.deny_backends.clone(),
            allowed_backends: self.allow_backends.clone(),
            etcd_endpoints: self.etcd.endpoints.clone(),
        })
    }

    /// The Lease and timing `--leader-elect` uses.
    pub fn leader_election(&self) -> LeaderElectionConfig {
        LeaderElectionConfig::new(
            self.leader_election_namespace
                .clone()
                .unwrap_or_else(leader_election::default_namespace),
            self.leader_election_id.clone(),
            self.leader_election_identity
                .clone()
                .unwrap_or_else(leader_election::default_identity),
        )
        .timing(self.lease_duration, self.renew_deadline, self.retry_period)
    }
}

/// `None` for `0` (off); `:port` binds every interface.
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
        // Probes and metrics stay on loopback unless an address is given (the Deployment
        // gives the Pod's).
        assert_eq!(
            cli.options.probe_address(),
            Ok(Some("127.0.0.1:8081".parse().unwrap()))
        );
        assert_eq!(
            cli.options.metrics_address(),
            Ok(Some("127.0.0.1:8080".parse().unwrap()))
        );
        let help = Cli::try_parse_from(["traefik-operator", "--help"])
            .unwrap_err()
            .to_string();
        assert!(
            help.contains("--leader-elect") && help.contains("--etcd-endpoints"),
            "{help}"
        );
    }
}
