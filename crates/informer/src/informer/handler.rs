//! Event handlers: what a [`SharedInformer`](crate::SharedInformer) tells its users.
//! The full documentation is on [`EventHandler`].

use std::{fmt, sync::Arc};

use kube_core::Resource;

use crate::key::ObjectKey;

/// How an event reached a handler: the initial list's replay, a change just observed, or a
/// periodic resync. A controller queues replays behind live changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// An add of the initial list (or, for a handler added later, of the objects already
    /// cached when it was added).
    InitialList,
    /// A change the informer just observed: a watch event, or what a later relist found
    /// different.
    Live,
    /// An update of a periodic resync: the cached object again, unchanged.
    Resync,
}

impl Delivery {
    /// Whether this replays what the cache already held (the initial list, a resync) rather
    /// than reporting a change.
    pub fn is_replay(self) -> bool {
        !matches!(self, Delivery::Live)
    }
}

/// The last state of a deleted object, as a handler receives it.
pub enum DeletedObject<K> {
    /// The watch delivered the deletion; this is the object's final state.
    Final(Arc<K>),
    /// A relist found the object gone: the deletion itself was missed, so its final state is
    /// unknown and this is the last state the cache knew (client-go's
    /// `DeletedFinalStateUnknown`).
    FinalStateUnknown(DeletedFinalStateUnknown<K>),
}

/// Tombstone of an object whose deletion was missed; see [`DeletedObject::FinalStateUnknown`].
pub struct DeletedFinalStateUnknown<K> {
    /// The object's key.
    pub key: ObjectKey,
    /// The last state the cache knew.
    pub last_known: Arc<K>,
}

impl<K> DeletedObject<K> {
    /// The object: its final state, or the last known one for a tombstone.
    pub fn object(&self) -> &Arc<K> {
        match self {
            DeletedObject::Final(o) => o,
            DeletedObject::FinalStateUnknown(t) => &t.last_known,
        }
    }

    /// True for a tombstone (the deletion was noticed by a relist).
    pub fn is_final_state_unknown(&self) -> bool {
        matches!(self, DeletedObject::FinalStateUnknown(_))
    }
}

impl<K: Resource> DeletedObject<K> {
    /// The deleted object's key.
    pub fn key(&self) -> ObjectKey {
        match self {
            DeletedObject::Final(o) => ObjectKey::from_object(&**o)
                .unwrap_or_else(|_| ObjectKey::from(o.meta().name.as_deref().unwrap_or(""))),
            DeletedObject::FinalStateUnknown(t) => t.key.clone(),
        }
    }
}

impl<K> Clone for DeletedObject<K> {
    fn clone(&self) -> Self {
        match self {
            DeletedObject::Final(o) => DeletedObject::Final(o.clone()),
            DeletedObject::FinalStateUnknown(t) => {
                DeletedObject::FinalStateUnknown(DeletedFinalStateUnknown {
                    key: t.key.clone(),
                    last_known: t.last_known.clone(),
                })
            }
        }
    }
}

impl<K> fmt::Debug for DeletedObject<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeletedObject::Final(_) => f.write_str("DeletedObject::Final(..)"),
            DeletedObject::FinalStateUnknown(t) => {
                write!(f, "DeletedObject::FinalStateUnknown({})", t.key)
            }
        }
    }
}

/// [`HANDLER_COALESCE_AFTER`]: crate::HANDLER_COALESCE_AFTER
/// Receives an informer's events (client-go's `ResourceEventHandler`). All methods default to
/// doing nothing.
///
/// ```
/// use std::sync::Arc;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{DeletedObject, Delivery, EventHandler};
///
/// struct Log;
/// impl EventHandler<ConfigMap> for Log {
///     fn on_add(&self, cm: &Arc<ConfigMap>, delivery: Delivery) {
///         println!("add {:?} ({delivery:?})", cm.metadata.name);
///     }
///     fn on_delete(&self, cm: &DeletedObject<ConfigMap>) {
///         println!("delete {:?}", cm.object().metadata.name);
///     }
/// }
/// ```
///
/// Event handlers: what a [`SharedInformer`](crate::SharedInformer) tells its users.
///
/// Implement [`EventHandler`] or build one from closures with [`handler_fn`]. For the usual
/// controller wiring (every event puts the object's key on a workqueue) use [`key_handler`].
///
/// Each registered handler gets its own FIFO buffer and its own tokio task: the informer
/// only appends to the buffers, so a slow handler delays neither the reflector nor the other
/// handlers (it only grows its own buffer). Past [`HANDLER_COALESCE_AFTER`] waiting events a
/// buffer coalesces per object, so a handler far behind gets each object's newest state
/// rather than every step, and a stuck one cannot take the process's memory. Objects are shared `Arc`s, never copied
/// per handler. Handler methods are synchronous and run on the tokio runtime: keep them quick
/// (enqueue a key and return) and never block in them; do slow work in workqueue workers (a
/// handler that must wait does it in `tokio::task::block_in_place`, or it holds up the tasks
/// queued on its worker too). How far behind each handler is shows in
/// [`HandlerRegistration::stats`](crate::HandlerRegistration::stats). A panic in a handler is
/// caught and logged, and the handler goes on with the next event.
///
/// [`HANDLER_COALESCE_AFTER`]: crate::HANDLER_COALESCE_AFTER
pub trait EventHandler<K>: Send + Sync + 'static {
    /// An object appeared: [`Delivery::InitialList`] for the objects of the initial list
    /// (or, for a handler added late, the objects already cached when it was added),
    /// [`Delivery::Live`] for one created since.
    fn on_add(&self, obj: &Arc<K>, delivery: Delivery) {
        let _ = (obj, delivery);
    }

    /// An object changed from `old` to `new` ([`Delivery::Live`]), or a periodic resync
    /// replays it ([`Delivery::Resync`]: `old` and `new` are the same object).
    fn on_update(&self, old: &Arc<K>, new: &Arc<K>, delivery: Delivery) {
        let _ = (old, new, delivery);
    }

    /// An object was deleted.
    fn on_delete(&self, obj: &DeletedObject<K>) {
        let _ = obj;
    }

    /// What this handler needs of the objects of the initial list:
    /// [`InitialAdds::Objects`] (the default), each through [`on_add`](Self::on_add), or
    /// [`InitialAdds::Keys`], which lets an informer that holds them undecoded (restored
    /// from a [warm restart](crate::reflector::WarmRestart)'s snapshot) hand over only their
    /// keys, through [`on_initial_key`](Self::on_initial_key), and decode none.
    fn initial_adds(&self) -> InitialAdds {
        InitialAdds::Objects
    }

    /// An object of the initial list, by key, for a handler whose
    /// [`initial_adds`](Self::initial_adds) are [`InitialAdds::Keys`], when the informer
    /// holds the object undecoded: read it from the store if it is needed. Objects the
    /// informer has decoded still come through [`on_add`](Self::on_add).
    fn on_initial_key(&self, key: &ObjectKey) {
        let _ = key;
    }
}

/// What a handler needs of the objects of the initial list (see
/// [`EventHandler::initial_adds`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InitialAdds {
    /// Each object, decoded.
    #[default]
    Objects,
    /// The key is enough where the object is not decoded yet.
    Keys,
}

type AddFn<K> = Box<dyn Fn(&Arc<K>, Delivery) + Send + Sync>;
type UpdateFn<K> = Box<dyn Fn(&Arc<K>, &Arc<K>, Delivery) + Send + Sync>;
type DeleteFn<K> = Box<dyn Fn(&DeletedObject<K>) + Send + Sync>;
type InitialKeyFn = Box<dyn Fn(&ObjectKey) + Send + Sync>;

/// An [`EventHandler`] made of closures; see [`handler_fn`].
pub struct HandlerFn<K> {
    add: Option<AddFn<K>>,
    update: Option<UpdateFn<K>>,
    delete: Option<DeleteFn<K>>,
    initial_key: Option<InitialKeyFn>,
}

/// Starts a closure-based handler.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{handler_fn, HandlerFn};
///
/// let handler: HandlerFn<ConfigMap> = handler_fn::<ConfigMap>()
///     .on_add(|cm, _delivery| println!("add {:?}", cm.metadata.name))
///     .on_update(|old, new, _delivery| println!("{:?} -> {:?}", old.metadata.resource_version, new.metadata.resource_version))
///     .on_delete(|gone| println!("delete {:?}", gone.object().metadata.name));
/// ```
pub fn handler_fn<K>() -> HandlerFn<K> {
    HandlerFn {
        add: None,
        update: None,
        delete: None,
        initial_key: None,
    }
}

impl<K> HandlerFn<K> {
    /// Sets the add callback: `f(object, delivery)`.
    #[must_use]
    pub fn on_add(mut self, f: impl Fn(&Arc<K>, Delivery) + Send + Sync + 'static) -> Self {
        self.add = Some(Box::new(f));
        self
    }

    /// Sets the update callback: `f(old, new, delivery)`.
    #[must_use]
    pub fn on_update(
        mut self,
        f: impl Fn(&Arc<K>, &Arc<K>, Delivery) + Send + Sync + 'static,
    ) -> Self {
        self.update = Some(Box::new(f));
        self
    }

    /// Sets the delete callback.
    #[must_use]
    pub fn on_delete(mut self, f: impl Fn(&DeletedObject<K>) + Send + Sync + 'static) -> Self {
        self.delete = Some(Box::new(f));
        self
    }

    /// Takes the initial list's objects by key where the informer holds them undecoded
    /// (see [`EventHandler::on_initial_key`]): `f(key)` instead of the add callback.
    #[must_use]
    pub fn on_initial_key(mut self, f: impl Fn(&ObjectKey) + Send + Sync + 'static) -> Self {
        self.initial_key = Some(Box::new(f));
        self
    }
}

impl<K: Send + Sync + 'static> EventHandler<K> for HandlerFn<K> {
    fn initial_adds(&self) -> InitialAdds {
        match self.initial_key {
            Some(_) => InitialAdds::Keys,
            None => InitialAdds::Objects,
        }
    }

    fn on_initial_key(&self, key: &ObjectKey) {
        if let Some(f) = &self.initial_key {
            f(key);
        }
    }

    fn on_add(&self, obj: &Arc<K>, delivery: Delivery) {
        if let Some(f) = &self.add {
            f(obj, delivery);
        }
    }

    fn on_update(&self, old: &Arc<K>, new: &Arc<K>, delivery: Delivery) {
        if let Some(f) = &self.update {
            f(old, new, delivery);
        }
    }

    fn on_delete(&self, obj: &DeletedObject<K>) {
        if let Some(f) = &self.delete {
            f(obj);
        }
    }
}

/// A handler that calls `f` with the object's key on every add, update (resyncs included) and
/// delete: the usual way to feed a controller's workqueue, whose workers then read the
/// object back with [`Store::get_by_key`](crate::Store::get_by_key) (absent = deleted).
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{ObjectKey, key_handler};
///
/// let queue: Arc<Mutex<Vec<ObjectKey>>> = Arc::default();
/// let q = queue.clone();
/// let handler = key_handler::<ConfigMap, _>(move |key| q.lock().unwrap().push(key));
/// ```
pub fn key_handler<K, F>(f: F) -> KeyHandler<K, F>
where
    K: Resource + Send + Sync + 'static,
    F: Fn(ObjectKey) + Send + Sync + 'static,
{
    KeyHandler {
        f,
        _kind: std::marker::PhantomData,
    }
}

/// See [`key_handler`].
pub struct KeyHandler<K, F> {
    f: F,
    _kind: std::marker::PhantomData<fn(&K)>,
}

impl<K, F> EventHandler<K> for KeyHandler<K, F>
where
    K: Resource + Send + Sync + 'static,
    F: Fn(ObjectKey) + Send + Sync + 'static,
{
    fn on_add(&self, obj: &Arc<K>, _delivery: Delivery) {
        if let Ok(key) = ObjectKey::from_object(&**obj) {
            (self.f)(key);
        }
    }

    fn on_update(&self, _old: &Arc<K>, new: &Arc<K>, _delivery: Delivery) {
        if let Ok(key) = ObjectKey::from_object(&**new) {
            (self.f)(key);
        }
    }

    fn on_delete(&self, obj: &DeletedObject<K>) {
        (self.f)(obj.key());
    }

    fn initial_adds(&self) -> InitialAdds {
        InitialAdds::Keys
    }

    fn on_initial_key(&self, key: &ObjectKey) {
        (self.f)(key.clone());
    }
}

/// What travels through a handler's buffer.
pub(super) enum Notification<K> {
    Add {
        obj: Arc<K>,
        delivery: Delivery,
    },
    /// An object of the initial list held undecoded, for a handler that takes keys.
    AddKey(ObjectKey),
    Update {
        old: Arc<K>,
        new: Arc<K>,
        delivery: Delivery,
    },
    Delete(DeletedObject<K>),
    /// Every initial add before this has been delivered: the handler has synced.
    Synced,
}

impl<K> Clone for Notification<K> {
    fn clone(&self) -> Self {
        match self {
            Notification::Add { obj, delivery } => Notification::Add {
                obj: obj.clone(),
                delivery: *delivery,
            },
            Notification::Update { old, new, delivery } => Notification::Update {
                old: old.clone(),
                new: new.clone(),
                delivery: *delivery,
            },
            Notification::Delete(d) => Notification::Delete(d.clone()),
            Notification::AddKey(key) => Notification::AddKey(key.clone()),
            Notification::Synced => Notification::Synced,
        }
    }
}
