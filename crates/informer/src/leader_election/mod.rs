//! Leader election on a `coordination.k8s.io/v1` Lease (client-go's `tools/leaderelection`).
//!
//! Replicas of a controller race for one Lease. The holder writes its identity and renews
//! the lease every [`retry_period`](crate::lease::LeaseConfig::retry_period); the others poll it
//! and take it over once it has not been renewed for a
//! [`lease_duration`](crate::lease::LeaseConfig::lease_duration). Writes carry the Lease's
//! resourceVersion, so of two replicas racing for it exactly one wins.
//!
//! As in client-go, expiry is judged by the *local* time at which a replica last saw the
//! lease record change, never by the timestamps written in it, so clock skew between
//! machines does not matter. A leader that cannot renew within
//! [`renew_deadline`](crate::lease::LeaseConfig::renew_deadline) (shorter than the lease
//! duration) stops leading before anyone else may start.
//!
//! [`LeaderElector::run`] waits for the lease, then runs your leading future with a
//! cancellation token that fires when leadership is lost; on a graceful stop it keeps
//! renewing until that future has finished, then releases the lease, so another replica
//! takes over at once instead of after the lease expires, and never mid-reconcile.
//!
//! **Fencing.** The renew deadline counts from the moment the last successful renewal was
//! sent, so a leader that cannot renew knows it is no longer leading before any other
//! replica can have acquired the lease (which takes a whole lease duration after it last
//! saw the record change). At that moment [`is_leader`](LeaderElector::is_leader) turns
//! false and the leading token is cancelled; a leading future that has not finished by the
//! time another replica could acquire is dropped.
//!
//! ```no_run
//! use kube_informer::leader_election::{LeaderElectionConfig, LeaderElector};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let config = LeaderElectionConfig::with_defaults("my-controller");
//! let elector = LeaderElector::new(client, config)?;
//! let stop = CancellationToken::new();
//! elector
//!     .run(stop, |leading| async move {
//!         // Reconcile until `leading` is cancelled (leadership lost or shutdown).
//!         leading.cancelled().await;
//!     })
//!     .await?;
//! # Ok(())
//! # }
//! ```

use std::{
    future::Future,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube_client::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use rand::Rng;
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::lease::{LeaseConfig, is_conflict, is_forbidden, now};

/// A [`LeaseConfig`] and what the leader does with its Lease when it stops; it reads as
/// the [`LeaseConfig`] it holds.
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    lease: LeaseConfig,
    pub(crate) on_cancel: OnCancel,
}

/// What a leader does with its Lease when [`LeaderElector::run`] stops gracefully.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnCancel {
    /// Release it, so that another replica takes over at once (the default).
    #[default]
    Release,
    /// Keep it until it expires, as client-go does unless `ReleaseOnCancel` is set.
    Keep,
}

impl From<LeaseConfig> for LeaderElectionConfig {
    fn from(lease: LeaseConfig) -> Self {
        Self::new(lease)
    }
}

impl std::ops::Deref for LeaderElectionConfig {
    type Target = LeaseConfig;

    fn deref(&self) -> &LeaseConfig {
        &self.lease
    }
}

impl LeaderElectionConfig {
    /// Leader election on the Lease `lease` describes, released when the leader stops.
    pub fn new(lease: LeaseConfig) -> Self {
        Self {
            lease,
            on_cancel: OnCancel::Release,
        }
    }

    /// The defaults (see [`LeaseConfig::new`]) for the Lease `name`, as controller-runtime's
    /// manager picks them.
    pub fn with_defaults(name: impl Into<String>) -> Self {
        Self::new(LeaseConfig::new(name))
    }

    /// What the leader does with its Lease when it stops gracefully
    /// ([`OnCancel::Release`]).
    #[must_use]
    pub fn on_cancel(mut self, on_cancel: OnCancel) -> Self {
        self.on_cancel = on_cancel;
        self
    }

    fn validate(&self) -> Result<(), LeaderElectionError> {
        let invalid = |reason: String| Err(LeaderElectionError::InvalidConfig(reason));
        if self.identity.is_empty() || self.name.is_empty() || self.namespace.is_empty() {
            return invalid("namespace, name and identity must not be empty".into());
        }
        // The Lease holds whole seconds: what the others read is what must be checked.
        if self.lease_duration.subsec_nanos() != 0 {
            return invalid(format!(
                "lease_duration ({:?}) must be whole seconds: the Lease records seconds",
                self.lease_duration
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return invalid(format!(
                "lease_duration ({:?}) must be longer than renew_deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline <= self.retry_period.mul_f64(1.2) {
            return invalid(format!(
                "renew_deadline ({:?}) must exceed 1.2 × retry_period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.retry_period.is_zero() || self.lease_duration.as_secs() == 0 {
            return invalid("retry_period must be positive and lease_duration at least 1 s".into());
        }
        Ok(())
    }
}

/// Why leader election stopped.
#[derive(Debug, thiserror::Error)]
pub enum LeaderElectionError {
    /// The configuration is inconsistent.
    #[error("invalid leader election configuration: {0}")]
    InvalidConfig(String),
    /// RBAC does not allow this replica to read or write the Lease.
    #[error(
        "not allowed to use Lease {namespace}/{name} for leader election (grant get, create and \
         update on leases.coordination.k8s.io): {source}"
    )]
    Forbidden {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// The API server's answer.
        source: kube_client::Error,
    },
    /// This replica was the leader and lost the lease.
    #[error("lost leadership of Lease {namespace}/{name}: {reason}")]
    Lost {
        /// The Lease's namespace.
        namespace: String,
        /// The Lease's name.
        name: String,
        /// Why: another holder, or no renewal within the renew deadline.
        reason: String,
    },
}

/// The lease record as last seen, and the local time it was first seen so.
struct Observed {
    record: Option<LeaseSpec>,
    at: Instant,
}

/// Campaigns for a Lease and runs a future while it holds it. See the [module docs](self).
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    observed: Mutex<Observed>,
    leading: watch::Sender<bool>,
    /// When the last successful acquisition or renewal was sent.
    renewed: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.config)
            .field("leading", &self.is_leader())
            .finish_non_exhaustive()
    }
}

impl LeaderElector {
    /// An elector for `config.namespace/config.name`.
    ///
    /// # Errors
    ///
    /// [`LeaderElectionError::InvalidConfig`] unless
    /// `lease_duration > renew_deadline > 1.2 × retry_period`.
    pub fn new(client: Client, config: LeaderElectionConfig) -> Result<Self, LeaderElectionError> {
        config.validate()?;
        Ok(Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: Mutex::new(Observed {
                record: None,
                at: Instant::now(),
            }),
            leading: watch::channel(false).0,
            renewed: Mutex::new(None),
        })
    }

    fn last_renewed(&self) -> Option<Instant> {
        *self.renewed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_renewed(&self, at: Instant) {
        *self.renewed.lock().unwrap_or_else(PoisonError::into_inner) = Some(at);
    }

    /// client-go's `HealthzAdaptor`: healthy unless this replica leads and has not renewed
    /// for longer than the lease duration plus `tolerance` (its renewals have stalled,
    /// e.g. a task that blocks the runtime).
    ///
    /// # Errors
    ///
    /// A message saying how long the renewals have stalled.
    pub fn check_health(&self, tolerance: Duration) -> Result<(), String> {
        if !self.is_leader() {
            return Ok(());
        }
        let Some(renewed) = self.last_renewed() else {
            return Ok(());
        };
        let since = renewed.elapsed();
        if since > self.config.lease_duration + tolerance {
            return Err(format!(
                "leading, but the lease {} was last renewed {since:?} ago",
                self.lease()
            ));
        }
        Ok(())
    }

    /// Whether this replica leads right now.
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// A receiver that sees every change of [`is_leader`](Self::is_leader).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Waits to acquire the lease, then runs `lead` with a token that is cancelled when
    /// leadership is lost or `cancel` fires, while renewing the lease, until `lead` has
    /// finished (so a graceful stop keeps the lease while `lead` winds down).
    ///
    /// Returns `Ok(Some(output))` when `lead` finished (the lease is released then, if
    /// [`on_cancel`](LeaderElectionConfig::on_cancel)), `Ok(None)` when
    /// `cancel` fired before the lease was acquired. When leadership is lost, `lead` gets
    /// until another replica could acquire the lease to finish, and is dropped then.
    ///
    /// # Errors
    ///
    /// [`LeaderElectionError::Lost`] after leadership was lost (and `lead` returned);
    /// [`LeaderElectionError::Forbidden`] when RBAC forbids using the Lease.
    pub async fn run<F, Fut, T>(
        &self,
        cancel: CancellationToken,
        lead: F,
    ) -> Result<Option<T>, LeaderElectionError>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = T>,
    {
        if !self.acquire(&cancel).await? {
            return Ok(None);
        }
        let leading = cancel.child_token();
        self.leading.send_replace(true);
        info!(lease = %self.lease(), identity = %self.config.identity, "acquired the lease; leading");
        let lead = lead(leading.clone());
        tokio::pin!(lead);
        // Renewals go on while `lead` runs, a graceful wind-down included.
        let renew = self.renew_until_lost();
        tokio::pin!(renew);
        let outcome = tokio::select! {
            output = &mut lead => Ok(output),
            lost = &mut renew => Err(lost),
        };
        match outcome {
            Ok(output) => {
                self.leading.send_replace(false);
                if self.config.on_cancel == OnCancel::Release {
                    self.release().await;
                }
                Ok(Some(output))
            }
            Err(lost) => {
                // Fenced first: no longer the leader, work told to stop.
                self.leading.send_replace(false);
                leading.cancel();
                let fence = self
                    .last_renewed()
                    .map_or_else(Instant::now, |at| at + self.config.lease_duration);
                warn!(lease = %self.lease(), error = %lost, "leadership lost; stopping");
                if tokio::time::timeout_at(fence, &mut lead).await.is_err() {
                    warn!(lease = %self.lease(), "the leading work did not stop before another replica could lead; dropped");
                }
                Err(lost)
            }
        }
    }

    fn lease(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }

    fn forbidden(&self, source: kube_client::Error) -> LeaderElectionError {
        LeaderElectionError::Forbidden {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            source,
        }
    }

    fn lost(&self, reason: impl Into<String>) -> LeaderElectionError {
        LeaderElectionError::Lost {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            reason: reason.into(),
        }
    }

    /// Tries every retry period (with jitter) until acquired (true) or cancelled (false).
    async fn acquire(&self, cancel: &CancellationToken) -> Result<bool, LeaderElectionError> {
        let mut logged_holder = None;
        loop {
            let sent = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => {
                    self.set_renewed(sent);
                    return Ok(true);
                }
                Ok(Attempt::Conflict) => {}
                Ok(Attempt::HeldBy(holder)) => {
                    if logged_holder.as_ref() != Some(&holder) {
                        info!(lease = %self.lease(), %holder, "lease held by another replica; waiting");
                        logged_holder = Some(holder);
                    }
                }
                Err(err) if is_forbidden(&err) => return Err(self.forbidden(err)),
                Err(err) => {
                    warn!(lease = %self.lease(), error = %err, "could not acquire the lease; retrying")
                }
            }
            let jitter = rand::rng().random_range(1.0..1.2);
            tokio::select! {
                () = cancel.cancelled() => return Ok(false),
                () = tokio::time::sleep(self.config.retry_period.mul_f64(jitter)) => {}
            }
        }
    }

    /// Renews every retry period; returns why leadership was lost: another holder, or no
    /// renewal within the renew deadline of the last one sent that succeeded.
    async fn renew_until_lost(&self) -> LeaderElectionError {
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            let deadline =
                self.last_renewed().unwrap_or_else(Instant::now) + self.config.renew_deadline;
            loop {
                let sent = Instant::now();
                match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                    Ok(Ok(Attempt::Held)) => {
                        self.set_renewed(sent);
                        break;
                    }
                    Ok(Ok(Attempt::HeldBy(holder))) => {
                        return self.lost(format!("the lease is now held by {holder}"));
                    }
                    // Our own renewal raced another write of the record: retried.
                    Ok(Ok(Attempt::Conflict)) => {
                        debug!(lease = %self.lease(), "renewal conflicted; retrying")
                    }
                    Ok(Err(err)) => {
                        debug!(lease = %self.lease(), error = %err, "renewal failed; retrying")
                    }
                    Err(_) => {}
                }
                if Instant::now() >= deadline {
                    return self.lost(format!(
                        "not renewed within the renew deadline of {:?}",
                        self.config.renew_deadline
                    ));
                }
                tokio::time::sleep_until(deadline.min(Instant::now() + self.config.retry_period))
                    .await;
            }
        }
    }

    /// One attempt: create the Lease, take over an expired one, or renew ours.
    async fn try_acquire_or_renew(&self) -> Result<Attempt, kube_client::Error> {
        let me = &self.config.identity;
        let duration_secs = i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(created.spec);
                    Ok(Attempt::Held)
                }
                Err(err) if is_conflict(&err) => Ok(Attempt::HeldBy("another replica".into())),
                Err(err) => Err(err),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let observed_at = self.observe(Some(spec.clone()));
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let held_by_me = holder.as_deref() == Some(me.as_str());
        if let Some(holder) = &holder
            && !held_by_me
        {
            let record_duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.config.lease_duration, Duration::from_secs);
            if observed_at + record_duration > Instant::now() {
                return Ok(Attempt::HeldBy(holder.clone()));
            }
        }
        let mut updated = lease.clone();
        updated.spec = Some(LeaseSpec {
            holder_identity: Some(me.clone()),
            lease_duration_seconds: Some(duration_secs),
            acquire_time: if held_by_me {
                spec.acquire_time.clone()
            } else {
                Some(now())
            },
            renew_time: Some(now()),
            lease_transitions: if held_by_me || holder.is_none() && spec.lease_transitions.is_none()
            {
                spec.lease_transitions
            } else {
                Some(spec.lease_transitions.unwrap_or(0) + 1)
            },
            ..spec
        });
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &updated)
            .await
        {
            Ok(replaced) => {
                if !held_by_me {
                    debug!(lease = %self.lease(), previous = ?holder, "took over the lease");
                }
                self.observe(replaced.spec);
                Ok(Attempt::Held)
            }
            Err(err) if is_conflict(&err) && held_by_me => Ok(Attempt::Conflict),
            Err(err) if is_conflict(&err) => Ok(Attempt::HeldBy(
                holder.unwrap_or_else(|| "another replica".into()),
            )),
            Err(err) => Err(err),
        }
    }

    /// Records `record` and returns the local time it was first seen.
    fn observe(&self, record: Option<LeaseSpec>) -> Instant {
        let mut observed = self.observed.lock().unwrap_or_else(PoisonError::into_inner);
        if observed.record != record {
            observed.record = record;
            observed.at = Instant::now();
        }
        observed.at
    }

    /// Gives the lease up if we hold it, so another replica can take it at once; retries
    /// a conflict (a renewal in flight) and gives up after the renew deadline (the lease
    /// then expires on its own).
    async fn release(&self) {
        let attempts = async {
            loop {
                match self.try_release().await {
                    Ok(released) => return released,
                    Err(err) if is_conflict(&err) => {
                        debug!(lease = %self.lease(), "release conflicted; retrying")
                    }
                    Err(err) => {
                        warn!(lease = %self.lease(), error = %err, "could not release the lease; retrying")
                    }
                }
                tokio::time::sleep(self.config.retry_period).await;
            }
        };
        match tokio::time::timeout(self.config.renew_deadline, attempts).await {
            Ok(true) => info!(lease = %self.lease(), "released the lease"),
            Ok(false) => {}
            Err(_) => {
                warn!(lease = %self.lease(), "could not release the lease in time; it will expire")
            }
        }
    }

    /// One release attempt: `Ok(false)` when the lease is not ours (nothing to release).
    async fn try_release(&self) -> Result<bool, kube_client::Error> {
        let Some(lease) = self.api.get_opt(&self.config.name).await? else {
            return Ok(false);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(false);
        }
        let mut released = lease;
        released.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            renew_time: Some(now()),
            acquire_time: Some(now()),
            ..spec
        });
        self.api
            .replace(&self.config.name, &PostParams::default(), &released)
            .await?;
        Ok(true)
    }
}

enum Attempt {
    Held,
    HeldBy(String),
    /// Our own write lost a race on the record (its resourceVersion moved): try again.
    Conflict,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inconsistent_timings_are_rejected() {
        let base = LeaseConfig::new("lease")
            .in_namespace("ns")
            .with_identity("me");
        let config = |lease: LeaseConfig| LeaderElectionConfig::new(lease);
        assert!(config(base.clone()).validate().is_ok());
        let bad = config(base.clone().timing(
            Duration::from_secs(5),
            Duration::from_secs(5),
            Duration::from_secs(1),
        ));
        assert!(matches!(
            bad.validate(),
            Err(LeaderElectionError::InvalidConfig(_))
        ));
        let bad = config(base.clone().timing(
            Duration::from_secs(15),
            Duration::from_secs(2),
            Duration::from_secs(2),
        ));
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("retry_period")
        );
        let bad = config(base.clone().timing(
            Duration::from_millis(10_900),
            Duration::from_millis(10_500),
            Duration::from_secs(2),
        ));
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("whole seconds"),
            "10.9 s is written as 10 s, shorter than the renew deadline"
        );
        let mut bad = base;
        bad.identity.clear();
        assert!(config(bad).validate().is_err());
    }
}
