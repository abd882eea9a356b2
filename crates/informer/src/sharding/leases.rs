//! The ring's Leases: when each was last seen to change, and how this replica writes its
//! member Lease and takes, renews and lets go of slot Leases.

use std::{collections::HashMap, sync::atomic::Ordering, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube_client::api::{ObjectMeta, PostParams};
use tokio::time::Instant;
use tracing::{debug, info};

use super::{
    COVERAGE_ANNOTATION, FORWARDED_ANNOTATION, RING_LABEL, ShardRing, TAKEN_ANNOTATION, lock,
};
use crate::lease::{is_conflict, now};

/// What letting a slot go does about reconciles still running on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Drain {
    /// Keep the slot (renewed, not admitting) and try again next round.
    NextRound,
    /// Wait for them (leaving the ring).
    Wait,
}

/// When this replica last saw each Lease's record change.
#[derive(Default)]
pub(super) struct Observed {
    pub(super) records: HashMap<String, (Option<LeaseSpec>, Instant)>,
}

impl Observed {
    pub(super) fn seen(&mut self, name: &str, spec: Option<&LeaseSpec>) -> Instant {
        let now = Instant::now();
        let entry = self
            .records
            .entry(name.to_owned())
            .or_insert_with(|| (spec.cloned(), now));
        if entry.0.as_ref() != spec {
            *entry = (spec.cloned(), now);
        }
        entry.1
    }

    pub(super) fn forget(&mut self, name: &str) {
        self.records.remove(name);
    }

    /// The next instant a Lease held by someone other than `me` would go silent (`silence`
    /// without a renewal) or expire, as seen here.
    pub(super) fn next_deadline(
        &self,
        me: &str,
        default: Duration,
        silence: Duration,
    ) -> Option<Instant> {
        let now = Instant::now();
        self.records
            .values()
            .filter_map(|(spec, seen)| {
                let spec = spec.as_ref()?;
                let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty())?;
                let expiry = *seen + lease_duration_of(spec, default);
                let silent = *seen + silence;
                if holder == me {
                    return None;
                }
                [silent, expiry].into_iter().filter(|t| *t > now).min()
            })
            .min()
    }
}

pub(super) fn lease_duration_of(spec: &LeaseSpec, default: Duration) -> Duration {
    spec.lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(default, Duration::from_secs)
}

pub(super) fn holder_of(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

pub(super) fn coverage_of(lease: &Lease) -> Option<&str> {
    annotation(lease, COVERAGE_ANNOTATION)
}

pub(super) fn annotation<'a>(lease: &'a Lease, name: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(name)
        .map(String::as_str)
}

impl ShardRing {
    pub(super) fn spec(&self, acquire_time: Option<MicroTime>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: acquire_time.or_else(|| Some(now())),
            renew_time: Some(now()),
            ..LeaseSpec::default()
        }
    }

    pub(super) fn labelled(&self, name: String) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.config.namespace.clone()),
            labels: Some([(RING_LABEL.to_owned(), self.config.name.clone())].into()),
            ..ObjectMeta::default()
        }
    }

    pub(super) async fn renew_member(&self) -> Result<(), kube_client::Error> {
        let name = self.config.member_lease(&self.config.identity);
        let coverage = self
            .handovers
            .coverage(self.config.slots)
            .map(|c| c.encode());
        let (forwarded, taken) = {
            let forwarding = lock(&self.forwarding);
            (forwarding.encode_forwarded(), forwarding.encode_taken())
        };
        let annotate = |meta: &mut ObjectMeta| {
            let annotations = meta.annotations.get_or_insert_default();
            for (name, value) in [
                (COVERAGE_ANNOTATION, &coverage),
                (FORWARDED_ANNOTATION, &forwarded),
                (TAKEN_ANNOTATION, &taken),
            ] {
                match value {
                    Some(value) => {
                        annotations.insert(name.to_owned(), value.clone());
                    }
                    None => {
                        annotations.remove(name);
                    }
                }
            }
        };
        match self.api.get_opt(&name).await? {
            Some(mut lease) => {
                let acquired = lease.spec.as_ref().and_then(|s| s.acquire_time.clone());
                lease.spec = Some(self.spec(acquired));
                annotate(&mut lease.metadata);
                self.api
                    .replace(&name, &PostParams::default(), &lease)
                    .await?;
            }
            None => {
                let mut lease = Lease {
                    metadata: self.labelled(name),
                    spec: Some(self.spec(None)),
                };
                annotate(&mut lease.metadata);
                self.api.create(&PostParams::default(), &lease).await?;
            }
        }
        Ok(())
    }

    pub(super) async fn renew_slot(&self, slot: u16, lease: Option<&Lease>) {
        // The deadline counts from the request, not the answer: another replica may have
        // seen the renewal before this one hears it went through.
        let sent = Instant::now();
        if self.renew_record(slot, lease).await {
            self.admission.hold(slot, sent);
        }
    }

    /// Renews `slot`'s Lease as ours; whether the server took it.
    pub(super) async fn renew_record(&self, slot: u16, lease: Option<&Lease>) -> bool {
        let Some(lease) = lease else { return false };
        let name = self.config.slot_lease(slot);
        let renew = |lease: &Lease| {
            let mut renewed = lease.clone();
            let acquired = lease.spec.as_ref().and_then(|s| s.acquire_time.clone());
            renewed.spec = Some(self.spec(acquired));
            renewed
        };
        let error = match self
            .api
            .replace(&name, &PostParams::default(), &renew(lease))
            .await
        {
            Ok(_) => return true,
            Err(error) => error,
        };
        // The watched copy may be a write behind: read the Lease, and renew it if it is
        // still ours.
        if is_conflict(&error)
            && let Ok(current) = self.api.get(&name).await
            && holder_of(&current) == Some(self.config.identity.as_str())
        {
            return self
                .api
                .replace(&name, &PostParams::default(), &renew(&current))
                .await
                .is_ok();
        }
        debug!(ring = %self.config.name, slot, %error, "slot renewal failed");
        false
    }

    /// Takes `slot` (its Lease is free or expired), with the Lease's resourceVersion.
    pub(super) async fn take_slot(&self, slot: u16, lease: Option<&Lease>) {
        let name = self.config.slot_lease(slot);
        let sent = Instant::now();
        let take = |lease: &Lease| {
            let mut taken = lease.clone();
            taken.spec = Some(self.spec(None));
            taken
        };
        let mut taken = match lease {
            Some(lease) => {
                self.api
                    .replace(&name, &PostParams::default(), &take(lease))
                    .await
            }
            None => {
                let lease = Lease {
                    metadata: self.labelled(name.clone()),
                    spec: Some(self.spec(None)),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
        };
        // The watched copy may be a write behind (or the Lease exists but was not seen
        // yet): read it, and take it if it is still free or expired as this replica sees
        // it. A record that changed counts as renewed from now, so a live holder is never
        // overtaken this way; a conflict and AlreadyExists are both 409.
        if let Err(error) = &taken
            && is_conflict(error)
            && let Ok(current) = self.api.get(&name).await
            && self.live_holder(&name, &current).is_none()
        {
            taken = self
                .api
                .replace(&name, &PostParams::default(), &take(&current))
                .await;
        }
        match taken {
            Ok(_) => {
                self.admission.hold(slot, sent);
                self.counters.took();
                info!(ring = %self.config.name, slot, "took a slot");
            }
            Err(error) => {
                debug!(ring = %self.config.name, slot, %error, "another replica took the slot first")
            }
        }
    }

    /// Stops admitting on `slot` and, once its reconciles have finished, clears its holder.
    pub(super) async fn let_go(&self, slot: u16, lease: Option<&Lease>, drain: Drain) {
        self.admission.release(slot);
        if drain == Drain::NextRound && self.admission.running(slot) > 0 {
            // Still ours on the server while its reconciles finish, and admitted no more;
            // the next round tries again, so the other slots' renewals do not wait.
            self.renew_record(slot, lease).await;
            return;
        }
        self.admission.drained(slot).await;
        let Some(lease) = lease else { return };
        let mut released = lease.clone();
        released.spec = Some(LeaseSpec {
            holder_identity: None,
            ..lease.spec.clone().unwrap_or_default()
        });
        let name = self.config.slot_lease(slot);
        match self
            .api
            .replace(&name, &PostParams::default(), &released)
            .await
        {
            Ok(_) => {
                self.counters.released.fetch_add(1, Ordering::Relaxed);
                info!(ring = %self.config.name, slot, "let a slot go");
            }
            Err(error) => {
                debug!(ring = %self.config.name, slot, %error, "releasing the slot failed; it expires instead")
            }
        }
    }
}
