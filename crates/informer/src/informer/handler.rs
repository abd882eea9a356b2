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

/// Receives an informer's events (client-go's `ResourceEventHandler`). All methods default to
/// doing nothing.
///
/// Implement it or build one from closures with [`handler_fn`]. To feed a workqueue (every
/// event puts the object's key on it) use
/// [`InformerHandle::add_key_handler`](crate::InformerHandle::add_key_handler).
///
/// Each registered handler gets its own FIFO buffer and its own tokio task: the informer
/// only appends to the buffers, so a slow handler delays neither the reflector nor the other
/// handlers (it only grows its own buffer). Past [`HANDLER_COALESCE_AFTER`] waiting events a
/// buffer coalesces per object, so a handler far behind gets each object's newest state
/// rather than every step, and a stuck one cannot take the process's memory. Objects are
/// shared `Arc`s, never copied per handler. Handler methods are synchronous and run on the
/// tokio runtime: keep them quick (enqueue a key and return) and never block in them; do
/// slow work in workqueue workers (a handler that must wait does it in
/// `tokio::task::block_in_place`, or it holds up the tasks queued on its worker too). How
/// far behind each handler is shows in
/// [`HandlerRegistration::stats`](crate::informer::HandlerRegistration::stats). A panic in
/// a handler is caught and logged, and the handler goes on with the next event.
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
/// [`HANDLER_COALESCE_AFTER`]: crate::informer::HANDLER_COALESCE_AFTER
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
}

/// What a registered handler needs of the objects of the initial list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum InitialAdds {
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
}

/// Starts a closure-based handler.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{handler_fn, informer::HandlerFn};
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
}

impl<K: Send + Sync + 'static> EventHandler<K> for HandlerFn<K> {
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

/// A handler that calls `f` with the object's key on every add, update (resyncs included)
/// and delete, and that takes a warm restart's objects by key, undecoded; see
/// [`InformerHandle::add_key_handler`](crate::InformerHandle::add_key_handler).
pub(crate) struct Keys<F>(pub(crate) Arc<F>);

impl<K, F> EventHandler<K> for Keys<F>
where
    K: Resource + Send + Sync + 'static,
    F: Fn(ObjectKey) + Send + Sync + 'static,
{
    fn on_add(&self, obj: &Arc<K>, _delivery: Delivery) {
        if let Ok(key) = ObjectKey::from_object(&**obj) {
            (self.0)(key);
        }
    }

    fn on_update(&self, _old: &Arc<K>, new: &Arc<K>, _delivery: Delivery) {
        if let Ok(key) = ObjectKey::from_object(&**new) {
            (self.0)(key);
        }
    }

    fn on_delete(&self, obj: &DeletedObject<K>) {
        (self.0)(obj.key());
    }
}

/// A handler as the informer runs it: the user's [`EventHandler`] and, for the library's
/// own handlers that queue keys, what takes a warm restart's objects by key, undecoded.
pub(crate) struct Registered<K> {
    events: Box<dyn EventHandler<K>>,
    initial_key: Option<InitialKeyFn>,
}

impl<K: 'static> Registered<K> {
    /// A handler that needs every object decoded.
    pub(crate) fn objects(handler: impl EventHandler<K>) -> Self {
        Self {
            events: Box::new(handler),
            initial_key: None,
        }
    }

    /// A handler that takes the initial list's undecoded objects by key, through
    /// `initial_key`, and every other event through `handler`.
    pub(crate) fn keys(
        handler: impl EventHandler<K>,
        initial_key: impl Fn(&ObjectKey) + Send + Sync + 'static,
    ) -> Self {
        Self {
            events: Box::new(handler),
            initial_key: Some(Box::new(initial_key)),
        }
    }

    pub(crate) fn initial_adds(&self) -> InitialAdds {
        match self.initial_key {
            Some(_) => InitialAdds::Keys,
            None => InitialAdds::Objects,
        }
    }

    pub(crate) fn handler(&self) -> &dyn EventHandler<K> {
        &*self.events
    }

    pub(crate) fn on_initial_key(&self, key: &ObjectKey) {
        if let Some(f) = &self.initial_key {
            f(key);
        }
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
