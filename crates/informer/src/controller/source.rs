//! Where a controller's keys come from: handlers on informers (the primary's own, owned
//! children, watched objects) and streams of keys, all feeding one queue.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use futures::{Stream, StreamExt, future::BoxFuture};
use kube_core::Resource;
use tracing::{debug, warn};

use super::{
    last_state::{LastState, LastStates},
    predicate::Predicate,
};
use crate::{
    error::Error,
    informer::{
        DeletedObject, Delivery, HandlerRegistration, HasSynced, InformerHandle, handler_fn,
    },
    key::ObjectKey,
    list_watch::ShardField,
    sharding::{Granted, Grants, RingView, ShardRing, slot_of},
    workqueue::{Priority, RateLimitingQueue},
};

/// Maps a watched object to the primaries to reconcile.
pub(super) type Mapper<O> = Arc<dyn Fn(&O) -> Vec<ObjectKey> + Send + Sync>;

/// One source of keys: registers itself when the controller runs.
pub(super) type Source = Box<dyn FnOnce(Enqueue, Duration) -> Result<Registered, Error> + Send>;

/// A registered source: what to remove when the controller stops, and the wait for its
/// sync.
pub(super) struct Registered {
    pub(super) registration: Registration,
    pub(super) synced: BoxFuture<'static, Result<(), Error>>,
}

/// What a source left running.
pub(super) enum Registration {
    /// A handler on an informer.
    Handler(HandlerRegistration),
    /// A task forwarding a stream of keys.
    Forwarder(tokio::task::AbortHandle),
}

impl Registration {
    fn remove(self) {
        match self {
            Registration::Handler(registration) => registration.remove(),
            Registration::Forwarder(task) => task.abort(),
        }
    }
}

pub(super) fn remove_all(registered: Vec<Registration>) {
    for registration in registered {
        registration.remove();
    }
}

/// Where sources put keys.
#[derive(Clone)]
pub(super) struct Enqueue {
    pub(super) queue: RateLimitingQueue<ObjectKey>,
    /// The controller's name, which its handlers are named after.
    pub(super) controller: Arc<str>,
    /// Each queued key's trace: its watch event and its wait.
    #[cfg(feature = "opentelemetry")]
    pub(super) spans: Arc<crate::telemetry::spans::QueuedSpans>,
}

impl Enqueue {
    fn keys(&self, keys: impl IntoIterator<Item = ObjectKey>, priority: Priority) {
        for key in keys {
            #[cfg(feature = "opentelemetry")]
            self.spans
                .enqueued(&self.controller, &key, priority == Priority::Low);
            self.queue.add_with_priority(key, priority);
        }
    }
}

/// Replays (the initial list, a handler's first objects, a resync) go behind live changes
/// (controller-runtime's priority queue).
fn priority(delivery: Delivery) -> Priority {
    if delivery.is_replay() {
        Priority::Low
    } else {
        Priority::Normal
    }
}

/// A key for `obj`, or a log line saying why there is none.
pub(super) fn key_of<K: Resource>(obj: &K) -> Option<ObjectKey> {
    match ObjectKey::from_object(obj) {
        Ok(key) => Some(key),
        Err(error) => {
            warn!(%error, "object without a key; ignored");
            None
        }
    }
}

/// The wait for a source: its informer synced, then its handler. A first sync that fails
/// in a way retrying cannot fix (403, 401, 404) fails the wait unless the informer still
/// syncs within `grace`: permissions or CRDs applied moments before the controller starts
/// need a moment to be honoured.
fn registration_synced<O: Resource + Send + Sync + 'static>(
    informer: InformerHandle<O>,
    registration: &HandlerRegistration,
    grace: Duration,
) -> BoxFuture<'static, Result<(), Error>> {
    let mut handler_synced = registration.synced_receiver();
    Box::pin(async move {
        if let Err(error) = informer.wait_synced_or_fatal().await {
            warn!(%error, ?grace, "first sync failed; retrying within the startup grace");
            tokio::time::timeout(grace, informer.wait_synced())
                .await
                .map_err(|_| error)?;
        }
        // The sender goes with the handler: a removed handler never syncs.
        if handler_synced.wait_for(|s| *s).await.is_err() {
            return Err(Error::InformerStopped);
        }
        Ok(())
    })
}

/// The primary's own source: every add and delete, updates that pass `predicate`; the last
/// state of a deleted primary is kept for its reconcile.
pub(super) fn primary<K>(
    primary: InformerHandle<K>,
    predicate: Predicate<K>,
    deleted: LastStates<K>,
) -> Source
where
    K: Resource + Send + Sync + 'static,
{
    Box::new(move |enqueue: Enqueue, grace| {
        let name = enqueue.controller.to_string();
        let (on_add, on_update, on_delete) = (enqueue.clone(), enqueue.clone(), enqueue.clone());
        let on_initial_key = enqueue;
        let shard = primary.shard_cell();
        let handler = handler_fn::<K>()
            .on_add(move |obj, delivery| on_add.keys(key_of(&**obj), priority(delivery)))
            .on_update(move |old, new, delivery| {
                if predicate.accepts(old, new) {
                    on_update.keys(key_of(&**new), priority(delivery));
                }
            })
            .on_delete(move |gone: &DeletedObject<K>| {
                let last = gone.object();
                // A relist after a reshard leaves out what left the shard: that object is
                // another replica's now, not deleted, and keeping its last state here
                // would only hold memory for good.
                let left_shard = matches!(gone, DeletedObject::FinalStateUnknown(_))
                    && shard.as_ref().is_some_and(|shard| !shard.contains(&**last));
                if left_shard {
                    return;
                }
                if let Some(key) = key_of(&**last) {
                    deleted.insert(key.clone(), LastState::Seen(last.clone()));
                    on_delete.keys([key], Priority::Normal);
                }
            });
        // A warm restart's objects need not be decoded to be queued.
        let initial_key = move |key: &ObjectKey| {
            on_initial_key.keys([key.clone()], priority(Delivery::InitialList))
        };
        let registration = primary.add_named_keyed_handler(name, handler, initial_key)?;
        let synced = registration_synced(primary, &registration, grace);
        Ok(Registered {
            registration: Registration::Handler(registration),
            synced,
        })
    })
}

/// Another informer's objects, mapped to primaries by `map`: for an update, the primaries
/// of the old state and of the new.
pub(super) fn mapped<O>(
    informer: InformerHandle<O>,
    map: Mapper<O>,
    predicate: Predicate<O>,
) -> Source
where
    O: Resource + Send + Sync + 'static,
{
    Box::new(move |enqueue: Enqueue, grace| {
        let kind = std::any::type_name::<O>()
            .rsplit("::")
            .next()
            .unwrap_or("objects");
        let name = format!("{}/{kind}", enqueue.controller);
        let (on_add, on_update, on_delete) = (enqueue.clone(), enqueue.clone(), enqueue);
        let (map_add, map_update, map_delete) = (map.clone(), map.clone(), map);
        let handler = handler_fn::<O>()
            .on_add(move |obj, delivery| on_add.keys(map_add(obj), priority(delivery)))
            .on_update(move |old, new, delivery| {
                if predicate.accepts(old, new) {
                    let keys: HashSet<ObjectKey> =
                        map_update(old).into_iter().chain(map_update(new)).collect();
                    on_update.keys(keys, priority(delivery));
                }
            })
            .on_delete(move |deleted| {
                on_delete.keys(map_delete(deleted.object()), Priority::Normal)
            });
        let registration = informer.add_named_handler(name, handler)?;
        let synced = registration_synced(informer, &registration, grace);
        Ok(Registered {
            registration: Registration::Handler(registration),
            synced,
        })
    })
}

/// Every key `keys` yields, at normal priority, from the start of the run.
pub(super) fn stream(keys: impl Stream<Item = ObjectKey> + Send + 'static) -> Source {
    Box::new(move |enqueue: Enqueue, _grace| {
        let forwarder = tokio::spawn(async move {
            let mut keys = std::pin::pin!(keys);
            while let Some(key) = keys.next().await {
                enqueue.keys([key], Priority::Normal);
            }
        });
        Ok(Registered {
            registration: Registration::Forwarder(forwarder.abort_handle()),
            synced: Box::pin(async { Ok(()) }),
        })
    })
}

/// An informer that follows a sharded controller's ring: the primary's takes the ring's
/// shard of UIDs, owned children's the same slots of their controller owner's UID.
#[derive(Clone)]
pub(crate) struct Follower(Arc<dyn Fn(&RingView) + Send + Sync>);

impl Follower {
    pub(super) fn primary<K: Resource + Send + Sync + 'static>(
        informer: InformerHandle<K>,
    ) -> Self {
        Self::of(informer, ShardField::Uid)
    }

    pub(super) fn children<C: Resource + Send + Sync + 'static>(
        informer: InformerHandle<C>,
    ) -> Self {
        Self::of(informer, ShardField::ControllerUid)
    }

    fn of<O: Resource + Send + Sync + 'static>(
        informer: InformerHandle<O>,
        field: ShardField,
    ) -> Self {
        Self(Arc::new(move |view: &RingView| {
            if let Some(shard) = view.shard_by(field)
                && let Err(error) = informer.reshard(shard)
            {
                warn!(%error, ?field, "an informer cannot follow the ring");
            }
        }))
    }

    pub(crate) fn follow(&self, view: &RingView) {
        (self.0)(view);
    }
}

/// Keys a sharded controller refused while their slot's renewals lapsed, or before it took
/// a slot dealt to it, by slot: queued again when a renewal resumes the slot or the slot
/// is taken (see [`follow_ring`]).
#[derive(Clone, Default)]
pub(super) struct Parked(Arc<Mutex<BTreeMap<u16, HashSet<ObjectKey>>>>);

impl Parked {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u16, HashSet<ObjectKey>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `key` aside until `slot` resumes.
    pub(super) fn park(&self, slot: u16, key: ObjectKey) {
        self.lock().entry(slot).or_default().insert(key);
    }

    /// Takes `key` back out of `slot`'s keys; whether it was there.
    pub(super) fn unpark(&self, slot: u16, key: &ObjectKey) -> bool {
        let mut parked = self.lock();
        let Some(keys) = parked.get_mut(&slot) else {
            return false;
        };
        let was = keys.remove(key);
        if keys.is_empty() {
            parked.remove(&slot);
        }
        was
    }

    /// Whether a key is kept aside for `slot`.
    pub(super) fn any(&self, slot: u16) -> bool {
        self.lock().contains_key(&slot)
    }

    /// Queues every key kept aside for `slot`; how many. The lock is held until they are
    /// queued: a key is always either kept aside or queued, as the ring's
    /// [`caught_up`](crate::sharding::Handover::caught_up) asks.
    fn requeue(&self, slot: u16, queue: &RateLimitingQueue<ObjectKey>) -> usize {
        let mut parked = self.lock();
        let keys = parked.remove(&slot).unwrap_or_default();
        let count = keys.len();
        for key in keys {
            queue.add(key);
        }
        count
    }

    /// Takes out the keys of every slot `keep` refuses: slots that went to another replica
    /// before this one got to them.
    fn drop_slots(&self, keep: impl Fn(u16) -> bool) -> Vec<ObjectKey> {
        let mut dropped = Vec::new();
        self.lock().retain(|&slot, keys| {
            let kept = keep(slot);
            if !kept {
                dropped.extend(keys.drain());
            }
            kept
        });
        dropped
    }
}

/// Keeps a sharded controller's informers on the ring's shard, and queues again what a
/// slot refused once the ring grants it again:
/// - a slot **taken** has every cached primary of its queued: their events came while
///   another replica held it and was letting it go (those not cached yet arrive with the
///   relist, as adds);
/// - a slot **resumed** (a renewal ended a lapse in which it refused reconciles) has the
///   keys it refused queued, which the workers [parked](Parked);
/// - a slot taken also has the keys it refused while it was dealt here and not yet taken
///   queued: deletions among them, which no list shows, are reconciled as deletions.
///
/// Keys parked for a slot that is no longer dealt, held or warming here are another
/// replica's: they are dropped, with the last state kept for a deletion.
///
/// Grants are counted per slot, so none is missed however the ring's changes bunch up
/// before this task runs.
pub(super) async fn follow_ring<K>(
    ring: Arc<ShardRing>,
    followers: Vec<Follower>,
    primary: InformerHandle<K>,
    queue: RateLimitingQueue<ObjectKey>,
    parked: Parked,
    deleted: LastStates<K>,
) where
    K: Resource + Send + Sync + 'static,
{
    let mut view = ring.view();
    let mut grants = ring.grants();
    // Counted from none: at first, every slot granted before this task ran.
    let mut granted = Grants::none(view.borrow().slots);
    loop {
        let current = view.borrow_and_update().clone();
        for follower in &followers {
            follower.follow(&current);
        }
        // Keys refused on a slot before it was lost without a handover go back to the
        // workers, which forward the deletions among them.
        for &slot in &current.owed {
            parked.requeue(slot, &queue);
        }
        let elsewhere = parked.drop_slots(|slot| {
            current.held.contains(&slot)
                || current.assigned.contains(&slot)
                || current.warming.contains(&slot)
                || current.owed.contains(&slot)
        });
        for key in elsewhere {
            deleted.remove(&key);
        }
        let now = grants.borrow_and_update().clone();
        let Granted { taken, resumed } = now.since(&granted);
        granted = now;
        for &slot in taken.iter().chain(&resumed) {
            let keys = parked.requeue(slot, &queue);
            if keys > 0 {
                debug!(slot, keys, "slot resumed; the keys it refused queued");
            }
        }
        if !taken.is_empty() {
            requeue_slots(&primary, &queue, &taken, current.slots);
        }
        let changed = tokio::select! {
            changed = view.changed() => changed,
            changed = grants.changed() => changed,
        };
        if changed.is_err() {
            return;
        }
    }
}

/// Queues every cached primary whose UID falls in one of `slots`.
fn requeue_slots<K: Resource + Send + Sync + 'static>(
    primary: &InformerHandle<K>,
    queue: &RateLimitingQueue<ObjectKey>,
    slots: &BTreeSet<u16>,
    count: u16,
) {
    let mut queued = 0usize;
    for obj in primary.store().list() {
        let in_slots = obj
            .meta()
            .uid
            .as_deref()
            .is_some_and(|uid| slots.contains(&slot_of(uid, count)));
        if in_slots && let Some(key) = key_of(&*obj) {
            queue.add(key);
            queued += 1;
        }
    }
    debug!(?slots, queued, "slots taken; their cached primaries queued");
}

#[cfg(test)]
mod tests {
    //! A sharded controller over an in-memory list-watch, its ring's admission driven by
    //! hand: the windows in which a slot admits nothing are hit on purpose.

    use crate::lease::LeaseConfig;
    use std::{
        sync::{Arc, Mutex},
        time::Duration,
    };

    use k8s_openapi::api::core::v1::ConfigMap;
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;

    use crate::{
        controller::{Action, Controller, ControllerStats, ReconcileRequest, retry_with_backoff},
        informer::{InformerHandle, RunningInformer, SharedInformer},
        list_watch::{HashRange, Shard, ShardField, fnv1a_64},
        sharding::{RingConfig, ShardRing},
        stats::LiveStats,
        testing::FakeListWatch,
    };

    const RENEW_DEADLINE: Duration = Duration::from_secs(10);

    /// A ring never run (its client points nowhere): the test grants and revokes its
    /// slots itself.
    fn ring() -> Arc<ShardRing> {
        let config = kube_client::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube_client::Client::try_from(config).unwrap();
        let config = RingConfig::new(
            LeaseConfig::new("ring")
                .in_namespace("ns")
                .with_identity("me")
                .renew_deadline(RENEW_DEADLINE),
        )
        .slots(1);
        Arc::new(ShardRing::new(client, config).unwrap())
    }

    fn config_map(name: &str, round: u32) -> ConfigMap {
        let mut cm = FakeListWatch::<ConfigMap>::object(Some("ns"), name);
        cm.metadata.uid = Some(format!("uid-{name}"));
        cm.metadata.labels = Some([("round".to_owned(), round.to_string())].into());
        cm
    }

    type Seen = Arc<Mutex<Vec<(String, u32)>>>;

    /// Waits (on the paused clock) until `name` has been reconciled at `round`.
    async fn reconciled(seen: &Seen, name: &str, round: u32) -> bool {
        let wanted = (format!("ns/{name}"), round);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if seen.lock().unwrap().contains(&wanted) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// Waits (on the paused clock) until `count` of `stats` has gone past `before`.
    async fn refused(
        stats: &LiveStats<ControllerStats>,
        count: fn(ControllerStats) -> u64,
        before: u64,
    ) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while count(stats.read()) == before {
            assert!(Instant::now() < deadline, "the change was never refused");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    struct Running {
        _informer: RunningInformer<ConfigMap>,
        primary: InformerHandle<ConfigMap>,
        fake: FakeListWatch<ConfigMap>,
        ring: Arc<ShardRing>,
        seen: Seen,
        stats: LiveStats<ControllerStats>,
        cancel: CancellationToken,
    }

    async fn start() -> Running {
        let fake = FakeListWatch::<ConfigMap>::new("configmaps");
        fake.add(config_map("a", 1));
        fake.add(config_map("b", 1));
        let ring = ring();
        ring.admission().hold(0, Instant::now());
        ring.deal_for_test([0].into());
        let informer = SharedInformer::builder(fake.clone())
            .shard(Shard::everything(ShardField::Uid))
            .build();
        let primary = informer.handle();
        let controller = Controller::new("sharded", primary.clone())
            .sharded_on(ring.clone())
            .workers(1);
        let stats = controller.stats();
        let cancel = CancellationToken::new();
        let informer = informer.spawn(cancel.clone());
        let seen: Seen = Arc::default();
        let record = seen.clone();
        let reconcile = move |request: ReconcileRequest<ConfigMap>, _: Arc<()>| {
            let record = record.clone();
            async move {
                match request {
                    ReconcileRequest::Present(cm) => {
                        let labels = cm.metadata.labels.clone().unwrap_or_default();
                        let round = labels.get("round").and_then(|r| r.parse().ok()).unwrap();
                        let key = format!("ns/{}", cm.metadata.name.as_deref().unwrap());
                        record.lock().unwrap().push((key, round));
                    }
                    // A deletion is recorded as round 0.
                    ReconcileRequest::Deleted { key, .. } => {
                        record.lock().unwrap().push((key.to_string(), 0));
                    }
                }
                Ok::<_, std::io::Error>(Action::done())
            }
        };
        tokio::spawn(controller.run(
            (reconcile, retry_with_backoff(), Arc::new(())),
            cancel.clone(),
        ));
        assert!(reconciled(&seen, "a", 1).await && reconciled(&seen, "b", 1).await);
        fake.wait_for_calls(|c| c.watches >= 1).await;
        Running {
            _informer: informer,
            primary,
            fake,
            ring,
            seen,
            stats,
            cancel,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_refused_while_the_slot_s_renewals_lapsed_is_reconciled_once_renewed() {
        let run = start().await;
        // The renewals lapse: the slot is still held (the ring publishes no change), and
        // admits nothing.
        tokio::time::advance(RENEW_DEADLINE).await;
        assert!(run.ring.admitting().is_empty());
        let before = run.stats.read().held_back;
        run.fake.update(config_map("a", 2));
        refused(&run.stats, |stats| stats.held_back, before).await;
        // The renewal that ends the lapse: the change is reconciled after all.
        run.ring.admission().hold(0, Instant::now());
        assert!(
            reconciled(&run.seen, "a", 2).await,
            "the change refused during the lapse was never reconciled: {:?}",
            run.seen.lock().unwrap()
        );
        // Only what was held back: the unchanged object is not reconciled again.
        let b = run
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(key, _)| key == "ns/b")
            .count();
        assert_eq!(b, 1);
        run.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_refused_while_the_slot_was_away_is_reconciled_when_it_comes_back() {
        let run = start().await;
        // Let go and taken back between two looks of the ring's follower: its view of the
        // held slots is the same before and after.
        run.ring.admission().release(0);
        run.ring.deal_for_test([].into());
        let before = run.stats.read().elsewhere;
        run.fake.update(config_map("a", 2));
        refused(&run.stats, |stats| stats.elsewhere, before).await;
        run.ring.admission().hold(0, Instant::now());
        run.ring.deal_for_test([0].into());
        assert!(
            reconciled(&run.seen, "a", 2).await,
            "the change refused while the slot was away was never reconciled: {:?}",
            run.seen.lock().unwrap()
        );
        run.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_deletion_seen_before_a_dealt_slot_is_taken_is_reconciled_once_it_is() {
        let run = start().await;
        // The slot is dealt here and its old owner is still handing it over: not held yet.
        run.ring.admission().release(0);
        run.ring.deal_for_test([0].into());
        let refusals = |stats: ControllerStats| stats.held_back + stats.elsewhere;
        let before = refusals(run.stats.read());
        run.fake.delete(Some("ns"), "a");
        refused(&run.stats, refusals, before).await;
        // Taken: no list can show a deletion, so it is reconciled from what was held back.
        run.ring.admission().hold(0, Instant::now());
        run.ring.deal_for_test([0].into());
        assert!(
            reconciled(&run.seen, "a", 0).await,
            "a deletion refused before the slot was taken was never reconciled: {:?}",
            run.seen.lock().unwrap()
        );
        run.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_deletion_during_the_object_s_reconcile_is_reconciled_with_its_last_state() {
        let fake = FakeListWatch::<ConfigMap>::new("configmaps");
        fake.add(config_map("a", 1));
        let ring = ring();
        ring.admission().hold(0, Instant::now());
        ring.deal_for_test([0].into());
        let informer = SharedInformer::builder(fake.clone())
            .shard(Shard::everything(ShardField::Uid))
            .build();
        let primary = informer.handle();
        let controller = Controller::new("sharded", primary.clone())
            .sharded_on(ring.clone())
            .workers(1);
        let cancel = CancellationToken::new();
        let _informer = informer.spawn(cancel.clone());
        let (entered, release) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Notify::new()),
        );
        let deletions: Arc<Mutex<Vec<bool>>> = Arc::default();
        let reconcile = {
            let (entered, release, deletions) =
                (entered.clone(), release.clone(), deletions.clone());
            move |request: ReconcileRequest<ConfigMap>, _: Arc<()>| {
                let (entered, release, deletions) =
                    (entered.clone(), release.clone(), deletions.clone());
                async move {
                    match request {
                        ReconcileRequest::Present(_) => {
                            entered.notify_one();
                            release.notified().await;
                        }
                        ReconcileRequest::Deleted {
                            last_known, uid, ..
                        } => {
                            let told = last_known.is_some() && uid.as_deref() == Some("uid-a");
                            deletions.lock().unwrap().push(told);
                        }
                    }
                    Ok::<_, std::io::Error>(Action::done())
                }
            }
        };
        tokio::spawn(controller.run(
            (reconcile, retry_with_backoff(), Arc::new(())),
            cancel.clone(),
        ));
        // Deleted while its reconcile runs: the key comes back once it is done.
        entered.notified().await;
        fake.delete(Some("ns"), "a");
        // The controller's handler has taken the add and the deletion.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !primary
            .handler_stats()
            .iter()
            .any(|h| h.name == "sharded" && h.delivered >= 2 && h.waiting == 0)
        {
            assert!(
                Instant::now() < deadline,
                "the deletion never reached the handler"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        release.notify_one();
        let deadline = Instant::now() + Duration::from_secs(60);
        while deletions.lock().unwrap().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            *deletions.lock().unwrap(),
            [true],
            "the deletion was lost, or reconciled without the object's last state and UID"
        );
        cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_object_that_left_the_shard_is_not_reconciled_as_deleted() {
        let run = start().await;
        // A shard of b's UID alone: the relist leaves a out, as a tombstone.
        let b = fnv1a_64(b"uid-b");
        let only_b = HashRange::new(b, u128::from(b) + 1).unwrap();
        let shard = Shard::new(ShardField::Uid, [only_b]).unwrap();
        run.primary.reshard(shard).unwrap();
        while run.primary.store().len() != 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // b's change comes after the tombstone, and one worker takes keys in order.
        run.fake.update(config_map("b", 2));
        assert!(reconciled(&run.seen, "b", 2).await);
        assert!(
            !run.seen.lock().unwrap().contains(&("ns/a".to_owned(), 0)),
            "an object that left the shard was reconciled as deleted"
        );
        run.cancel.cancel();
    }
}
