//! The flags every operator takes (feature `cli`): which cluster, which namespace, where
//! metrics and probes are served, leader election and the shard ring, as one
//! [`clap::Args`] struct to flatten into an operator's own command line, and
//! [`Manager::from_args`](crate::Manager::from_args) to build the manager they describe.
//!
//! ```no_run
//! use clap::Parser;
//! use kube_informer::{Manager, cli::OperatorArgs};
//!
//! /// My operator.
//! #[derive(clap::Parser)]
//! struct Args {
//!     #[command(flatten)]
//!     operator: OperatorArgs,
//!     /// A flag of its own.
//!     #[arg(long, default_value_t = 2)]
//!     workers: usize,
//! }
//!
//! # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
//! let args = Args::parse();
//! let manager = Manager::from_args(&args.operator).await?;
//! // ... add controllers ...
//! manager.run().await?;
//! # Ok(()) }
//! ```

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use crate::{client::ClusterSource, informer::Scope, lease::LeaseConfig, replica::program_name};

/// Where `/metrics` is served unless told otherwise: loopback, on a port that the usual
/// local services (8080, 8081) leave free.
pub const DEFAULT_METRICS_ADDRESS: &str = crate::manager::DEFAULT_METRICS_ADDRESS;
/// Where `/healthz` and `/readyz` are served unless told otherwise.
pub const DEFAULT_PROBE_ADDRESS: &str = crate::manager::DEFAULT_PROBE_ADDRESS;

/// An operator's standard flags, each also read from the environment variable `--help`
/// shows. Flatten it into the operator's own [`clap::Parser`].
#[derive(Debug, Clone, clap::Args)]
pub struct OperatorArgs {
    /// The kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,

    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,

    /// The address `/metrics` binds to (`:9807` for every interface); `0` turns it off.
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = DEFAULT_METRICS_ADDRESS, value_parser = checked_bind_address)]
    pub metrics_bind_address: String,

    /// The address `/healthz` and `/readyz` bind to (`:9808` for every interface); `0`
    /// turns them off.
    #[arg(long, env = "HEALTH_PROBE_BIND_ADDRESS", default_value = DEFAULT_PROBE_ADDRESS, value_parser = checked_bind_address)]
    pub health_probe_bind_address: String,

    /// Enable leader election: only the replica holding the Lease runs the controllers
    /// (sharded ones run on every replica).
    #[arg(long, env = "LEADER_ELECT")]
    pub leader_elect: bool,

    /// The leader election Lease's name (default: the program's name).
    #[arg(long)]
    pub leader_election_id: Option<String>,

    /// The namespace of the Leases (default: `$POD_NAMESPACE`, the in-cluster namespace,
    /// or `default`).
    #[arg(long, env = "LEASE_NAMESPACE", alias = "leader-election-namespace")]
    pub lease_namespace: Option<String>,

    /// This replica's identity in its Leases (default: `$POD_NAME` or the host name, plus
    /// a unique suffix).
    #[arg(long, env = "POD_IDENTITY", alias = "leader-election-identity")]
    pub identity: Option<String>,

    /// How long a Lease holds without renewal (e.g. `15s`).
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    pub lease_duration: Duration,

    /// How long the holder retries renewing before it lets go.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub renew_deadline: Duration,

    /// How often to try to acquire or renew the Leases.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub retry_period: Duration,

    /// Take part in the shard ring of this name: sharded controllers split their objects
    /// across the replicas in it.
    #[arg(long, env = "SHARD_RING")]
    pub shard_ring: Option<String>,

    /// Slots of the shard ring (every replica must give the same number).
    #[arg(long, default_value_t = 16)]
    pub shard_slots: u16,
}

impl OperatorArgs {
    /// The cluster `--kubeconfig` and `--context` name.
    pub fn cluster(&self) -> ClusterSource {
        let mut cluster = ClusterSource::default();
        if let Some(path) = &self.kubeconfig {
            cluster = cluster.kubeconfig(path);
        }
        if let Some(context) = &self.context {
            cluster = cluster.context(context);
        }
        cluster
    }

    /// What the informers watch: `--namespace`, or every namespace.
    pub fn scope(&self) -> Scope {
        match &self.namespace {
            Some(namespace) => Scope::namespace(namespace),
            None => Scope::all(),
        }
    }

    /// The Lease `name` with the flags' namespace, identity and timings.
    pub fn lease(&self, name: impl Into<String>) -> LeaseConfig {
        let mut lease = LeaseConfig::new(name).timing(
            self.lease_duration,
            self.renew_deadline,
            self.retry_period,
        );
        if let Some(namespace) = &self.lease_namespace {
            lease = lease.in_namespace(namespace);
        }
        if let Some(identity) = &self.identity {
            lease = lease.with_identity(identity);
        }
        lease
    }

    /// The leader election Lease's name: `--leader-election-id`, else the program's name.
    pub fn leader_election_id(&self) -> String {
        self.leader_election_id.clone().unwrap_or_else(program_name)
    }

    /// Where `/metrics` is served (`None`: nowhere).
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        bind_address(&self.metrics_bind_address).ok().flatten()
    }

    /// Where the probes are served (`None`: nowhere).
    pub fn probe_address(&self) -> Option<SocketAddr> {
        bind_address(&self.health_probe_bind_address).ok().flatten()
    }
}

/// Parses `500ms`, `15s`, `2m`, `1h` (a bare number is seconds): the durations the flags
/// take, for an operator's flags of its own.
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

/// `None` for `0` (off); `:port` binds every interface.
fn bind_address(text: &str) -> Result<Option<SocketAddr>, String> {
    if text == "0" || text.is_empty() {
        return Ok(None);
    }
    let text = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_owned()
    };
    text.parse()
        .map(Some)
        .map_err(|e| format!("{text}: {e}; give host:port, :port or 0"))
}

/// Checks a bind address when the flags are parsed, so a bad one fails there.
fn checked_bind_address(text: &str) -> Result<String, String> {
    bind_address(text).map(|_| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Args {
        #[command(flatten)]
        operator: OperatorArgs,
    }

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
    fn defaults_serve_on_loopback_off_the_common_ports() {
        let args = Args::try_parse_from(["op"]).unwrap().operator;
        assert_eq!(
            args.metrics_address(),
            Some(DEFAULT_METRICS_ADDRESS.parse().unwrap())
        );
        assert_eq!(
            args.probe_address(),
            Some(DEFAULT_PROBE_ADDRESS.parse().unwrap())
        );
        assert!(!args.leader_elect);
        assert_eq!(args.scope(), Scope::all());
        let lease = args.leader_election_id();
        assert_eq!(lease, program_name());
        assert!(
            lease
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'),
            "{lease} is a valid Lease name"
        );
        let lease = args.lease("x");
        assert_eq!(
            (
                lease.lease_duration,
                lease.renew_deadline,
                lease.retry_period
            ),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
    }

    #[test]
    fn flags_set_addresses_leases_and_the_namespace() {
        let args = Args::try_parse_from([
            "op",
            "--metrics-bind-address",
            "0",
            "--health-probe-bind-address",
            ":9000",
            "--namespace",
            "web",
            "--lease-namespace",
            "ops",
            "--identity",
            "replica-a",
            "--lease-duration",
            "4s",
        ])
        .unwrap()
        .operator;
        assert_eq!(args.metrics_address(), None);
        assert_eq!(args.probe_address(), Some("0.0.0.0:9000".parse().unwrap()));
        assert_eq!(args.scope(), Scope::namespace("web"));
        let lease = args.lease("ring");
        assert_eq!(
            (lease.namespace.as_str(), lease.identity.as_str()),
            ("ops", "replica-a")
        );
        assert_eq!(lease.lease_duration, Duration::from_secs(4));
        let bad = Args::try_parse_from(["op", "--metrics-bind-address", "localhost"]);
        assert!(
            bad.is_err(),
            "a bad address fails when the flags are parsed"
        );
    }
}
