//! What a controller knows of a deleted primary until its deletion is reconciled.

use std::sync::Arc;

use dashmap::DashMap;
use kube_core::Resource;

use crate::key::ObjectKey;

/// What is known of a deleted primary.
pub(super) enum LastState<K> {
    /// Its last state, as this replica's cache saw it go.
    Seen(Arc<K>),
    /// Its UID only: another replica of a sharded controller saw it go in a slot it lost
    /// before it could hand the slot over, and forwarded the deletion here.
    Forwarded(String),
}

impl<K: Resource> LastState<K> {
    /// The deleted object's UID.
    pub(super) fn uid(&self) -> Option<&str> {
        match self {
            LastState::Seen(object) => object.meta().uid.as_deref(),
            LastState::Forwarded(uid) => Some(uid),
        }
    }

    /// Its last state, when this replica saw it.
    pub(super) fn object(&self) -> Option<&Arc<K>> {
        match self {
            LastState::Seen(object) => Some(object),
            LastState::Forwarded(_) => None,
        }
    }
}

/// The deleted primaries whose deletions are yet to be reconciled, by key.
pub(super) type LastStates<K> = Arc<DashMap<ObjectKey, LastState<K>>>;
