//! A ring's configuration, and why a ring cannot run.

use std::time::Duration;

use crate::lease::LeaseConfig;

/// Why a ring cannot run.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The timings or the slot count make no sense together.
    #[error("invalid ring configuration: {0}")]
    Config(&'static str),
    /// The API server refused the ring's Leases (RBAC: `get`, `list`, `watch`, `create`,
    /// `update`, `delete` on `leases` in the ring's namespace).
    #[error("the ring's Leases are forbidden: {0}")]
    Forbidden(#[source] kube_client::Error),
    /// The informer on the ring's Leases could not sync (forbidden to list or watch them,
    /// or the resource is unknown).
    #[error("cannot watch the ring's Leases: {0}")]
    Watch(#[source] crate::error::Error),
    /// [`ShardRing::run`](super::ShardRing::run) was called on a ring already running (or that ran).
    #[error("the ring is already running")]
    AlreadyRunning,
}

/// A ring: its Leases ([`LeaseConfig`]: the ring's name, their namespace, this replica's
/// identity, their timings) and how many slots it has. It reads as the [`LeaseConfig`] it
/// holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingConfig {
    lease: LeaseConfig,
    pub(super) slots: u16,
}

impl From<LeaseConfig> for RingConfig {
    fn from(lease: LeaseConfig) -> Self {
        Self::new(lease)
    }
}

impl std::ops::Deref for RingConfig {
    type Target = LeaseConfig;

    fn deref(&self) -> &LeaseConfig {
        &self.lease
    }
}

impl RingConfig {
    /// The ring named by `lease`, with 16 slots. Its identity becomes part of the member
    /// Lease's name, so it must be a valid one ([`default_identity`] is).
    ///
    /// [`default_identity`]: crate::lease::default_identity
    pub fn new(lease: LeaseConfig) -> Self {
        Self { lease, slots: 16 }
    }

    /// Slots the hash space is cut into (16): more spread load more evenly among many
    /// replicas, and cost one Lease renewal each per retry period.
    #[must_use]
    pub fn slots(mut self, slots: u16) -> Self {
        self.slots = slots;
        self
    }

    pub(super) fn validate(&self) -> Result<(), RingError> {
        if self.slots == 0 {
            return Err(RingError::Config("a ring needs at least one slot"));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(RingError::Config(
                "the renew deadline must be shorter than the lease duration",
            ));
        }
        if self.retry_period >= self.renew_deadline {
            return Err(RingError::Config(
                "the retry period must be shorter than the renew deadline",
            ));
        }
        Ok(())
    }

    /// How long a member may go without renewing before others start caching its slots:
    /// its renew deadline, past which it has stopped reconciling them itself.
    pub(super) fn silence(&self) -> Duration {
        self.renew_deadline
    }

    pub(super) fn member_lease(&self, identity: &str) -> String {
        format!("{}-member-{identity}", self.name)
    }

    pub(super) fn slot_lease(&self, slot: u16) -> String {
        format!("{}-slot-{slot}", self.name)
    }
}
