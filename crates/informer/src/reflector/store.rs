//! Where a reflector writes: each step of following the server is one
//! [`ReflectorEvent`], which lets the same loop fill a store directly or feed an
//! informer's processor (which also tells handlers), and lets a test read the loop as
//! data. A relist is handed over object by object and closed by one event, so the store
//! decides how to make it one write.

use std::sync::Arc;

use kube_core::Resource;

use tracing::error;

use super::{restore::store_encoded, snapshot::RestoredObject};
use crate::{
    key::ObjectKey,
    list_watch::RawObject,
    store::{Arrival, Writer},
};

/// One step of following the server, as a [`Reflector`](super::Reflector) hands it to
/// its [`ReflectorStore`] (kube-runtime's `watcher::Event`, with client-go's reflector
/// store semantics: `Add`/`Update`, `Delete`, `Replace`).
///
/// A full list arrives as [`ListStart`](Self::ListStart), one [`Listed`](Self::Listed) per
/// object as the objects are decoded, and [`ListEnd`](Self::ListEnd); a list that fails
/// part-way is followed by another `ListStart`. A [warm restart](super::WarmRestart) is a
/// list too: `ListStart`, [`Restored`](Self::Restored) parts of its snapshot,
/// [`RestoreEnd`](Self::RestoreEnd), and [`CaughtUp`](Self::CaughtUp) once the resumed
/// watch has caught up. Watch events arrive as [`Upsert`](Self::Upsert),
/// [`Delete`](Self::Delete) and [`Bookmark`](Self::Bookmark). Objects whose
/// resourceVersion did not change should produce no event.
#[derive(Debug)]
pub enum ReflectorEvent<K> {
    /// A full list begins; one in progress, if any, was abandoned.
    ListStart,
    /// An object of the full list in progress, with the bytes it arrived in when the
    /// source kept them (a compact store keeps those instead of encoding the object).
    Listed {
        /// The object's key.
        key: ObjectKey,
        /// The object.
        object: Arc<K>,
        /// The bytes it arrived in, if the source kept them.
        raw: Option<RawObject>,
    },
    /// An object of the full list in progress that did not decode: it exists, and keeps
    /// its last good state.
    ListedUndecodable(ObjectKey),
    /// Objects of a warm restart's snapshot, a part at a time, as objects of the full list
    /// in progress: decoded unless the store [restores them
    /// encoded](ReflectorStore::restores_encoded). A store that takes objects only hands
    /// each to itself as [`ReflectorEvent::listed`] makes it.
    Restored(Vec<RestoredObject<K>>),
    /// The full list in progress is complete at this resourceVersion: every object it did
    /// not list is gone, and the store is synced.
    ListEnd(String),
    /// The full list in progress held a warm restart's snapshot, the server's state at
    /// this resourceVersion: complete as a list, but synced only once
    /// [`CaughtUp`](Self::CaughtUp).
    RestoreEnd(String),
    /// The watch resumed after a [`RestoreEnd`](Self::RestoreEnd) has caught up with the
    /// server at this resourceVersion (its first bookmark): the store is synced.
    CaughtUp(String),
    /// An object was added or modified; `raw` as for [`Listed`](Self::Listed).
    Upsert {
        /// The object's key.
        key: ObjectKey,
        /// Its new state.
        object: Arc<K>,
        /// The bytes it arrived in, if the source kept them.
        raw: Option<RawObject>,
    },
    /// An object was deleted.
    Delete {
        /// The object's key.
        key: ObjectKey,
        /// Its last state.
        object: Arc<K>,
    },
    /// The watch reached this resourceVersion with no change since the last event (a
    /// bookmark): the store is now the server's state at that version.
    Bookmark(String),
}

impl<K> ReflectorEvent<K> {
    /// A restored object as an object of the full list: decoded (if it is not already) into
    /// [`Listed`](Self::Listed), or, when it does not decode, logged and
    /// [`ListedUndecodable`](Self::ListedUndecodable) (the resumed watch or a relist brings
    /// it back).
    pub fn listed(object: RestoredObject<K>) -> Self {
        let key = object.key().clone();
        match object.into_decoded() {
            Ok((key, object, raw)) => Self::Listed {
                key,
                object,
                raw: Some(raw),
            },
            Err(error) => {
                error!(%key, %error, "an object of the snapshot does not decode");
                Self::ListedUndecodable(key)
            }
        }
    }
}

/// Where a [`Reflector`](super::Reflector) writes: it applies each [`ReflectorEvent`].
/// Implemented by a store's writer and by the shared informer's event processor; a test
/// records the events as data.
pub trait ReflectorStore<K>: Send + Sync + 'static {
    /// Applies one step of following the server.
    fn apply(&self, event: ReflectorEvent<K>);

    /// Whether this store takes a warm restart's objects as they are kept
    /// ([`ReflectorEvent::Restored`] with objects not decoded yet). When it does not (the
    /// default), the restore decodes every object first, on every core.
    fn restores_encoded(&self) -> bool {
        false
    }
}

/// A store written directly: the first list fills it as it arrives, later ones are swapped
/// in whole (see [`Writer`]).
impl<K: Resource + Send + Sync + 'static> ReflectorStore<K> for Writer<K> {
    fn apply(&self, event: ReflectorEvent<K>) {
        match event {
            ReflectorEvent::ListStart => self.start_list(),
            ReflectorEvent::Listed { key, object, raw } => {
                self.list_object(key, object, raw);
            }
            ReflectorEvent::ListedUndecodable(key) => {
                self.list_undecodable(key);
            }
            ReflectorEvent::Restored(objects) => {
                let (_, left) = store_encoded(objects, |encoded| self.list_encoded(encoded));
                for object in left {
                    self.apply(ReflectorEvent::listed(object));
                }
            }
            ReflectorEvent::ListEnd(_) | ReflectorEvent::RestoreEnd(_) => {
                self.finish_list();
            }
            ReflectorEvent::Upsert { key, object, raw } => {
                self.insert_keyed(key, object, raw, Arrival::Watched);
            }
            ReflectorEvent::Delete { key, .. } => {
                self.remove(key);
            }
            ReflectorEvent::CaughtUp(_) | ReflectorEvent::Bookmark(_) => {}
        }
    }

    fn restores_encoded(&self) -> bool {
        self.takes_encoded()
    }
}
