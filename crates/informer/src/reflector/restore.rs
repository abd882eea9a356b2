//! A warm restart: the cache filled from the snapshot written before, and the watch resumed
//! from its resourceVersion, instead of a full list. The snapshot is read on blocking
//! threads a part at a time, so a restore never holds the whole of it, and a store that
//! keeps bytes takes its objects as they were kept, without decoding them.

use std::{collections::HashMap, sync::Arc, time::Duration};

use kube_core::Resource;
use tracing::{info, warn};

use super::{
    Reflector,
    snapshot::{RestoredObject, SnapshotError},
    store::{ReflectorEvent, ReflectorStore},
};
use crate::{
    key::ObjectKey,
    list_watch::ListWatch,
    store::{EncodedObject, Kept},
};

/// An object of a snapshot stored as it is kept: its key, and the object if it came decoded.
pub(crate) type StoredObject<K> = (ObjectKey, Option<Arc<K>>);

/// Hands `objects` to `store_encoded` (a store's `list_encoded`), which stores them as they
/// are kept where it can. Returns the key of each object it stored, with the object if it
/// came decoded (for handlers to be told of), and those it did not store, to be decoded
/// and stored as any other.
pub(crate) fn store_encoded<K>(
    objects: Vec<RestoredObject<K>>,
    store_encoded: impl FnOnce(Vec<EncodedObject>) -> Vec<EncodedObject>,
) -> (Vec<StoredObject<K>>, Vec<RestoredObject<K>>) {
    let Some(decode) = objects.first().map(|o| o.decode) else {
        return (Vec::new(), objects);
    };
    let mut keyed = Vec::with_capacity(objects.len());
    let encoded = objects
        .into_iter()
        .map(|o| {
            keyed.push((o.encoded.key.clone(), o.object));
            o.encoded
        })
        .collect();
    let left = store_encoded(encoded);
    if left.is_empty() {
        return (keyed, Vec::new());
    }
    // Some not stored (all, or those whose key the store held): each with its object.
    let mut left: HashMap<ObjectKey, EncodedObject> =
        left.into_iter().map(|e| (e.key.clone(), e)).collect();
    let mut stored = Vec::new();
    let mut not_stored = Vec::with_capacity(left.len());
    for (key, object) in keyed {
        match left.remove(&key) {
            Some(encoded) => not_stored.push(RestoredObject {
                encoded,
                object,
                decode,
            }),
            None => stored.push((key, object)),
        }
    }
    (stored, not_stored)
}

/// Reads a warm restart's snapshot (on a blocking thread), decoding its objects when told.
pub(crate) type Restore<K> = Box<
    dyn FnOnce(
            bool,
            &mut dyn FnMut(Vec<RestoredObject<K>>) -> bool,
        ) -> Result<String, SnapshotError>
        + Send
        + Sync,
>;

/// [`read_snapshot`](super::snapshot::read) for one type.
pub(crate) type ReadSnapshot<K> = fn(
    &std::path::Path,
    &str,
    bool,
    &mut dyn FnMut(Vec<RestoredObject<K>>) -> bool,
) -> Result<String, SnapshotError>;

/// [`write_snapshot`](super::snapshot::write) for one type.
pub(crate) type WriteSnapshot<K> =
    fn(&std::path::Path, &str, &str, &[(ObjectKey, Kept<K>)]) -> std::io::Result<usize>;

impl<K, L, S> Reflector<K, L, S>
where
    K: Resource + Send + Sync + 'static,
    L: ListWatch<K>,
    S: ReflectorStore<K>,
{
    /// Reads a warm restart's snapshot and stores its objects; the resourceVersion to
    /// resume the watch from, or `None` (a full list follows) when it cannot be used.
    pub(super) async fn restore_snapshot(&self, restore: Restore<K>) -> Option<String> {
        let started = tokio::time::Instant::now();
        // Read (and decoded, if the store needs objects) on blocking threads a part at a
        // time, stored here as they come: a restore holds a few parts, never the whole
        // snapshot.
        let decode = !self.store.restores_encoded();
        let (parts, mut read) = tokio::sync::mpsc::channel::<Vec<RestoredObject<K>>>(2);
        let reading = tokio::task::spawn_blocking(move || {
            restore(decode, &mut |part| parts.blocking_send(part).is_ok())
        });
        let mut objects = 0usize;
        let mut storing = Duration::ZERO;
        let mut listing = false;
        while let Some(part) = read.recv().await {
            if !std::mem::replace(&mut listing, true) {
                self.store.apply(ReflectorEvent::ListStart);
            }
            objects += part.len();
            let part_started = std::time::Instant::now();
            self.store.apply(ReflectorEvent::Restored(part));
            storing += part_started.elapsed();
            // The handlers' tasks take the initial adds meanwhile.
            tokio::task::coop::consume_budget().await;
        }
        match reading.await {
            Ok(Ok(resource_version)) => {
                if !listing {
                    self.store.apply(ReflectorEvent::ListStart);
                }
                self.store
                    .apply(ReflectorEvent::RestoreEnd(resource_version.clone()));
                info!(
                    objects,
                    decoded = decode,
                    storing_ms = storing.as_millis() as u64,
                    rv = %resource_version,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "restored the cache from its snapshot; resuming the watch"
                );
                Some(resource_version)
            }
            Ok(Err(SnapshotError::Missing(path))) => {
                info!(path = %path.display(), "no snapshot to restore yet; listing");
                None
            }
            Ok(Err(error)) => {
                warn!(%error, "the snapshot cannot be used; listing");
                None
            }
            Err(error) => {
                warn!(%error, "reading the snapshot failed; listing");
                None
            }
        }
    }
}
