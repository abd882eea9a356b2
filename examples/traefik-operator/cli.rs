//! The operator's command line: what the tutorial's `main.go` takes as flags, each also
//! readable from the environment variable shown in `--help`.

use std::time::Duration;

use kube_informer::{
    ObjectKey,
    cli::{OperatorArgs, parse_duration},
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
    mut_arg("leader_election_id", |arg| arg.default_value("traefik-operator.traefik.kube-informer.dev")),
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
    /// The cluster, the namespace watched, metrics, probes, leader election.
    #[command(flatten)]
    pub operator: OperatorArgs,

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

    /// Workers per controller.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,

    /// How a Service's backend URL is built; `{scheme}`, `{name}`, `{namespace}`, `{port}`
    /// and `{clusterIP}` are replaced.
    #[arg(long, env = "SERVICE_URL_TEMPLATE", default_value = UrlTemplate::IN_CLUSTER)]
    pub service_url_template: String,

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

impl Options {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

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
        assert!(cli.options.operator.leader_elect);
        assert_eq!(cli.options.etcd.endpoints, ["127.0.0.1:2379"]);
        assert_eq!(cli.options.etcd.max_txn_ops, 128);
        let help = Cli::try_parse_from(["traefik-operator", "--help"])
            .unwrap_err()
            .to_string();
        assert!(
            help.contains("--leader-elect") && help.contains("--etcd-endpoints"),
            "{help}"
        );
    }
}
