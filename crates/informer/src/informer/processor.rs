//! The informer's event processor: applies the reflector's writes to the store and fans
//! the resulting notifications out to every handler's buffer, under one lock.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use kube_core::Resource;
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};
use tracing::debug;

use super::handler::{
    DeletedFinalStateUnknown, DeletedObject, Delivery, InitialAdds, Notification,
};
use super::latency::Latency;
use super::listener::{HandlerStats, Inbox, Lag, Outbox, buffer};
use crate::{
    error::Error,
    key::ObjectKey,
    list_watch::RawObject,
    reflector::{ReflectorEvent, ReflectorStore, RestoredObject, store_encoded},
    store::{Arrival, IndexFn, KeptObjects, StoreChange, Writer},
};

/// Applies the reflector's writes to the store and fans notifications out to handlers.
pub(super) struct Processor<K> {
    pub(super) store: Writer<K>,
    dist: Mutex<Distributor<K>>,
    synced: watch::Sender<bool>,
    /// The latest list/watch error that retrying cannot fix, until a list completes.
    permanent_error: PermanentError,
    next_id: AtomicU64,
    /// Wakes the resync timer: a listener with a resync period was added.
    pub(super) resync_changed: Notify,
    /// How long each watch event took to apply and hand out.
    pub(super) processing: Latency,
}

/// Where the latest permanent list/watch error is published (see [`Error::permanent_copy`]).
pub(super) type PermanentError = Arc<watch::Sender<Option<Arc<Error>>>>;

struct Distributor<K> {
    listeners: Vec<Listener<K>>,
    synced: bool,
    applied: Applied,
}

/// What the store holds, for a divergence check: a state the server had at one version,
/// or a mix while a full list is being applied.
enum Applied {
    /// A full list is being applied (or none has been yet).
    Listing,
    /// Exactly the server's state at this resourceVersion: the last list's, or the last
    /// event's since.
    Version(String),
}

struct Listener<K> {
    id: u64,
    tx: Outbox<K>,
    /// What its handler needs of the initial list's objects.
    initial_adds: InitialAdds,
    initial_done: bool,
    resync: Option<Resync>,
}

/// A listener's resync period, and when its next resync is due.
struct Resync {
    period: Duration,
    next: Instant,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K: Resource> Processor<K> {
    fn broadcast(dist: &mut Distributor<K>, notes: &[Notification<K>]) {
        if notes.is_empty() {
            return;
        }
        for listener in &dist.listeners {
            for note in notes {
                // A closed channel means the handler task ended (stopped or removed).
                let _ = listener.tx.send(note.clone());
            }
        }
    }
}

impl<K> Processor<K> {
    pub(super) fn remove_listener(&self, id: u64) {
        lock(&self.dist).listeners.retain(|l| l.id != id);
    }
}

impl<K: Resource + Send + Sync + 'static> Processor<K> {
    /// Sends `note`, about the object of `key` in a list, to every listener; an initial add
    /// goes by key alone to a handler that takes the initial list's objects by key. Such a
    /// handler (a controller's, queueing keys) needs no more, and its buffer then holds
    /// keys while it catches up rather than every object decoded: during a streaming list
    /// a compact store's objects were otherwise alive decoded, a buffer's worth per
    /// handler, however compactly the store keeps them.
    fn broadcast_listed(dist: &Distributor<K>, key: &ObjectKey, note: &Notification<K>) {
        let initial_add = matches!(
            note,
            Notification::Add {
                delivery: Delivery::InitialList,
                ..
            }
        );
        for listener in &dist.listeners {
            let note = match listener.initial_adds {
                InitialAdds::Keys if initial_add => Notification::AddKey(key.clone()),
                _ => note.clone(),
            };
            // A closed channel means the handler task ended (stopped or removed).
            let _ = listener.tx.send(note);
        }
    }

    /// Sends every cached object, as an update, to each listener whose resync is due at
    /// `now` (not before the first sync), and schedules its next one. Returns when the
    /// next resync of any listener is due; `None` if no listener has a period.
    pub(super) fn resync_due(&self, now: Instant) -> Option<Instant> {
        let mut dist = lock(&self.dist);
        let synced = dist.synced;
        let mut due = Vec::new();
        let mut next_due = None;
        for listener in &mut dist.listeners {
            let Some(resync) = &mut listener.resync else {
                continue;
            };
            if resync.next <= now {
                if synced {
                    due.push(listener.tx.clone());
                    debug!(listener = listener.id, "resync");
                }
                resync.next = now + resync.period;
            }
            next_due = Some(next_due.map_or(resync.next, |due: Instant| due.min(resync.next)));
        }
        // The store walked once for every listener due, one object decoded at a time.
        if !due.is_empty() {
            for object in self.store.iter() {
                for tx in &due {
                    // A closed channel means the handler task ended (stopped or removed).
                    let _ = tx.send(Notification::Update {
                        old: object.clone(),
                        new: object.clone(),
                        delivery: Delivery::Resync,
                    });
                }
            }
        }
        next_due
    }
}

/// The processor as the reflector's store.
pub(super) struct Sink<K>(pub(super) Arc<Processor<K>>);

impl<K: Resource + Send + Sync + 'static> Sink<K> {
    /// A full list is in: handlers that have had their initial objects are synced.
    fn mark_synced(p: &Processor<K>, dist: &mut Distributor<K>) {
        for listener in dist.listeners.iter_mut().filter(|l| !l.initial_done) {
            let _ = listener.tx.send(Notification::Synced);
            listener.initial_done = true;
        }
        dist.synced = true;
        p.synced.send_replace(true);
    }
}

impl<K: Resource + Send + Sync + 'static> Sink<K> {
    /// The list being applied is complete: what it left out is deleted, and the handlers
    /// are told.
    fn finish_listed(p: &Processor<K>, dist: &mut Distributor<K>) {
        let notes: Vec<_> = p
            .store
            .finish_list()
            .into_iter()
            .map(|change| Self::notification(dist, change))
            .collect();
        Processor::broadcast(dist, &notes);
    }
}

impl<K> Sink<K> {
    /// The notification for a change of the store.
    fn notification(dist: &Distributor<K>, change: StoreChange<K>) -> Notification<K> {
        match change {
            StoreChange::Added(obj) => Notification::Add {
                obj,
                delivery: dist.add_delivery(),
            },
            StoreChange::Updated { old, new } => Notification::Update {
                old,
                new,
                delivery: Delivery::Live,
            },
            StoreChange::Deleted { key, last_known } => {
                Notification::Delete(DeletedObject::FinalStateUnknown(DeletedFinalStateUnknown {
                    key,
                    last_known,
                }))
            }
        }
    }
}

impl<K: Resource + Send + Sync + 'static> ReflectorStore<K> for Sink<K> {
    fn apply(&self, event: ReflectorEvent<K>) {
        match event {
            ReflectorEvent::ListStart => self.start_list(),
            ReflectorEvent::Listed { key, object, raw } => self.list_object(key, object, raw),
            ReflectorEvent::ListedUndecodable(key) => self.0.store.list_undecodable(key),
            ReflectorEvent::Restored(objects) => self.restore_objects(objects),
            ReflectorEvent::ListEnd(version) => self.finish_list(version),
            ReflectorEvent::RestoreEnd(version) => self.finish_restore(version),
            ReflectorEvent::CaughtUp(version) => self.caught_up(version),
            ReflectorEvent::Upsert { key, object, raw } => {
                let started = Instant::now();
                self.upsert(key, object, raw);
                self.0.processing.record(started.elapsed());
            }
            ReflectorEvent::Delete { key, object } => {
                let started = Instant::now();
                self.delete(key, object);
                self.0.processing.record(started.elapsed());
            }
            ReflectorEvent::Bookmark(version) => self.bookmark(version),
        }
    }

    fn restores_encoded(&self) -> bool {
        // A handler that needs objects gets each decoded, as an initial add.
        self.0.store.takes_encoded() && lock(&self.0.dist).takes_keys()
    }
}

/// Each event as the processor applies it: to the store, and to the handlers.
impl<K: Resource + Send + Sync + 'static> Sink<K> {
    fn start_list(&self) {
        let p = &*self.0;
        let mut dist = lock(&p.dist);
        dist.applied = Applied::Listing;
        p.store.start_list();
    }

    fn list_object(&self, key: ObjectKey, object: Arc<K>, raw: Option<RawObject>) {
        let p = &*self.0;
        let dist = lock(&p.dist);
        if let Some(change) = p.store.list_object(key.clone(), object, raw) {
            let note = Self::notification(&dist, change);
            Processor::broadcast_listed(&dist, &key, &note);
        }
    }

    fn upsert(&self, key: ObjectKey, object: Arc<K>, raw: Option<RawObject>) {
        let p = &*self.0;
        let mut dist = lock(&p.dist);
        dist.applied.advance(&*object);
        if let Some(change) = p.store.upsert(key, object, raw, Arrival::Watched) {
            let note = Self::notification(&dist, change);
            Processor::broadcast(&mut dist, &[note]);
        }
    }

    fn bookmark(&self, resource_version: String) {
        if let Applied::Version(version) = &mut lock(&self.0.dist).applied {
            *version = resource_version;
        }
    }

    fn restore_objects(&self, objects: Vec<RestoredObject<K>>) {
        let p = &*self.0;
        let dist = lock(&p.dist);
        // The store keeps the objects as they are kept whether or not they were decoded:
        // decoded, they were for the handlers, each told of its object as an initial add.
        // Undecoded ones are stored so only while every handler takes keys (one that needs
        // objects may have been added since the restore began).
        let decoded = objects.iter().all(|o| o.object.is_some());
        if !decoded && !dist.takes_keys() {
            drop(dist);
            for object in objects {
                self.apply(ReflectorEvent::listed(object));
            }
            return;
        }
        let (stored, left) = store_encoded(objects, |encoded| p.store.list_encoded(encoded));
        let delivery = dist.add_delivery();
        for listener in &dist.listeners {
            for (key, object) in &stored {
                let note = match object {
                    Some(obj) => Notification::Add {
                        obj: obj.clone(),
                        delivery,
                    },
                    None => Notification::AddKey(key.clone()),
                };
                // A closed channel means the handler task ended (stopped or removed).
                let _ = listener.tx.send(note);
            }
        }
        drop(dist);
        for object in left {
            self.apply(ReflectorEvent::listed(object));
        }
    }

    fn finish_restore(&self, resource_version: String) {
        let p = &*self.0;
        let mut dist = lock(&p.dist);
        Self::finish_listed(p, &mut dist);
        // The state at that version, but not synced: the resumed watch says when it has
        // caught up (`caught_up`).
        dist.applied = Applied::Version(resource_version);
    }

    fn caught_up(&self, resource_version: String) {
        let p = &*self.0;
        let mut dist = lock(&p.dist);
        dist.applied = Applied::Version(resource_version);
        Self::mark_synced(p, &mut dist);
        p.permanent_error
            .send_if_modified(|error| error.take().is_some());
    }

    fn finish_list(&self, resource_version: String) {
        let p = &*self.0;
        let mut dist = lock(&p.dist);
        dist.applied = Applied::Version(resource_version);
        Self::finish_listed(p, &mut dist);
        Self::mark_synced(p, &mut dist);
        // A complete list heals whatever permanent error came before it.
        p.permanent_error
            .send_if_modified(|error| error.take().is_some());
    }

    fn delete(&self, key: ObjectKey, object: Arc<K>) {
        let p = &*self.0;
        let mut dist = lock(&p.dist);
        dist.applied.advance(&*object);
        if p.store.remove(&key).is_some() {
            Processor::broadcast(
                &mut dist,
                &[Notification::Delete(DeletedObject::Final(object))],
            );
        } else {
            debug!(%key, "delete of an object not in the cache");
        }
    }
}

impl<K: Resource + Send + Sync + 'static> Processor<K> {
    /// A processor writing to `store`; `synced` turns true at the first complete list.
    pub(super) fn new(
        store: Writer<K>,
        synced: watch::Sender<bool>,
        permanent_error: PermanentError,
    ) -> Self {
        Self {
            store,
            dist: Mutex::new(Distributor {
                listeners: Vec::new(),
                synced: false,
                applied: Applied::Listing,
            }),
            synced,
            permanent_error,
            next_id: AtomicU64::new(0),
            resync_changed: Notify::new(),
            processing: Latency::default(),
        }
    }

    /// Registers a listener. It first receives every object already cached as an initial
    /// add (also while the first list is still arriving: the rest of it follows as adds),
    /// then, once the informer has synced, the sync mark. All under the distributor's lock,
    /// so no event slips between the replay and the live events.
    ///
    /// With a `resync` period, the listener is sent every cached object as an update that
    /// often (see [`resync_due`](Self::resync_due)).
    pub(super) fn add_listener(
        &self,
        name: Option<String>,
        resync: Option<Duration>,
        initial_adds: InitialAdds,
    ) -> (u64, Inbox<K>, Arc<Lag>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let lag = Lag::new(name.unwrap_or_else(|| format!("handler-{id}")));
        let (tx, inbox) = buffer(lag.clone());
        let mut dist = lock(&self.dist);
        let initial_done = dist.synced;
        for obj in self.store.iter() {
            let _ = tx.send(Notification::Add {
                obj,
                delivery: Delivery::InitialList,
            });
        }
        if initial_done {
            let _ = tx.send(Notification::Synced);
        }
        let resync = resync.map(|period| Resync {
            period,
            next: Instant::now() + period,
        });
        let wake = resync.is_some();
        dist.listeners.push(Listener {
            id,
            tx,
            initial_adds,
            initial_done,
            resync,
        });
        drop(dist);
        if wake {
            self.resync_changed.notify_one();
        }
        (id, inbox, lag)
    }

    /// Each registered handler's lag.
    pub(super) fn handler_stats(&self) -> Vec<HandlerStats> {
        lock(&self.dist)
            .listeners
            .iter()
            .map(|l| l.tx.stats())
            .collect()
    }

    /// Adds an index, with no write in between (it holds the distributor's lock).
    pub(super) fn add_indexer(&self, name: &str, func: IndexFn<K>) -> Result<(), Error> {
        let _dist = lock(&self.dist);
        self.store.add_indexer(name, func)
    }
}

impl<K> Distributor<K> {
    /// How an added object is delivered: objects of the first list are added before the
    /// first sync.
    fn add_delivery(&self) -> Delivery {
        match self.synced {
            true => Delivery::Live,
            false => Delivery::InitialList,
        }
    }

    /// Whether every handler takes the initial list's objects by key.
    fn takes_keys(&self) -> bool {
        self.listeners
            .iter()
            .all(|l| l.initial_adds == InitialAdds::Keys)
    }
}

impl Applied {
    /// An event's object was applied: the store is now the state at its version (while no
    /// list is being applied, whose objects come in no version order).
    fn advance<K: Resource>(&mut self, object: &K) {
        if let (Applied::Version(version), Some(rv)) = (&mut *self, &object.meta().resource_version)
        {
            version.clone_from(rv);
        }
    }
}

impl<K: Resource + Send + Sync + 'static> Processor<K> {
    /// Every cached object as the store keeps it, and the server's version they are the
    /// state of; `None` while a full list is being applied. One instant: no write comes in
    /// between.
    pub(super) fn kept(&self) -> Option<(String, KeptObjects<K>)> {
        let dist = lock(&self.dist);
        let Applied::Version(version) = &dist.applied else {
            return None;
        };
        Some((version.clone(), self.store.kept()))
    }

    /// The key and resourceVersion of every cached object, and the server's version they
    /// are the state of; `None` while a full list is being applied. One instant: no write
    /// comes in between.
    pub(super) fn versions(&self) -> Option<(String, HashMap<ObjectKey, String>)> {
        let dist = lock(&self.dist);
        let Applied::Version(version) = &dist.applied else {
            return None;
        };
        // From the slots: a compact cache need not decode every object for this.
        let objects = self.store.key_versions().into_iter().collect();
        Some((version.clone(), objects))
    }
}
