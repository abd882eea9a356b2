//! What a sharded controller reports to its ring so a slot changes hands without a gap:
//! the slots its primary's cache follows, and whether it has caught up with a version on
//! a slot it is handing over.

use std::sync::{Mutex, PoisonError};

use kube_core::Resource;
use tracing::debug;

use super::{
    last_state::{LastState, LastStates},
    source::Parked,
};
use crate::{
    informer::InformerHandle,
    key::ObjectKey,
    list_watch::{HashRange, Shard},
    sharding::{Coverage, ForwardedDeletion, Handover},
    workqueue::RateLimitingQueue,
};

/// A sharded controller's primary cache, handler and queue, as the ring asks about them.
pub(super) struct CacheHandover<K> {
    /// The name of the primary's handler: the controller's.
    pub(super) handler: String,
    pub(super) primary: InformerHandle<K>,
    pub(super) queue: RateLimitingQueue<ObjectKey>,
    pub(super) deleted: LastStates<K>,
    /// Keys refused on a slot and kept aside: not reconciled yet, though not queued.
    pub(super) parked: Parked,
    pub(super) slots: u16,
    /// The version a relist was last asked for to reach.
    pub(super) relist_asked: Mutex<u64>,
}

impl<K: Resource + Send + Sync + 'static> CacheHandover<K> {
    /// The slot of the object `key` names, by its UID as cached (or as last seen, for a
    /// deleted one).
    fn slot_of(&self, key: &ObjectKey) -> Option<u16> {
        let uid = match self.primary.store().get_by_key(key) {
            Some(object) => object.meta().uid.clone(),
            None => self
                .deleted
                .get(key)
                .and_then(|last| last.uid().map(str::to_owned)),
        };
        Some(crate::sharding::slot_of(&uid?, self.slots))
    }
}

/// Whether `shard` holds all of slot `slot` of `count` (a shard is cut along slots, so
/// its first hash tells).
fn holds(shard: &Shard, slot: u16, count: u16) -> bool {
    HashRange::part(usize::from(slot), usize::from(count))
        .is_some_and(|part| shard.ranges().iter().any(|r| r.contains(part.start())))
}

impl<K: Resource + Send + Sync + 'static> Handover for CacheHandover<K> {
    fn coverage(&self, count: u16) -> Option<Coverage> {
        let cell = self.primary.shard_cell()?;
        let listed = cell.listed()?;
        let wanted = cell.get()?;
        let resource_version = listed.resource_version.parse().ok()?;
        let slots = (0..count)
            .filter(|&slot| holds(&listed.shard, slot, count) && holds(&wanted, slot, count))
            .collect();
        Some(Coverage {
            slots,
            resource_version,
        })
    }

    fn caught_up(&self, slot: u16, version: u64) -> bool {
        // The cache holds every change up to its synced version, and its handler's buffer
        // was filled before that version was set: once the buffer is empty, each of those
        // changes has put its key in the queue; once no key of the slot is queued or being
        // reconciled (nor kept aside for the slot), each has been reconciled.
        let synced = self
            .primary
            .last_sync_resource_version()
            .and_then(|v| v.parse::<u64>().ok());
        if synced.is_none_or(|synced| synced < version) {
            // A quiet shard gets no event to move its version on (a bookmark comes about
            // once a minute): a relist from a consistent read passes `version` at once,
            // and shows every deletion up to it as one.
            let mut asked = self
                .relist_asked
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *asked < version && self.primary.relist() {
                debug!(
                    slot,
                    version, "relisting to catch up before handing the slot over"
                );
                *asked = version;
            }
            return false;
        }
        let handler_idle = self
            .primary
            .handler_stats()
            .iter()
            .filter(|h| h.name == self.handler)
            .all(|h| h.waiting == 0);
        // The keys are copied out first: the queue's lock is not held while the store's
        // is taken.
        handler_idle
            && !self.parked.any(slot)
            && !self
                .queue
                .items()
                .iter()
                .any(|key| self.slot_of(key) == Some(slot))
    }

    fn take_forwarded(&self, deletions: &[ForwardedDeletion]) {
        for deletion in deletions.iter().filter(|d| d.controller == self.handler) {
            let key = ObjectKey::new(deletion.namespace.as_deref(), &deletion.name);
            let cached = self.primary.store().get_by_key(&key);
            if cached.is_some_and(|object| object.meta().uid.as_deref() == Some(&deletion.uid)) {
                // This cache is behind, and will see the deletion itself.
                continue;
            }
            debug!(%key, slot = deletion.slot, "a deletion forwarded by the slot's last holder queued");
            self.deleted
                .entry(key.clone())
                .or_insert_with(|| LastState::Forwarded(deletion.uid.clone()));
            self.queue.add(key);
        }
    }
}
