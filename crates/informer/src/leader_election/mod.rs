//! Leader election on a `coordination.k8s.io/v1` Lease (client-go's `tools/leaderelection`).
//!
//! Replicas of a controller race for one Lease. The holder writes its identity and renews
//! the lease every [`retry_period`](LeaderElectionConfig::retry_period); the others poll it
//! and take it over once it has not been renewed for a
//! [`lease_duration`](LeaderElectionConfig::lease_duration). Writes carry the Lease's
//! resourceVersion, so of two replicas racing for it exactly one wins.
//!
//! As in client-go, expiry is judged by the *local* time at which a replica last saw the
//! lease record change, never by the timestamps written in it, so clock skew between
//! machines does not matter. A leader that cannot renew within
//! [`renew_deadline`](LeaderElectionConfig::renew_deadline) (shorter than the lease
//! duration) stops leading before anyone else may start.
//!
//! [`LeaderElector::run`] waits for the lease, then runs your leading future with a
//! cancellation token that fires when leadership is lost; on a graceful stop it releases
//! the lease, so another replica takes over at once instead of after the lease expires.
//!
//! ```no_run
//! use kube_informer::leader_election::{LeaderElectionConfig, LeaderElector};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let config = LeaderElectionConfig::new("default", "my-controller", "replica-1");
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

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube_client::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use rand::Rng;
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Timing and identity of a [`LeaderElector`].
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name (shared by every replica of one controller).
    pub name: String,
    /// This replica's identity (unique among the replicas, e.g. the Pod name).
    pub identity: String,
    /// How long a lease holds without renewal before others may take it (15 s).
    pub lease_duration: Duration,
    /// How long the leader keeps retrying a failed renewal before it gives up (10 s).
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew (2 s).
    pub retry_period: Duration,
    /// Release the lease when [`run`](LeaderElector::run) stops gracefully (true).
    pub release_on_cancel: bool,
}

impl LeaderElectionConfig {
    /// client-go's defaults (15 s, 10 s, 2 s) for the Lease `namespace/name`, as `identity`.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            release_on_cancel: true,
        }
    }

    /// Sets the three durations at once.
    #[must_use]
    pub fn timing(
        mut self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Self {
        self.lease_duration = lease_duration;
        self.renew_deadline = renew_deadline;
        self.retry_period = retry_period;
        self
    }

    fn validate(&self) -> Result<(), LeaderElectionError> {
        let invalid = |reason: String| Err(LeaderElectionError::InvalidConfig(reason));
        if self.identity.is_empty() || self.name.is_empty() || self.namespace.is_empty() {
            return invalid("namespace, name and identity must not be empty".into());
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
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.config)
            .field("leading", &self.is_leader())
            .finish_non_exhaustive()
    }
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
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
        })
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
    /// leadership is lost or `cancel` fires, while renewing the lease in the background.
    ///
    /// Returns `Ok(Some(output))` when `lead` finished (the lease is released first if
    /// [`release_on_cancel`](LeaderElectionConfig::release_on_cancel)), `Ok(None)` when
    /// `cancel` fired before the lease was acquired.
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
        let renew = self.renew_until_lost(&leading);
        tokio::pin!(renew);
        let outcome = tokio::select! {
            output = &mut lead => Ok(output),
            lost = &mut renew => Err(lost),
        };
        let result = match outcome {
            Ok(output) => {
                if self.config.release_on_cancel {
                    self.release().await;
                }
                Ok(Some(output))
            }
            Err(lost) => {
                warn!(lease = %self.lease(), error = %lost, "leadership lost; stopping");
                leading.cancel();
                lead.await;
                Err(lost)
            }
        };
        self.leading.send_replace(false);
        result
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
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => return Ok(true),
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

    /// Renews every retry period; returns why leadership was lost. Returns early (with a
    /// placeholder reason, unused) once `leading` is cancelled, so `run` can finish.
    async fn renew_until_lost(&self, leading: &CancellationToken) -> LeaderElectionError {
        loop {
            tokio::select! {
                () = leading.cancelled() => std::future::pending::<()>().await,
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
            let deadline = Instant::now() + self.config.renew_deadline;
            loop {
                match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                    Ok(Ok(Attempt::Held)) => break,
                    Ok(Ok(Attempt::HeldBy(holder))) => {
                        return self.lost(format!("the lease is now held by {holder}"));
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
                tokio::select! {
                    () = leading.cancelled() => std::future::pending::<()>().await,
                    () = tokio::time::sleep_until(deadline.min(Instant::now() + self.config.retry_period)) => {}
                }
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

    /// Gives the lease up if we hold it, so another replica can take it at once.
    async fn release(&self) {
        let Ok(Some(lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        let mut released = lease;
        released.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            renew_time: Some(now()),
            acquire_time: Some(now()),
            ..spec
        });
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &released)
            .await
        {
            Ok(_) => info!(lease = %self.lease(), "released the lease"),
            Err(err) => warn!(lease = %self.lease(), error = %err, "could not release the lease"),
        }
    }
}

enum Attempt {
    Held,
    HeldBy(String),
}

fn is_conflict(err: &kube_client::Error) -> bool {
    matches!(err, kube_client::Error::Api(s) if s.code == 409)
}

fn is_forbidden(err: &kube_client::Error) -> bool {
    matches!(err, kube_client::Error::Api(s) if s.code == 403)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inconsistent_timings_are_rejected() {
        let base = LeaderElectionConfig::new("ns", "lease", "me");
        assert!(base.validate().is_ok());
        let bad = base.clone().timing(
            Duration::from_secs(5),
            Duration::from_secs(5),
            Duration::from_secs(1),
        );
        assert!(matches!(
            bad.validate(),
            Err(LeaderElectionError::InvalidConfig(_))
        ));
        let bad = base.clone().timing(
            Duration::from_secs(15),
            Duration::from_secs(2),
            Duration::from_secs(2),
        );
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("retry_period")
        );
        let mut bad = base;
        bad.identity.clear();
        assert!(bad.validate().is_err());
    }
}
