//! A shard ring on `coordination.k8s.io/v1` Leases: replicas of one controller split the
//! hash space of object UIDs among themselves, and a slot of it changes hands only once
//! its old owner has let go of it.
//!
//! The space is cut into a fixed number of equal **slots** ([`RingConfig::slots`], 16 by
//! default). Each replica holds a **member** Lease (`<ring>-member-<identity>`, labelled
//! with the ring's name) and renews it every retry period; every replica watches the
//! ring's Leases (an informer on the label) and takes the members whose record it has seen
//! change within a lease duration as live. A change of holder, a Lease created or deleted,
//! and the moment a Lease it watches would expire each start a look at the ring at once,
//! so a slot let go or expired is taken without waiting for the next retry period.
//!
//! The slots are dealt by rendezvous hashing with equal capacities: each slot ranks the
//! members by a hash of (member, slot) and goes to the first of them with room, each
//! member having room for `M / N` slots (the first `M mod N` members by sorted identity
//! one more). Every live replica computes the same deal from the same members; the most
//! loaded replica has at most one slot more than the least (16 slots on 3 replicas: 6, 5
//! and 5, a 20 % spread of slots; objects spread as their UIDs hash). A member leaving
//! frees only its own slots, which spread over the others by their ranking, and a member
//! joining takes slots from all of them, so a change moves few slots besides the ones it
//! must (contiguous runs would shift every run after the change).
//!
//! Ownership is a second Lease per slot (`<ring>-slot-<n>`): its holder is the one replica
//! that may reconcile the slot's objects. A replica takes a slot it is assigned only when
//! the slot's Lease has no holder or its holder has not renewed it for a lease duration
//! (judged by local observation, as the leader elector does, so clock skew does not
//! matter), with the Lease's resourceVersion, so of two replicas racing for one slot
//! exactly one wins. A replica gives up a slot no longer assigned to it only after the
//! reconciles it admitted on that slot have finished ([`SlotGuard`]), then clears the
//! holder, so the next owner takes it at once; on shutdown it releases every slot. A slot
//! whose renewals fail for the renew deadline is dropped before anyone else may take it
//! (fencing): [`ShardRing::admit`] refuses it from then on.
//!
//! [`RingView`] says what a replica is assigned and what it holds; an informer follows
//! [`RingView::shard`] (assigned and held, so a slot's objects are cached before it is
//! taken), and a controller reconciles an object only under a [`SlotGuard`] for its slot.
//! A member that has not renewed within the renew deadline has stopped reconciling and is
//! likely gone: the others cache the slots its leaving would deal them
//! ([`RingView::warming`]) while its Leases run out, so a replica killed outright hands
//! over to caches that are already warm.
//!
//! A slot dealt to another live replica is let go only once that replica's cache follows
//! it and this one has reconciled what it saw before (see `handover`): a deletion, which
//! the new owner's list cannot show, is reconciled by one of the two. A replica that
//! loses a slot by expiry instead (cut off for a Lease duration) owes it
//! ([`RingView::owed`]): it keeps caching it and forwards the deletions it sees there to
//! the new holder through its member Lease ([`FORWARDED_ANNOTATION`]) until the holder's
//! cache follows the slot.
//! [`ShardRing::stats`] counts the slots taken, released and lost, and how long each
//! handover took from the membership change that caused it; a [`Manager`] serves them on
//! `/metrics`.
//!
//! [`Manager`]: crate::Manager

mod admission;
mod config;
mod deal;
mod forward;
mod handover;
mod leases;
#[cfg(feature = "manager")]
pub(crate) mod metrics;
mod stats;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex, PoisonError, atomic::Ordering},
    time::Duration,
};

use futures::FutureExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::{
    Api, Client,
    api::{DeleteParams, ListParams},
};
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use self::admission::Admission;
pub use self::admission::SlotGuard;
pub(crate) use self::admission::{Granted, Grants, Refusal};
pub use self::config::{RingConfig, RingError};
use self::deal::deal;
pub use self::deal::{RingView, dealt_slots, slot_of};
pub use self::forward::{FORWARDED_ANNOTATION, TAKEN_ANNOTATION};
pub(crate) use self::forward::{ForwardedDeletion, MAX_FORWARDED, NotForwarded};
use self::forward::{Forwarding, MemberNotes};
pub use self::handover::COVERAGE_ANNOTATION;
use self::handover::Handovers;
pub(crate) use self::handover::{Coverage, Handover, HandoverRegistration};
use self::leases::{Drain, Observed, annotation, coverage_of, holder_of, lease_duration_of};
use self::stats::Counters;
pub use self::stats::RingStats;
use crate::{
    informer::{InformerHandle, SharedInformer, handler_fn},
    lease::is_forbidden,
    list_watch::ApiListWatch,
};

/// How long after a watched Lease's expiry the ring looks again: past the instant, so the
/// Lease has expired when it looks.
const EXPIRY_MARGIN: Duration = Duration::from_millis(20);

/// The label that marks a Lease as one of a ring's, with the ring's name.
pub const RING_LABEL: &str = "sharding.kube-informer.dev/ring";

/// Where this run's forwarded deletions are numbered from: the time in microseconds, so a
/// restarted replica numbers past what its previous run forwarded.
fn first_forward_seq() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX / 2)
        })
}

/// One replica's place in a shard ring; see the [module docs](self).
pub struct ShardRing {
    config: RingConfig,
    api: Api<Lease>,
    view: watch::Sender<RingView>,
    /// Slots this replica may admit reconciles on, and the reconciles running on each.
    admission: Admission,
    observed: Arc<Mutex<Observed>>,
    counters: Counters,
    /// The ring's Leases as this replica watches them; started by `run`.
    leases: Mutex<Option<SharedInformer<Lease>>>,
    cache: InformerHandle<Lease>,
    /// Rings when a Lease changes holder or coverage, appears or goes.
    changed: Arc<Notify>,
    /// The controllers that report what their caches follow.
    handovers: Arc<Handovers>,
    /// Slots lost without a handover, and the deletions forwarded and taken.
    forwarding: Mutex<Forwarding>,
}

impl std::fmt::Debug for ShardRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardRing")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ShardRing {
    /// A replica of the ring `config` names, writing its Leases with `client`.
    ///
    /// # Errors
    ///
    /// [`RingError::Config`] for timings that cannot fence (a renew deadline not shorter
    /// than the lease duration, a retry period not shorter than the renew deadline) or no
    /// slots.
    pub fn new(client: Client, config: RingConfig) -> Result<Self, RingError> {
        config.validate()?;
        let slots = config.slots;
        let api: Api<Lease> = Api::namespaced(client, &config.namespace);
        let leases = SharedInformer::builder(
            ApiListWatch::new(api.clone()).labels(&format!("{RING_LABEL}={}", config.name)),
        )
        .decoded()
        .build();
        let observed: Arc<Mutex<Observed>> = Arc::default();
        let changed = Arc::new(Notify::new());
        let (on_add, on_update, on_delete) = (
            (observed.clone(), changed.clone()),
            (observed.clone(), changed.clone()),
            (observed.clone(), changed.clone()),
        );
        // Renewals are observed as they arrive, so a member's or holder's expiry counts
        // from its last renewal and not from this replica's next look.
        let handler = handler_fn::<Lease>()
            .on_add(move |lease, _| {
                if let Some(name) = &lease.metadata.name {
                    lock(&on_add.0).seen(name, lease.spec.as_ref());
                }
                on_add.1.notify_one();
            })
            .on_update(move |old, new, _| {
                if let Some(name) = &new.metadata.name {
                    lock(&on_update.0).seen(name, new.spec.as_ref());
                }
                if holder_of(old) != holder_of(new)
                    || coverage_of(old) != coverage_of(new)
                    || annotation(old, FORWARDED_ANNOTATION)
                        != annotation(new, FORWARDED_ANNOTATION)
                    || annotation(old, TAKEN_ANNOTATION) != annotation(new, TAKEN_ANNOTATION)
                {
                    on_update.1.notify_one();
                }
            })
            .on_delete(move |gone| {
                if let Some(name) = &gone.object().metadata.name {
                    lock(&on_delete.0).forget(name);
                }
                on_delete.1.notify_one();
            });
        // An informer not yet started takes handlers; its handler cannot be refused.
        if let Err(error) = leases.handle().add_handler(handler) {
            warn!(%error, "the ring's Lease handler was refused");
        }
        Ok(Self {
            api,
            view: watch::Sender::new(RingView {
                slots,
                ..RingView::default()
            }),
            admission: Admission::new(slots, config.renew_deadline),
            observed,
            counters: Counters::new(),
            cache: leases.handle(),
            leases: Mutex::new(Some(leases)),
            changed,
            handovers: Arc::default(),
            forwarding: Mutex::new(Forwarding::new(first_forward_seq())),
            config,
        })
    }

    /// The ring's configuration.
    pub fn config(&self) -> &RingConfig {
        &self.config
    }

    /// This replica's first view of the ring: what it is dealt once it has looked at the
    /// ring's Leases (at once if it already has).
    pub async fn first_view(&self) -> RingView {
        let mut view = self.view.subscribe();
        // The sender lives in `self`, so the channel cannot close under this borrow.
        match view.wait_for(|v| !v.members.is_empty()).await {
            Ok(first) => first.clone(),
            Err(_) => RingView::default(),
        }
    }

    /// This replica's view, as it changes.
    pub fn view(&self) -> watch::Receiver<RingView> {
        self.view.subscribe()
    }

    /// What this replica's ring has done so far.
    pub fn stats(&self) -> RingStats {
        let view = self.view.borrow();
        RingStats {
            members: view.members.len(),
            assigned: view.assigned.len(),
            held: view.held.len(),
            taken: self.counters.taken.load(Ordering::Relaxed),
            released: self.counters.released.load(Ordering::Relaxed),
            lost: self.counters.lost.load(Ordering::Relaxed),
            last_handover: *lock(&self.counters.last_handover),
        }
    }

    /// The times from a membership change to a slot taken, in seconds.
    #[cfg(feature = "manager")]
    pub(crate) fn handover_seconds(&self) -> &prometheus_client::metrics::histogram::Histogram {
        &self.counters.handover_seconds
    }

    /// A guard for reconciling an object with this UID, if this replica holds its slot
    /// and the slot has been renewed within the renew deadline; `None` otherwise (another
    /// replica owns the object, this one is about to let it go, or its renewals are late).
    pub fn admit(&self, uid: &str) -> Option<SlotGuard> {
        self.admit_slot(self.slot_of(uid)).ok()
    }

    /// A guard for a reconcile on `slot`, or why there is none.
    pub(crate) fn admit_slot(&self, slot: u16) -> Result<SlotGuard, Refusal> {
        match self.admission.admit(slot) {
            // Lost without a handover comes first: whether or not the slot is dealt here
            // again, its holder now may not have seen what this replica sees there.
            Err(Refusal::NotHeld) if lock(&self.forwarding).owed().contains(&slot) => {
                Err(Refusal::Lost)
            }
            Err(Refusal::NotHeld) if self.incoming(slot) => Err(Refusal::Incoming),
            admitted => admitted,
        }
    }

    /// Forwards the deletion of the object `key` names (UID `uid`, a controller named
    /// `controller` saw it go) to the holder of `slot`, which this replica lost without
    /// handing it over.
    pub(crate) fn forward_deletion(
        &self,
        slot: u16,
        controller: &str,
        key: &crate::key::ObjectKey,
        uid: &str,
    ) -> Result<(), NotForwarded> {
        lock(&self.forwarding).forward(slot, controller, key.namespace(), key.name(), uid)
    }

    /// Whether `slot` is dealt to this replica (or warming for it) without being held yet.
    fn incoming(&self, slot: u16) -> bool {
        let view = self.view.borrow();
        view.assigned.contains(&slot) || view.warming.contains(&slot)
    }

    /// A controller is built on the ring: until it reports its cache, this replica is
    /// handed no slot another replica holds.
    pub(crate) fn expect_handover(&self) {
        self.handovers.expect();
    }

    /// Reports a controller's cache to the ring until the registration is dropped, so
    /// the ring hands its slots over without a gap (see `handover`).
    pub(crate) fn report_handover(&self, handover: Arc<dyn Handover>) -> HandoverRegistration {
        HandoverRegistration::new(&self.handovers, handover)
    }

    /// The slot of an object with this UID, in this ring.
    pub(crate) fn slot_of(&self, uid: &str) -> u16 {
        slot_of(uid, self.config.slots)
    }

    /// The slots [`admit`](Self::admit) grants guards on now: held, and renewed within the
    /// renew deadline.
    pub fn admitting(&self) -> BTreeSet<u16> {
        self.admission.admitting()
    }

    /// Its admission, driven by hand in tests of what runs on the ring.
    #[cfg(test)]
    pub(crate) fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Publishes a view dealing `assigned` to this replica, as a round would, for tests of
    /// what runs on the ring.
    #[cfg(test)]
    pub(crate) fn deal_for_test(&self, assigned: BTreeSet<u16>) {
        self.publish(
            vec![self.config.identity.clone()],
            assigned,
            BTreeSet::new(),
        );
    }

    /// How many times each slot was taken or resumed on this replica, as that changes: the
    /// keys refused on a slot granted again are to be queued again (see `admission`).
    pub(crate) fn grants(&self) -> watch::Receiver<Grants> {
        self.admission.grants()
    }

    /// Takes part in the ring until `cancel` fires, then lets go of every slot (after
    /// their reconciles finish) and leaves.
    ///
    /// # Errors
    ///
    /// [`RingError::Forbidden`] when RBAC refuses the Leases; other API errors are logged
    /// and retried every retry period.
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), RingError> {
        let informer = lock(&self.leases).take().ok_or(RingError::AlreadyRunning)?;
        let watching = cancel.child_token();
        let running = informer.spawn(watching.clone());
        info!(ring = %self.config.name, identity = %self.config.identity, slots = self.config.slots, "joining the shard ring");
        let leases = running.handle();
        let synced = tokio::select! {
            () = cancel.cancelled() => Ok(()),
            synced = leases.wait_synced_or_fatal() => synced,
        };
        if let Err(error) = synced {
            running.stop().await;
            return Err(RingError::Watch(error));
        }
        while !cancel.is_cancelled() {
            if let Err(error) = self.round().await {
                if is_forbidden(&error) {
                    self.leave().await;
                    running.stop().await;
                    return Err(RingError::Forbidden(error));
                }
                warn!(ring = %self.config.name, %error, "shard ring round failed; retrying");
            }
            // The next look: a retry period from now, or sooner when a Lease this replica
            // watches would go silent or expire, or one changes hands.
            let mut wait = self.config.retry_period;
            let next_deadline = lock(&self.observed).next_deadline(
                &self.config.identity,
                self.config.lease_duration,
                self.config.silence(),
            );
            if let Some(expiry) = next_deadline {
                wait = wait.min(expiry.saturating_duration_since(Instant::now()) + EXPIRY_MARGIN);
            }
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
                () = self.changed.notified() => {}
            }
        }
        self.leave().await;
        running.stop().await;
        Ok(())
    }

    /// One look at the ring: renew the member Lease, compute the assignment, then renew,
    /// take or let go of each slot.
    async fn round(&self) -> Result<(), kube_client::Error> {
        self.renew_member().await?;
        let by_name: HashMap<String, Arc<Lease>> = self
            .cache
            .store()
            .list()
            .into_iter()
            .filter_map(|l| Some((l.metadata.name.clone()?, l)))
            .collect();
        let members = self.live_members(&by_name);
        if self.view.borrow().members != members {
            *lock(&self.counters.membership_changed) = Some(Instant::now());
        }
        let assigned = self.dealt(&members);
        let held = self.admission.held();
        // Members silent for a while are likely gone: cache what their leaving would deal
        // this replica now, so their slots are warm when their Leases expire.
        let renewing: Vec<String> = members
            .iter()
            .filter(|m| !self.silent(m))
            .cloned()
            .collect();
        let warming: BTreeSet<u16> = if renewing.len() < members.len() {
            let mut warming = self.dealt(&renewing);
            warming.retain(|slot| !assigned.contains(slot));
            warming
        } else {
            BTreeSet::new()
        };
        let mut writes = Vec::new();
        for slot in 0..self.config.slots {
            let name = self.config.slot_lease(slot);
            let lease = by_name.get(&name).map(|l| &**l);
            let holder = lease.and_then(|l| self.live_holder(&name, l));
            let mine = holder.as_deref() == Some(self.config.identity.as_str());
            match (mine, assigned.contains(&slot), holder.is_some()) {
                (true, true, _) => writes.push(self.renew_slot(slot, lease).boxed()),
                // Kept, and reconciled on, until its next owner can take it without a gap;
                // once letting go has begun, it goes on.
                (true, false, _)
                    if held.contains(&slot) && !self.may_let_go(slot, &members, &by_name) =>
                {
                    writes.push(self.renew_slot(slot, lease).boxed())
                }
                (true, false, _) => writes.push(self.let_go(slot, lease, Drain::NextRound).boxed()),
                (false, true, false) => writes.push(self.take_slot(slot, lease).boxed()),
                (false, _, _) => {
                    // Someone else holds it (or it is not ours): never admit on it.
                    if self.admission.lose(slot, |slot| self.owe(slot)) {
                        self.counters.lost.fetch_add(1, Ordering::Relaxed);
                        warn!(ring = %self.config.name, slot, holder = ?holder, "lost a slot");
                    }
                }
            }
        }
        // Each slot's Lease is written on its own and all at once: a round lasts about one
        // request however many slots it holds, so a slow API server does not lapse the
        // slots that would have been renewed last.
        futures::future::join_all(writes).await;
        self.fence();
        self.exchange_forwarded(&by_name);
        self.publish(members, assigned, warming);
        Ok(())
    }

    /// Takes the deletions other members forward in the slots held here, drops this
    /// replica's own forwards once taken, and ends the debts on lost slots whose holders'
    /// caches now follow them.
    fn exchange_forwarded(&self, leases: &HashMap<String, Arc<Lease>>) {
        let held = self.admission.held();
        let prefix = format!("{}-member-", self.config.name);
        let mut members = BTreeMap::new();
        let mut coverage = HashMap::new();
        for (name, lease) in leases {
            let Some(member) = name.strip_prefix(&prefix) else {
                continue;
            };
            if member == self.config.identity {
                continue;
            }
            members.insert(
                member.to_owned(),
                MemberNotes {
                    forwarded: annotation(lease, FORWARDED_ANNOTATION),
                    taken: annotation(lease, TAKEN_ANNOTATION),
                },
            );
            coverage.insert(member, coverage_of(lease));
        }
        let holder = |slot: u16| {
            let name = self.config.slot_lease(slot);
            let lease = leases.get(&name)?;
            self.live_holder(&name, lease)
        };
        let mut forwarding = lock(&self.forwarding);
        let delivered = forwarding.exchange(&self.config.identity, &held, &members, holder);
        let owed: Vec<u16> = forwarding.owed().iter().copied().collect();
        let settled: Vec<u16> = owed
            .into_iter()
            .filter(|&slot| {
                if held.contains(&slot) {
                    return true;
                }
                // Nobody holds it, or this replica's Lease cache, behind after an outage,
                // still names it: whoever takes it may not cache it yet.
                let Some(holder) = holder(slot).filter(|h| *h != self.config.identity) else {
                    return false;
                };
                match coverage.get(holder.as_str()) {
                    // Its controllers follow the slot from a version this replica has
                    // reached: every deletion it could still see, the holder sees too.
                    Some(Some(text)) => Coverage::parse(text).is_some_and(|coverage| {
                        coverage.slots.contains(&slot)
                            && self.handovers.caught_up(slot, coverage.resource_version)
                    }),
                    // No controller was built on the ring there: nothing to forward to.
                    Some(None) => true,
                    // Its member Lease is not cached here yet.
                    None => false,
                }
            })
            .collect();
        for &slot in &settled {
            forwarding.settle(slot);
        }
        drop(forwarding);
        if !settled.is_empty() {
            debug!(ring = %self.config.name, ?settled, "lost slots followed by their holders; nothing more to forward there");
        }
        if !delivered.is_empty() {
            info!(ring = %self.config.name, deletions = delivered.len(), "took deletions forwarded by replicas that lost their slots");
            self.handovers.take_forwarded(&delivered);
        }
    }

    /// Whether this replica may let go of `slot`, dealt to another of `members`: that
    /// replica is renewing, says its cache follows the slot (or says nothing of its
    /// caches), and this replica's controllers have caught up with the version it follows
    /// from.
    fn may_let_go(
        &self,
        slot: u16,
        members: &[String],
        leases: &HashMap<String, Arc<Lease>>,
    ) -> bool {
        let owners = deal(members, self.config.slots);
        let Some(owner) = owners.get(usize::from(slot)).and_then(|&i| members.get(i)) else {
            return true;
        };
        if self.silent(owner) {
            // Likely gone: the slot comes back here or goes to a live replica.
            return false;
        }
        let said = leases
            .get(&self.config.member_lease(owner))
            .and_then(|lease| coverage_of(lease));
        let Some(said) = said else {
            return true;
        };
        match Coverage::parse(said) {
            Some(coverage) => {
                coverage.slots.contains(&slot)
                    && self.handovers.caught_up(slot, coverage.resource_version)
            }
            None => {
                warn!(ring = %self.config.name, %owner, annotation = %said, "a member's coverage cannot be read; handing the slot over without it");
                true
            }
        }
    }

    /// The slots this replica is dealt among `members` (sorted).
    fn dealt(&self, members: &[String]) -> BTreeSet<u16> {
        dealt_slots(members, &self.config.identity, self.config.slots)
    }

    /// Whether `member` (another replica) has not renewed its Lease for the silence
    /// this replica takes as a sign it is gone.
    fn silent(&self, member: &str) -> bool {
        if member == self.config.identity {
            return false;
        }
        let name = self.config.member_lease(member);
        lock(&self.observed)
            .records
            .get(&name)
            .is_some_and(|(_, seen)| seen.elapsed() >= self.config.silence())
    }

    fn live_members(&self, leases: &HashMap<String, Arc<Lease>>) -> Vec<String> {
        let prefix = format!("{}-member-", self.config.name);
        let mut members: BTreeSet<String> = leases
            .iter()
            .filter(|(name, _)| name.starts_with(&prefix))
            .filter_map(|(name, lease)| self.live_holder(name, lease))
            .collect();
        members.insert(self.config.identity.clone());
        members.into_iter().collect()
    }

    /// The holder of `lease`, if it has renewed within its duration as this replica saw it.
    fn live_holder(&self, name: &str, lease: &Lease) -> Option<String> {
        let spec = lease.spec.as_ref()?;
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
        let seen = lock(&self.observed).seen(name, Some(spec));
        let duration = lease_duration_of(spec, self.config.lease_duration);
        (holder == self.config.identity || seen.elapsed() < duration).then_some(holder)
    }

    /// Drops the slots whose renewals have failed for the renew deadline.
    fn fence(&self) {
        for slot in self.admission.fence(|slot| self.owe(slot)) {
            self.counters.lost.fetch_add(1, Ordering::Relaxed);
            warn!(ring = %self.config.name, slot, "slot renewals failed past the renew deadline; no longer reconciling it");
        }
    }

    /// `slot` was lost without a handover: the deletions this replica's controllers see
    /// there from now on are forwarded (see `forward`). Called under the admission's lock
    /// as the slot stops admitting, so no reconcile finds it refused as merely not held
    /// (and drops a deletion) in between.
    fn owe(&self, slot: u16) {
        if self.handovers.any() {
            lock(&self.forwarding).lost(slot);
        }
    }

    fn publish(&self, members: Vec<String>, assigned: BTreeSet<u16>, warming: BTreeSet<u16>) {
        let held = self.admission.held();
        let owed = lock(&self.forwarding).owed().clone();
        let view = RingView {
            members,
            assigned,
            held,
            warming,
            owed,
            slots: self.config.slots,
        };
        self.view.send_if_modified(|current| {
            let changed = *current != view;
            *current = view;
            changed
        });
    }

    /// Lets go of every slot and deletes the member Lease.
    async fn leave(&self) {
        let leases = self
            .api
            .list(&ListParams::default().labels(&format!("{RING_LABEL}={}", self.config.name)))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        // Held, or still ours on the server while draining from an earlier round.
        let mut ours = self.admission.held();
        ours.extend((0..self.config.slots).filter(|&slot| {
            let name = self.config.slot_lease(slot);
            leases.iter().any(|l| {
                l.metadata.name.as_deref() == Some(&name)
                    && l.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                        == Some(self.config.identity.as_str())
            })
        }));
        for slot in ours {
            let name = self.config.slot_lease(slot);
            let lease = leases
                .iter()
                .find(|l| l.metadata.name.as_deref() == Some(&name));
            self.let_go(slot, lease, Drain::Wait).await;
        }
        let member = self.config.member_lease(&self.config.identity);
        if let Err(error) = self.api.delete(&member, &DeleteParams::default()).await {
            debug!(ring = %self.config.name, %error, "could not delete the member Lease; it expires");
        }
        // Gone from the ring, it can forward nothing more: what its member Lease still
        // listed goes with it (see `forward`).
        *lock(&self.forwarding) = Forwarding::new(first_forward_seq());
        self.publish(Vec::new(), BTreeSet::new(), BTreeSet::new());
        info!(ring = %self.config.name, identity = %self.config.identity, "left the shard ring");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn slots_are_dealt_evenly_to_every_member() {
        let three = members(&["a", "b", "c"]);
        let dealt: Vec<_> = three.iter().map(|m| dealt_slots(&three, m, 16)).collect();
        let sizes: Vec<_> = dealt.iter().map(BTreeSet::len).collect();
        assert_eq!(sizes, [6, 5, 5]);
        let all: BTreeSet<u16> = dealt.iter().flatten().copied().collect();
        assert_eq!(all, (0..16).collect());
        assert!(dealt_slots(&three, "stranger", 16).is_empty());
    }

    #[test]
    fn a_change_of_members_moves_few_slots_besides_its_own() {
        // Over many rings of 4 members and 16 slots: a member leaving frees its own slots,
        // which spread over the survivors, and moves about one more on average (capacities
        // shift); a member joining takes its share and moves about one or two more.
        const RINGS: usize = 200;
        let (mut left_extra, mut left_max, mut spread) = (0, 0, 0);
        let (mut joined_extra, mut joined_max) = (0, 0);
        for ring in 0..RINGS {
            let names: Vec<String> = (0..4).map(|i| format!("replica-{ring}-{i}")).collect();
            let before = deal(&names, 16);
            let survivors: Vec<String> = names[1..].to_vec();
            let after = deal(&survivors, 16);
            let owner_after = |s: usize| survivors[after[s]].as_str();
            let extra = (0..16)
                .filter(|&s| before[s] != 0 && names[before[s]] != owner_after(s))
                .count();
            let heirs: BTreeSet<&str> = (0..16)
                .filter(|&s| before[s] == 0)
                .map(owner_after)
                .collect();
            (left_extra, left_max) = (left_extra + extra, left_max.max(extra));
            spread += usize::from(heirs.len() >= 2);

            let mut joined = names.clone();
            joined.push(format!("replica-{ring}-joiner"));
            joined.sort();
            let with_joiner = deal(&joined, 16);
            let owner = |s: usize| joined[with_joiner[s]].as_str();
            let taken = (0..16).filter(|&s| owner(s).ends_with("joiner")).count();
            assert!(
                taken >= 3,
                "ring {ring}: the joiner has its share ({taken})"
            );
            let extra = (0..16)
                .filter(|&s| !owner(s).ends_with("joiner") && owner(s) != names[before[s]])
                .count();
            (joined_extra, joined_max) = (joined_extra + extra, joined_max.max(extra));
        }
        assert!(
            left_extra * 2 <= RINGS * 3,
            "leaving: {left_extra} extra moves"
        );
        assert!(left_max <= 4, "leaving: at most {left_max} extra moves");
        assert!(
            spread * 10 >= RINGS * 9,
            "a leaver's slots spread: {spread} of {RINGS}"
        );
        assert!(
            joined_extra <= RINGS * 2,
            "joining: {joined_extra} extra moves"
        );
        assert!(joined_max <= 5, "joining: at most {joined_max} extra moves");
    }

    #[test]
    fn a_slot_s_range_holds_exactly_the_uids_of_the_slot() {
        for slots in [1, 3, 16] {
            for i in 0..500 {
                let uid = format!("{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let slot = slot_of(&uid, slots);
                let view = RingView {
                    held: [slot].into(),
                    slots,
                    ..RingView::default()
                };
                assert!(
                    view.shard().unwrap().contains_value(&uid),
                    "{uid} in slot {slot} of {slots}"
                );
                let others = RingView {
                    held: (0..slots).filter(|s| *s != slot).collect(),
                    slots,
                    ..RingView::default()
                };
                if let Some(shard) = others.shard() {
                    assert!(!shard.contains_value(&uid));
                }
            }
        }
    }

    #[test]
    fn adjacent_slots_merge_into_one_range() {
        let view = RingView {
            assigned: [0, 1, 2].into(),
            held: [5].into(),
            slots: 8,
            ..RingView::default()
        };
        assert_eq!(view.shard().unwrap().ranges().len(), 2);
    }
}
