//! What an informer is doing, in one word: [`InformerHealth`].

use std::time::SystemTime;

/// What an informer is doing, as [`InformerHandle::health`](crate::InformerHandle::health)
/// and a factory's [`InformerStatus`](crate::informer::InformerStatus) report it; a manager's
/// `/readyz` fails while an informer's resource is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InformerHealth {
    /// Its first list has not completed yet.
    Syncing,
    /// It has synced, and the server serves its resource.
    Synced,
    /// The API server does not serve its resource: every list and watch since `since` was
    /// answered 404 (its CRD deleted, or not installed yet). Said once in the log, at warn.
    /// The cache keeps its last state (empty after a CRD's deletion, which deletes every
    /// object first); the informer asks again at its backoff's pace (at most every 30 s by
    /// default), and resumes by itself once the resource is back: a full list, whose
    /// changes reach the handlers as usual.
    ResourceMissing {
        /// The first 404.
        since: SystemTime,
    },
}

impl InformerHealth {
    /// From whether the informer has synced and since when its resource has been missing.
    pub(super) fn of(synced: bool, missing_since: Option<SystemTime>) -> Self {
        match (missing_since, synced) {
            (Some(since), _) => Self::ResourceMissing { since },
            (None, true) => Self::Synced,
            (None, false) => Self::Syncing,
        }
    }
}
