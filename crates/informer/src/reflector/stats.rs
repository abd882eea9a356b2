//! What a reflector tells the outside while it runs: the version its store has synced to
//! (what a wait for a write to reach the cache watches) and counters for metrics. Both are
//! shared handles, so the informer, controllers and the manager read them without reaching
//! into the loop.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU8, AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::list_watch::ShardMode;

/// The resourceVersion a reflector last synced to (from a list, an event or a bookmark).
///
/// It is set after the store has taken what came with it, so a store whose synced version
/// has reached a write's resourceVersion holds that write or something later.
#[derive(Clone, Debug)]
pub struct SyncedVersion(Arc<tokio::sync::watch::Sender<Synced>>);

/// A [`SyncedVersion`]'s value, as its watchers see it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Synced {
    /// The last synced resourceVersion; `None` before the first list completed.
    pub(crate) resource_version: Option<String>,
    /// The informer has stopped: the version will not move again.
    pub(crate) stopped: bool,
}

impl Default for SyncedVersion {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(Synced::default())))
    }
}

impl SyncedVersion {
    /// The last synced resourceVersion; `None` before the first list completed.
    pub fn get(&self) -> Option<String> {
        self.0.borrow().resource_version.clone()
    }

    pub(super) fn set(&self, rv: &str) {
        self.0
            .send_modify(|synced| match &mut synced.resource_version {
                Some(version) => rv.clone_into(version),
                None => synced.resource_version = Some(rv.to_owned()),
            });
    }

    /// Marks the version final: whoever waits for it to move is told it never will.
    pub(crate) fn stop(&self) {
        self.0.send_modify(|synced| synced.stopped = true);
    }

    /// A receiver that sees every later change.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<Synced> {
        self.0.subscribe()
    }
}

/// What a reflector has done so far: its lists, watches and errors; from
/// [`InformerHandle::reflector_stats`](crate::InformerHandle::reflector_stats) or a
/// standalone reflector's [`stats`](super::Reflector::stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReflectorStats {
    /// Lists started: paged lists and streaming lists, the first one included.
    pub lists: u64,
    /// Watches started from a known resourceVersion (streaming lists are counted as lists).
    pub watches: u64,
    /// Watches opened after the first one (a streaming list opens a watch too): one for
    /// every watch that ended (a server timeout, a dropped connection, a 410, an idle
    /// watch) and was opened again.
    pub watch_restarts: u64,
    /// List and watch errors reported (each also went to the error hook).
    pub errors: u64,
    /// Whether the server or the client applied the reflector's
    /// [shard](super::config::ReflectorConfig::shard) on its last list; `None` without a
    /// shard or before the first list.
    pub shard_mode: Option<ShardMode>,
    /// Objects the server sent from outside the shard, which the reflector dropped.
    pub outside_shard: u64,
    /// Since when the API server has not served the resource: every list and watch since
    /// then was answered 404 (a CRD deleted, or not installed yet). `None` while it is
    /// served, and before the first answer.
    pub resource_missing_since: Option<SystemTime>,
    /// How the watch resumed from a warm restart's snapshot caught up, once it has; `None`
    /// before, and for an informer that did not restart warm.
    pub warm_restart_caught_up: Option<CatchUp>,
}

/// The counters behind [`ReflectorStats`]: the reflector adds to them, the informer's
/// handles and the metrics read them. Cheap to clone; every clone shares the counters.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReflectorCounters(Arc<StatCounters>);

#[derive(Debug, Default)]
struct StatCounters {
    lists: AtomicU64,
    streaming_lists: AtomicU64,
    watches: AtomicU64,
    errors: AtomicU64,
    /// 0: no shard, or not listed yet; 1: applied by the server; 2: by the client.
    shard_mode: AtomicU8,
    outside_shard: AtomicU64,
    /// Since when (milliseconds after the Unix epoch) the server has answered 404 to the
    /// resource's list or watch; 0 while it serves it.
    missing_since: AtomicU64,
    /// How the last warm restart's watch caught up: 0 none yet, 1 by the version, 2 by a
    /// bookmark.
    caught_up: AtomicU8,
}

/// How a watch resumed from a [warm restart](super::snapshot::WarmRestart)'s snapshot knew
/// it had caught up with the server ([`ReflectorStats::warm_restart_caught_up`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CatchUp {
    /// It saw the version the API server's cache was at when it opened: the resource's
    /// last change was the selection's.
    Version,
    /// At its first bookmark, which the API server sends one to two seconds after the
    /// watch opens: the cache was ahead of the selection's last change (other objects of
    /// the resource changed since, or a consistent read advanced it).
    Bookmark,
}

impl ReflectorCounters {
    pub(crate) fn snapshot(&self) -> ReflectorStats {
        ReflectorStats {
            lists: self.lists(),
            watches: self.watches(),
            watch_restarts: self.watch_restarts(),
            errors: self.errors(),
            shard_mode: self.shard_mode(),
            outside_shard: self.outside_shard(),
            resource_missing_since: self.resource_missing_since(),
            warm_restart_caught_up: self.warm_restart_caught_up(),
        }
    }

    fn warm_restart_caught_up(&self) -> Option<CatchUp> {
        match self.0.caught_up.load(Ordering::Relaxed) {
            1 => Some(CatchUp::Version),
            2 => Some(CatchUp::Bookmark),
            _ => None,
        }
    }

    pub(super) fn caught_up(&self, by: CatchUp) {
        let code = match by {
            CatchUp::Version => 1,
            CatchUp::Bookmark => 2,
        };
        self.0.caught_up.store(code, Ordering::Relaxed);
    }

    fn lists(&self) -> u64 {
        self.0.lists.load(Ordering::Relaxed)
    }

    fn watches(&self) -> u64 {
        self.0.watches.load(Ordering::Relaxed)
    }

    fn watch_restarts(&self) -> u64 {
        (self.0.streaming_lists.load(Ordering::Relaxed) + self.watches()).saturating_sub(1)
    }

    fn shard_mode(&self) -> Option<ShardMode> {
        match self.0.shard_mode.load(Ordering::Relaxed) {
            1 => Some(ShardMode::Server),
            2 => Some(ShardMode::Client),
            _ => None,
        }
    }

    fn outside_shard(&self) -> u64 {
        self.0.outside_shard.load(Ordering::Relaxed)
    }

    /// Records the mode a list found; returns the previous one.
    pub(super) fn set_shard_mode(&self, mode: ShardMode) -> Option<ShardMode> {
        let code = match mode {
            ShardMode::Server => 1,
            ShardMode::Client => 2,
        };
        match self.0.shard_mode.swap(code, Ordering::Relaxed) {
            1 => Some(ShardMode::Server),
            2 => Some(ShardMode::Client),
            _ => None,
        }
    }

    pub(super) fn count_outside_shard(&self) {
        Self::count(&self.0.outside_shard);
    }

    fn errors(&self) -> u64 {
        self.0.errors.load(Ordering::Relaxed)
    }

    pub(crate) fn resource_missing_since(&self) -> Option<SystemTime> {
        match self.0.missing_since.load(Ordering::Relaxed) {
            0 => None,
            millis => Some(UNIX_EPOCH + Duration::from_millis(millis)),
        }
    }

    /// The server answered 404: true if it served the resource until now.
    pub(super) fn mark_missing(&self) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            })
            .max(1);
        self.0
            .missing_since
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// The server served a list or watch: true if it had not been.
    pub(super) fn mark_served(&self) -> bool {
        self.0.missing_since.swap(0, Ordering::Relaxed) != 0
    }

    /// Counts a list started, paged or streaming.
    pub(super) fn count_list(&self) {
        Self::count(&self.0.lists);
    }

    /// Counts a streaming list started (counted as a list too).
    pub(super) fn count_streaming_list(&self) {
        Self::count(&self.0.streaming_lists);
    }

    /// Counts a watch started from a known resourceVersion.
    pub(super) fn count_watch(&self) {
        Self::count(&self.0.watches);
    }

    /// Counts a list or watch error reported.
    pub(super) fn count_error(&self) {
        Self::count(&self.0.errors);
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
