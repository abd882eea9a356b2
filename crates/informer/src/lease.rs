//! What the leader elector and the shard ring share about `coordination.k8s.io` Leases:
//! one [`LeaseConfig`] (where the Lease lives, who this replica is, and the timings) that
//! [`LeaderElectionConfig`](crate::leader_election::LeaderElectionConfig) and
//! [`RingConfig`](crate::sharding::RingConfig) are built from.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp};
use rand::Rng;

use crate::replica::{non_empty, pod_name};

/// The namespace a replica's Leases go in by default: `$POD_NAMESPACE` (set it from the
/// downward API), else the namespace of the Pod's service account, else `default` (a
/// replica run outside a cluster).
pub fn default_namespace() -> String {
    const SERVICE_ACCOUNT_NAMESPACE: &str =
        "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
    non_empty(std::env::var("POD_NAMESPACE").ok())
        .or_else(|| non_empty(std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok()))
        .unwrap_or_else(|| "default".to_owned())
}

/// A replica's identity by default: its Pod's name (`$POD_NAME`, else the host name, which
/// is the Pod's name in a Pod), then `-` and a random suffix, so two processes on one host
/// (or a restarted one whose old Lease is still held) never share an identity. It is a
/// valid part of a Lease's name, as a shard ring's member Leases need.
pub fn default_identity() -> String {
    let suffix: u32 = rand::rng().random();
    format!("{}-{suffix:08x}", pod_name().to_lowercase())
}

/// A Lease and how this replica holds it: shared by leader election and the shard ring.
///
/// [`new`](Self::new) gives the defaults a replica in a Pod wants: the Pod's namespace
/// ([`default_namespace`]), a unique identity ([`default_identity`]) and client-go's
/// timings (15 s, 10 s, 2 s).
///
/// ```
/// use std::time::Duration;
/// use kube_informer::lease::LeaseConfig;
///
/// let lease = LeaseConfig::new("my-operator")
///     .in_namespace("operators")
///     .lease_duration(Duration::from_secs(30));
/// assert_eq!(lease.namespace, "operators");
/// assert_eq!(lease.renew_deadline, Duration::from_secs(10));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name (for a ring, the prefix of its Leases' names), shared by every
    /// replica of one controller.
    pub name: String,
    /// This replica's identity, unique among the replicas.
    pub identity: String,
    /// How long a Lease holds without renewal before others may take it.
    pub lease_duration: Duration,
    /// How long the holder keeps retrying a failed renewal before it lets go.
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// The Lease (or, for a ring, the prefix of its Leases) `name`, with the defaults.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            namespace: default_namespace(),
            name: name.into(),
            identity: default_identity(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Puts the Lease in `namespace` instead of the Pod's.
    #[must_use]
    pub fn in_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Holds it as `identity` (unique among the replicas) instead of a generated one.
    #[must_use]
    pub fn with_identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = identity.into();
        self
    }

    /// How long a Lease holds without renewal before others may take it (15 s).
    #[must_use]
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.lease_duration = duration;
        self
    }

    /// How long the holder keeps retrying a failed renewal before it lets go (10 s;
    /// shorter than the lease duration).
    #[must_use]
    pub fn renew_deadline(mut self, deadline: Duration) -> Self {
        self.renew_deadline = deadline;
        self
    }

    /// How often to try to acquire or renew (2 s).
    #[must_use]
    pub fn retry_period(mut self, period: Duration) -> Self {
        self.retry_period = period;
        self
    }

    /// Sets the three durations at once.
    #[must_use]
    pub fn timing(
        self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Self {
        self.lease_duration(lease_duration)
            .renew_deadline(renew_deadline)
            .retry_period(retry_period)
    }
}

/// A Lease's timestamp for now.
pub(crate) fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// A write lost a race on the Lease's resourceVersion.
pub(crate) fn is_conflict(err: &kube_client::Error) -> bool {
    matches!(err, kube_client::Error::Api(s) if s.code == 409)
}

/// RBAC refused the Lease.
pub(crate) fn is_forbidden(err: &kube_client::Error) -> bool {
    matches!(err, kube_client::Error::Api(s) if s.code == 403)
}
