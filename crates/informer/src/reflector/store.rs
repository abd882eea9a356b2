//! Where a reflector writes. The trait is what lets the same loop fill a store directly or
//! feed an informer's processor, which also tells handlers; a relist is handed over object
//! by object and closed by one call, so the store decides how to make it one write.

use std::sync::Arc;

use kube_core::Resource;

use super::{
    restore::{list_restored, store_encoded},
    snapshot::RestoredObject,
};
use crate::{
    key::ObjectKey,
    list_watch::RawObject,
    store::{Arrival, Writer},
};

/// Where a [`Reflector`](super::Reflector) writes (client-go's reflector store:
/// `Add`/`Update`, `Delete`, `Replace`). Implemented by a store's writer and by the shared
/// informer's event processor.
///
/// A full list arrives as [`start_list`](Self::start_list), one
/// [`list_object`](Self::list_object) per listed object as the objects are decoded, and
/// [`finish_list`](Self::finish_list); a list that fails part-way is followed by another
/// `start_list`. Watch events arrive as [`upsert`](Self::upsert),
/// [`delete`](Self::delete) and [`bookmark`](Self::bookmark). Objects whose
/// resourceVersion did not change should produce no event.
pub trait ReflectorStore<K>: Send + Sync + 'static {
    /// A full list begins; one in progress, if any, was abandoned.
    fn start_list(&self);
    /// An object of the full list in progress, with the bytes it arrived in when the
    /// source kept them (a compact store keeps those instead of encoding the object).
    fn list_object(&self, key: ObjectKey, object: Arc<K>, raw: Option<RawObject>);
    /// An object of the full list in progress that did not decode: it exists, and keeps
    /// its last good state.
    fn list_undecodable(&self, key: ObjectKey);
    /// An object was added or modified; `raw` as for [`list_object`](Self::list_object).
    fn upsert(&self, key: ObjectKey, object: Arc<K>, raw: Option<RawObject>);
    /// An object was deleted; `object` is its last state.
    fn delete(&self, key: ObjectKey, object: Arc<K>);
    /// The watch reached `resource_version` with no change since the last event (a
    /// bookmark): the store is now the server's state at that version.
    fn bookmark(&self, resource_version: &str) {
        let _ = resource_version;
    }
    /// The full list in progress is complete, at `resource_version`: every object it did
    /// not list is gone.
    fn finish_list(&self, resource_version: &str);
    /// Whether this store takes a [warm restart](super::snapshot::WarmRestart)'s objects as
    /// they are kept ([`restore_objects`](Self::restore_objects) with objects not decoded
    /// yet). When it does not (the default), the restore decodes every object first, on
    /// every core.
    fn restores_encoded(&self) -> bool {
        false
    }
    /// Objects of a [warm restart](super::snapshot::WarmRestart)'s snapshot, a part of it
    /// at a time, stored as objects of the full list in progress. The default decodes each
    /// (if it is not already) and hands it to [`list_object`](Self::list_object); one that
    /// does not decode is left out, with an error log, and the resumed watch or a relist
    /// brings it back.
    fn restore_objects(&self, objects: Vec<RestoredObject<K>>) {
        for object in objects {
            list_restored(self, object);
        }
    }
    /// The full list in progress held a [warm restart](super::snapshot::WarmRestart)'s
    /// snapshot, the server's state at `resource_version`: complete as a list, but the
    /// store counts as synced only once [`caught_up`](Self::caught_up). The default
    /// completes it as a list.
    fn finish_restore(&self, resource_version: &str) {
        self.finish_list(resource_version);
    }
    /// The watch resumed after a [`finish_restore`](Self::finish_restore) has caught up with the server
    /// at `resource_version` (its first bookmark): the store is synced. The default treats
    /// it as a bookmark.
    fn caught_up(&self, resource_version: &str) {
        self.bookmark(resource_version);
    }
}

/// A store written directly: the first list fills it as it arrives, later ones are swapped
/// in whole (see [`Writer`]).
impl<K: Resource + Send + Sync + 'static> ReflectorStore<K> for Writer<K> {
    fn start_list(&self) {
        Writer::start_list(self);
    }

    fn list_object(&self, key: ObjectKey, object: Arc<K>, raw: Option<RawObject>) {
        Writer::list_object(self, key, object, raw);
    }

    fn list_undecodable(&self, key: ObjectKey) {
        Writer::list_undecodable(self, key);
    }

    fn upsert(&self, key: ObjectKey, object: Arc<K>, raw: Option<RawObject>) {
        self.insert_keyed(key, object, raw, Arrival::Watched);
    }

    fn delete(&self, key: ObjectKey, _object: Arc<K>) {
        self.remove(key);
    }

    fn finish_list(&self, _resource_version: &str) {
        Writer::finish_list(self);
    }

    fn restores_encoded(&self) -> bool {
        self.takes_encoded()
    }

    fn restore_objects(&self, objects: Vec<RestoredObject<K>>) {
        let (_, left) = store_encoded(objects, |encoded| self.list_encoded(encoded));
        for object in left {
            list_restored(self, object);
        }
    }
}
