//! What the leader elector and the shard ring share about `coordination.k8s.io` Leases.

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp};

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
