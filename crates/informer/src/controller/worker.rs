//! The workers: take a key, reconcile it (panics caught, the timeout applied), apply the
//! action or the error policy, and count what happened.

use std::{
    panic::AssertUnwindSafe,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::FutureExt;
use kube_core::Resource;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

#[cfg(feature = "prometheus")]
use super::metrics::{Outcome, Recorder};
use super::{
    last_state::{LastState, LastStates},
    own_writes::{Cache, Caches, NotObserved},
    reconciler::Reconciler,
    request::{Action, ErrorAction, Failure, ReconcileError, ReconcileRequest},
    source::Parked,
};
use crate::{
    error::{error_chain, panic_message},
    informer::InformerHandle,
    key::ObjectKey,
    sharding::{MAX_FORWARDED, NotForwarded, Refusal, ShardRing},
    workqueue::{RateLimitingQueue, Tenant},
};

/// What a controller's workers have done, from [`Controller::stats`](crate::Controller::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ControllerStats {
    /// Reconciles that succeeded.
    pub synced: u64,
    /// Reconciles that failed, panics and timeouts included.
    pub failed: u64,
    /// Reconciles that panicked.
    pub panicked: u64,
    /// Keys the error policy gave up on.
    pub dropped: u64,
    /// Keys left to another replica of a [sharded](crate::Controller::sharded) controller.
    pub elsewhere: u64,
    /// Keys a [sharded](crate::Controller::sharded) controller held back while their
    /// slot's renewals were late (a slow API server, a busy machine), each reconciled once
    /// a renewal goes through.
    pub held_back: u64,
    /// Deletions a [sharded](crate::Controller::sharded) controller saw in slots it lost
    /// without handing them over (its renewals failed for the renew deadline), forwarded
    /// to the slots' new holders.
    pub forwarded: u64,
}

/// The counters behind [`ControllerStats`], which the workers add to.
#[derive(Debug, Default)]
pub(super) struct WorkerCounters {
    synced: AtomicU64,
    failed: AtomicU64,
    panicked: AtomicU64,
    dropped: AtomicU64,
    elsewhere: AtomicU64,
    held_back: AtomicU64,
    forwarded: AtomicU64,
}

impl WorkerCounters {
    pub(super) fn snapshot(&self) -> ControllerStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ControllerStats {
            synced: read(&self.synced),
            failed: read(&self.failed),
            panicked: read(&self.panicked),
            dropped: read(&self.dropped),
            elsewhere: read(&self.elsewhere),
            held_back: read(&self.held_back),
            forwarded: read(&self.forwarded),
        }
    }

    fn record_forwarded(&self) {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
    }

    fn record_held_back(&self) {
        self.held_back.fetch_add(1, Ordering::Relaxed);
    }

    fn record_elsewhere(&self) {
        self.elsewhere.fetch_add(1, Ordering::Relaxed);
    }

    fn record_synced(&self) {
        self.synced.fetch_add(1, Ordering::Relaxed);
    }

    fn record_failed(&self, panicked: bool) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        if panicked {
            self.panicked.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn record_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// What every worker of one controller shares.
pub(super) struct Worker<K, Rec> {
    pub(super) name: String,
    pub(super) queue: RateLimitingQueue<ObjectKey>,
    pub(super) primary: InformerHandle<K>,
    pub(super) deleted: LastStates<K>,
    pub(super) reconciler: Rec,
    pub(super) reconcile_timeout: Option<Duration>,
    /// The fleet's turns, taken before each reconcile when the controller shares them.
    pub(super) turns: Option<Tenant>,
    pub(super) stats: Arc<WorkerCounters>,
    #[cfg(feature = "prometheus")]
    pub(super) recorder: Option<Recorder>,
    pub(super) cancel: CancellationToken,
    /// The shard ring whose held slots bound what this replica reconciles.
    pub(super) ring: Option<Arc<ShardRing>>,
    /// Keys held back while their slot's renewals lapsed.
    pub(super) parked: Parked,
    /// What the controller's client wrote: a key's reconcile waits until the primary's
    /// cache has observed the writes to it.
    pub(super) caches: Arc<Caches>,
    /// The primary's writes, looked up once rather than on every reconcile.
    pub(super) primary_writes: Option<Arc<Cache<K>>>,
    /// The queued keys' traces, which each reconcile continues.
    #[cfg(feature = "opentelemetry")]
    pub(super) spans: Arc<crate::telemetry::spans::QueuedSpans>,
}

impl<K, Rec> Worker<K, Rec>
where
    K: Resource + Send + Sync + 'static,
    Rec: Reconciler<K>,
{
    /// Takes keys until the queue shuts down or the controller is cancelled: no new key is
    /// taken once cancelled, even with keys still queued.
    pub(super) async fn run(&self, id: usize) {
        loop {
            let key = tokio::select! {
                biased;
                () = self.cancel.cancelled() => None,
                key = self.queue.get() => key,
            };
            let Some(key) = key else { break };
            // Taken after the key, so a tenant waits in the fleet's line only with work.
            let turn = match &self.turns {
                None => None,
                Some(tenant) => tokio::select! {
                    biased;
                    () = self.cancel.cancelled() => {
                        self.queue.done(&key);
                        break;
                    }
                    turn = tenant.turn() => Some(turn),
                },
            };
            self.reconcile_one(&key).await;
            drop(turn);
            self.queue.done(&key);
        }
        debug!(controller = %self.name, worker = id, "worker stopped");
    }

    async fn reconcile_one(&self, key: &ObjectKey) {
        #[cfg(feature = "opentelemetry")]
        let wait = self.spans.taken(key);
        let observed = match &self.primary_writes {
            Some(cache) => self.caches.observe(cache, Some(key)).await,
            None => Ok(()),
        };
        match observed {
            Ok(()) | Err(NotObserved::Stopped) => {}
            Err(NotObserved::Cancelled) => return,
            Err(NotObserved::TimedOut {
                written, waited, ..
            }) => {
                warn!(controller = %self.name, %key, %written, ?waited, "the cache has not observed this controller's write to the key; retried later");
                self.stats.record_failed(false);
                self.queue.add_rate_limited(key.clone());
                return;
            }
        }
        let (request, uid) = match self.primary.store().get_by_key(key) {
            Some(obj) => {
                let uid = obj.meta().uid.clone();
                (ReconcileRequest::Present(obj), uid)
            }
            None => {
                let last = self.deleted.get(key);
                let uid = last.as_ref().and_then(|l| l.uid().map(str::to_owned));
                let last_known = last.as_ref().and_then(|l| l.object().cloned());
                drop(last);
                let deleted = ReconcileRequest::Deleted {
                    key: key.clone(),
                    last_known,
                    uid: uid.clone(),
                };
                (deleted, uid)
            }
        };
        // Held for the whole reconcile: the ring does not hand the slot over meanwhile.
        let _slot = match &self.ring {
            None => None,
            Some(ring) => {
                let slot = uid.as_deref().map(|uid| ring.slot_of(uid));
                match slot.map(|slot| (slot, ring.admit_slot(slot))) {
                    Some((_, Ok(guard))) => Some(guard),
                    Some((slot, Err(refusal @ (Refusal::Lapsed | Refusal::Incoming)))) => {
                        self.hold_back(ring, slot, key, refusal);
                        return;
                    }
                    Some((slot, Err(Refusal::Lost))) => {
                        if let (ReconcileRequest::Deleted { .. }, Some(uid)) = (&request, &uid) {
                            self.forward(ring, slot, key, uid);
                        }
                        self.stats.record_elsewhere();
                        self.queue.forget(key);
                        self.deleted.remove(key);
                        return;
                    }
                    Some((_, Err(Refusal::NotHeld))) | None => {
                        debug!(controller = %self.name, %key, "not in a slot this replica holds; left to its owner");
                        self.stats.record_elsewhere();
                        self.queue.forget(key);
                        self.deleted.remove(key);
                        return;
                    }
                }
            }
        };
        let reconciled = match &request {
            ReconcileRequest::Present(obj) => Reconciled::Present(obj.meta().uid.clone()),
            ReconcileRequest::Deleted { last_known, .. } => Reconciled::Deleted(last_known.clone()),
        };
        #[cfg(feature = "prometheus")]
        if let Some(recorder) = &self.recorder {
            recorder.started();
        }
        let started = tokio::time::Instant::now();
        #[cfg(feature = "opentelemetry")]
        let call = tracing::Instrument::instrument(
            self.call(request),
            crate::telemetry::spans::reconcile(&self.name, key, wait),
        );
        #[cfg(not(feature = "opentelemetry"))]
        let call = self.call(request);
        // A reconcile is cancelled by dropping it, as a future is: the controller stops.
        let outcome = tokio::select! {
            biased;
            outcome = call => outcome,
            () = self.cancel.cancelled() => {
                debug!(controller = %self.name, %key, "reconcile cancelled: the controller is stopping");
                #[cfg(feature = "prometheus")]
                if let Some(recorder) = &self.recorder {
                    recorder.cancelled();
                }
                return;
            }
        };
        let result = match &outcome {
            Ok(action) if action.requeue_after.is_some() => "requeue_after",
            Ok(_) => "success",
            Err(_) => "error",
        };
        debug!(controller = %self.name, %key, result, elapsed_ms = started.elapsed().as_millis(), "reconciled");
        #[cfg(feature = "prometheus")]
        if let Some(recorder) = &self.recorder {
            let result = match &outcome {
                Ok(action) if action.requeue_after.is_some() => Outcome::RequeueAfter,
                Ok(_) => Outcome::Success,
                Err(error) => {
                    if matches!(error, ReconcileError::Panicked(_)) {
                        recorder.panicked();
                    }
                    Outcome::Error
                }
            };
            recorder.finished(result, started.elapsed());
        }
        match outcome {
            Ok(action) => {
                self.stats.record_synced();
                self.queue.forget(key);
                self.forget_last_state(key, &reconciled);
                if let Some(delay) = action.requeue_after {
                    debug!(controller = %self.name, %key, ?delay, "requeued after");
                    self.queue.add_after(key.clone(), delay);
                }
            }
            Err(error) => self.failed(key, &error),
        }
    }

    /// Drops the last state kept for `key` once it is of no more use: the deletion it was
    /// kept for is reconciled, or the key names another object now. A deletion recorded
    /// while the reconcile ran is kept: its own reconcile comes next.
    fn forget_last_state(&self, key: &ObjectKey, reconciled: &Reconciled<K>) {
        match reconciled {
            Reconciled::Deleted(Some(last)) => {
                self.deleted.remove_if(key, |_, kept| {
                    kept.object().is_some_and(|kept| Arc::ptr_eq(kept, last))
                });
            }
            Reconciled::Deleted(None) => {
                self.deleted
                    .remove_if(key, |_, kept| matches!(kept, LastState::Forwarded(_)));
            }
            Reconciled::Present(uid) => {
                self.deleted
                    .remove_if(key, |_, kept| kept.uid() != uid.as_deref());
            }
        }
    }

    /// Forwards the deletion of `key` (UID `uid`) in `slot`, lost without a handover, to
    /// the slot's holder.
    fn forward(&self, ring: &ShardRing, slot: u16, key: &ObjectKey, uid: &str) {
        match ring.forward_deletion(slot, &self.name, key, uid) {
            Ok(()) => {
                debug!(controller = %self.name, %key, slot, "deleted in a slot lost without a handover; forwarded to its holder");
                self.stats.record_forwarded();
            }
            Err(NotForwarded::NotOwed) => {
                debug!(controller = %self.name, %key, slot, "deleted in a slot whose holder follows it; left to the holder");
            }
            Err(NotForwarded::Full) => {
                error!(controller = %self.name, %key, slot, max = MAX_FORWARDED, "too many deletions wait for their holders; this one is not forwarded and its reconcile is lost");
            }
        }
    }

    /// Keeps `key` aside until `slot` admits: once renewed again (its renewals were late),
    /// or once taken (it is dealt to this replica and its old owner is handing it over).
    fn hold_back(&self, ring: &ShardRing, slot: u16, key: &ObjectKey, refusal: Refusal) {
        if refusal == Refusal::Lapsed {
            debug!(controller = %self.name, %key, slot, "the slot's renewals are late; held back until it is renewed");
        } else {
            debug!(controller = %self.name, %key, slot, "the slot is not taken yet; held back until it is");
        }
        self.stats.record_held_back();
        self.queue.forget(key);
        self.parked.park(slot, key.clone());
        // A renewal between the refusal and the parking resumed the slot, or the slot was
        // lost, before the follower could see this key: asked again, the slot either
        // admits now, or is lost and its deletions are forwarded (queued here for the
        // workers to do so), or has noted the refusal (queued by the follower when it
        // resumes or is lost).
        let settled = match ring.admit_slot(slot) {
            Ok(_) | Err(Refusal::Lost) => true,
            Err(Refusal::Lapsed | Refusal::Incoming | Refusal::NotHeld) => false,
        };
        if settled && self.parked.unpark(slot, key) {
            self.queue.add(key.clone());
        }
    }

    fn failed(&self, key: &ObjectKey, error: &ReconcileError<Rec::Error>) {
        self.stats
            .record_failed(matches!(error, ReconcileError::Panicked(_)));
        let failure = Failure {
            key,
            error,
            retries: self.queue.num_requeues(key),
        };
        let action = self.reconciler.error_policy(&failure);
        let message = error_chain(error);
        match action {
            ErrorAction::Backoff => {
                warn!(controller = %self.name, %key, error = %message, retry = failure.retries + 1, "reconcile failed; requeued with backoff");
                self.queue.add_rate_limited(key.clone());
            }
            ErrorAction::RequeueAfter(delay) => {
                warn!(controller = %self.name, %key, error = %message, ?delay, "reconcile failed; requeued after");
                self.queue.forget(key);
                self.queue.add_after(key.clone(), delay);
            }
            ErrorAction::GiveUp => {
                error!(controller = %self.name, %key, error = %message, retries = failure.retries, "reconcile failed; giving up on this key until it changes");
                self.stats.record_dropped();
                #[cfg(feature = "prometheus")]
                if let Some(recorder) = &self.recorder {
                    recorder.gave_up();
                }
                self.queue.forget(key);
            }
        }
    }

    /// The reconcile, with its panic caught and its timeout applied.
    async fn call(
        &self,
        request: ReconcileRequest<K>,
    ) -> Result<Action, ReconcileError<Rec::Error>> {
        // The reconcile may panic while building its future or while it runs.
        let future =
            match std::panic::catch_unwind(AssertUnwindSafe(|| self.reconciler.reconcile(request)))
            {
                Ok(future) => future,
                Err(panic) => {
                    return Err(ReconcileError::Panicked(panic_message(&*panic).to_owned()));
                }
            };
        let guarded = AssertUnwindSafe(future).catch_unwind();
        let outcome = match self.reconcile_timeout {
            Some(limit) => match tokio::time::timeout(limit, guarded).await {
                Ok(outcome) => outcome,
                // Dropped at the timeout, as any future is cancelled.
                Err(_) => {
                    return Err(ReconcileError::TimedOut(limit));
                }
            },
            None => guarded.await,
        };
        match outcome {
            Ok(Ok(action)) => Ok(action),
            Ok(Err(error)) => Err(ReconcileError::Failed(error)),
            Err(panic) => Err(ReconcileError::Panicked(panic_message(&*panic).to_owned())),
        }
    }
}

/// What a reconcile was handed, as far as the last state kept for its key goes.
enum Reconciled<K> {
    /// An object, by its UID.
    Present(Option<String>),
    /// A deletion, with the last state kept for it.
    Deleted(Option<Arc<K>>),
}
