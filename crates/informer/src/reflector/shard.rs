//! The shard a reflector follows. It is shared with the informer, which changes it while
//! the reflector runs, and read by the sharded controller to know what its cache covers.

use std::sync::Arc;

use kube_core::Resource;

use crate::list_watch::Shard;

/// The shard a reflector follows, replaceable while it runs: the next list and watch ask
/// for the new one, and every object from then on is kept or dropped by it. It also keeps
/// the shard of the last full list and that list's resourceVersion: what the cache is
/// known to follow since.
#[derive(Clone, Debug, Default)]
pub(crate) struct ShardCell {
    wanted: Arc<std::sync::RwLock<Option<Shard>>>,
    listed: Arc<std::sync::RwLock<Option<Listed>>>,
}

/// The shard a full list was made with, and its resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) shard: Shard,
    pub(crate) resource_version: String,
}

impl ShardCell {
    pub(crate) fn get(&self) -> Option<Shard> {
        self.wanted
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set(&self, shard: Shard) {
        *self
            .wanted
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(shard);
    }

    /// Whether `object` is in the shard (every object is while there is none).
    pub(crate) fn contains<K: Resource>(&self, object: &K) -> bool {
        let shard = self
            .wanted
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        shard.as_ref().is_none_or(|s| s.contains(object))
    }

    /// The last full list's shard and resourceVersion: every change in that shard since
    /// then reaches the cache through the watch.
    pub(crate) fn listed(&self) -> Option<Listed> {
        self.listed
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set_listed(&self, listed: Listed) {
        *self
            .listed
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(listed);
    }
}
