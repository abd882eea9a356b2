//! The list-then-watch loop (client-go's `Reflector`).
//! The full documentation is on [`Reflector`].
//!
//! An informer runs one for you; what a user of an informer meets here is its
//! configuration ([`ReflectorConfig`], [`BackoffConfig`], [`ListMode`], given to
//! [`InformerBuilder`](crate::InformerBuilder)) and its counters ([`ReflectorStats`],
//! [`SyncedVersion`]). [`Reflector`] and [`ReflectorStore`] run the loop into a store of
//! your own.

mod backoff;
mod list;
mod snapshot;
mod state;
mod watch;

use std::{
    collections::HashMap,
    future::Future,
    panic::AssertUnwindSafe,
    sync::{
        Arc,
        atomic::{AtomicU8, AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::FutureExt;
use kube_core::Resource;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::{
    error::{Error, StreamingRefusal, Verb, panic_message},
    key::ObjectKey,
    list_watch::{ListWatch, RawObject, Shard, ShardMode, Undecodable},
    store::{Arrival, EncodedObject, TransformFn, Writer},
};

pub use backoff::{Backoff, BackoffConfig};
pub use snapshot::{RestoredObject, WarmRestart};
pub(crate) use snapshot::{SnapshotError, selection as snapshot_selection};
pub(crate) use snapshot::{read as read_snapshot, write as write_snapshot};
use state::{Next, Phase, State, WatchEnd};
use watch::StreamingList;

/// Where a [`Reflector`] writes (client-go's reflector store: `Add`/`Update`, `Delete`,
/// `Replace`). Implemented by a store's writer and by the shared informer's event processor.
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
    /// Whether this store takes a [warm restart](WarmRestart)'s objects as they are kept
    /// ([`restore_objects`](Self::restore_objects) with objects not decoded yet). When it
    /// does not (the default), the restore decodes every object first, on every core.
    fn restores_encoded(&self) -> bool {
        false
    }
    /// Objects of a [warm restart](WarmRestart)'s snapshot, a part of it at a time, stored
    /// as objects of the full list in progress. The default decodes each (if it is not
    /// already) and hands it to [`list_object`](Self::list_object); one that does not
    /// decode is left out, with an error log, and the resumed watch or a relist brings it
    /// back.
    fn restore_objects(&self, objects: Vec<RestoredObject<K>>) {
        for object in objects {
            list_restored(self, object);
        }
    }
    /// The full list in progress held a [warm restart](WarmRestart)'s snapshot, the
    /// server's state at `resource_version`: complete as a list, but the store counts as
    /// synced only once [`caught_up`](Self::caught_up). The default completes it as a list.
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

/// `object` decoded (if it is not yet) and stored as an object of the full list in
/// progress; one that does not decode is left out, with an error log.
pub(crate) fn list_restored<K, S>(store: &S, object: RestoredObject<K>)
where
    S: ReflectorStore<K> + ?Sized,
{
    let key = object.key().clone();
    match object.into_decoded() {
        Ok((key, object, raw)) => store.list_object(key, object, Some(raw)),
        Err(error) => {
            error!(%key, %error, "an object of the snapshot does not decode");
            store.list_undecodable(key);
        }
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

/// The backoff between attempts to reach a server that could not be reached: the
/// configured one, capped at 1 s.
fn reconnect_backoff(config: &BackoffConfig) -> BackoffConfig {
    let cap = Duration::from_secs(1);
    config
        .clone()
        .initial(config.initial.min(cap / 4))
        .max(config.max.min(cap))
}

/// A callback that receives every list/watch error (client-go's `WatchErrorHandler`).
pub type ErrorHook = Arc<dyn Fn(&Error) + Send + Sync>;

/// How a [`Reflector`] fetches the full state of its resource.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ListMode {
    /// A streaming list (the default, as in client-go since 1.35): a watch with
    /// `sendInitialEvents=true` whose events are applied as they arrive (see
    /// [`Reflector`]). Needs Kubernetes 1.27+ with the `WatchList` feature (on by default
    /// since 1.32); a server that rejects it gets a paged list for that sync, one that
    /// ignores it gets paged lists from then on.
    #[default]
    Streaming,
    /// Paged `LIST` calls, each page streamed into the store.
    Paged,
}

/// Tuning of a [`Reflector`]: client-go's by default, each setting changed by the method
/// of its name. An informer takes the same settings from its
/// [`InformerBuilder`](crate::InformerBuilder).
///
/// ```
/// use std::time::Duration;
/// use kube_informer::reflector::{BackoffConfig, ListMode, ReflectorConfig};
///
/// let config = ReflectorConfig::default()
///     .list_mode(ListMode::Paged)
///     .page_size(100)
///     .backoff(BackoffConfig::default().max(Duration::from_secs(5)));
/// # let _ = config;
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ReflectorConfig {
    pub(crate) list_mode: ListMode,
    pub(crate) page_size: u32,
    pub(crate) min_watch_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) initial_events_timeout: Duration,
    pub(crate) backoff: BackoffConfig,
    pub(crate) shard: Option<Shard>,
}

impl ReflectorConfig {
    /// How the full state is fetched: [`ListMode::Streaming`] (the default) or
    /// [`ListMode::Paged`].
    #[must_use]
    pub fn list_mode(mut self, mode: ListMode) -> Self {
        self.list_mode = mode;
        self
    }

    /// Objects per list page (`limit`), 500; 0 asks for everything in one response.
    #[must_use]
    pub fn page_size(mut self, size: u32) -> Self {
        self.page_size = size;
        self
    }

    /// The lower bound of the random server-side watch timeout; the upper bound is twice
    /// this (5 min, so 5–10 min).
    #[must_use]
    pub fn min_watch_timeout(mut self, timeout: Duration) -> Self {
        self.min_watch_timeout = timeout;
        self
    }

    /// A watch that delivers nothing, not even a bookmark, for this long is reconnected
    /// (2 min). Servers send bookmarks about once a minute, so this is twice that: the
    /// backstop for a stalled connection on a client without pings (kube-client's
    /// default); [`client`](crate::client) finds one by its HTTP/2 pings in seconds.
    #[must_use]
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// A streaming list whose initial events pause for this long before their end
    /// bookmark is taken for an ordinary watch from a server that ignored
    /// `sendInitialEvents` (30 s): a real one sends them back to back, then the bookmark.
    #[must_use]
    pub fn initial_events_timeout(mut self, timeout: Duration) -> Self {
        self.initial_events_timeout = timeout;
        self
    }

    /// Lists and watches only `shard`'s objects (no shard: all). A server with the
    /// `ShardedListAndWatch` gate selects them; from one without, the reflector keeps
    /// them itself (the same hash), so the cache holds the same objects either way;
    /// [`ReflectorStats::shard_mode`] says which happened. A sharded reflector lists in
    /// pages whatever the [list mode](Self::list_mode): only a paged list's answer says
    /// whether the server applied the shard.
    #[must_use]
    pub fn shard(mut self, shard: Shard) -> Self {
        self.shard = Some(shard);
        self
    }

    /// The backoff between failed attempts.
    #[must_use]
    pub fn backoff(mut self, backoff: BackoffConfig) -> Self {
        self.backoff = backoff;
        self
    }
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        Self {
            list_mode: ListMode::default(),
            page_size: 500,
            min_watch_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(120),
            initial_events_timeout: Duration::from_secs(30),
            backoff: BackoffConfig::default(),
            shard: None,
        }
    }
}

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

    fn set_listed(&self, listed: Listed) {
        *self
            .listed
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(listed);
    }
}

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

    fn set(&self, rv: &str) {
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

/// What a reflector has done so far: its lists, watches and errors (for metrics). Cheap to
/// clone; every clone reads the same counters.
#[derive(Clone, Debug, Default)]
pub struct ReflectorStats(Arc<StatCounters>);

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

/// How a watch resumed from a [warm restart](WarmRestart)'s snapshot knew it had caught up
/// with the server ([`ReflectorStats::warm_restart_caught_up`]).
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

impl ReflectorStats {
    /// How the watch resumed from a warm restart's snapshot caught up, once it has; `None`
    /// before, and for an informer that did not restart warm.
    pub fn warm_restart_caught_up(&self) -> Option<CatchUp> {
        match self.0.caught_up.load(Ordering::Relaxed) {
            1 => Some(CatchUp::Version),
            2 => Some(CatchUp::Bookmark),
            _ => None,
        }
    }

    fn caught_up(&self, by: CatchUp) {
        let code = match by {
            CatchUp::Version => 1,
            CatchUp::Bookmark => 2,
        };
        self.0.caught_up.store(code, Ordering::Relaxed);
    }

    /// Lists started: paged lists and streaming lists, the first one included.
    pub fn lists(&self) -> u64 {
        self.0.lists.load(Ordering::Relaxed)
    }

    /// Watches started from a known resourceVersion (streaming lists are counted as lists).
    pub fn watches(&self) -> u64 {
        self.0.watches.load(Ordering::Relaxed)
    }

    /// Watches opened after the first one (a streaming list opens a watch too): one for
    /// every watch that ended (a server timeout, a dropped connection, a 410, an idle
    /// watch) and was opened again.
    pub fn watch_restarts(&self) -> u64 {
        (self.0.streaming_lists.load(Ordering::Relaxed) + self.watches()).saturating_sub(1)
    }

    /// Whether the server or the client applied the reflector's [shard](ReflectorConfig::shard)
    /// on its last list; `None` without a shard or before the first list.
    pub fn shard_mode(&self) -> Option<ShardMode> {
        match self.0.shard_mode.load(Ordering::Relaxed) {
            1 => Some(ShardMode::Server),
            2 => Some(ShardMode::Client),
            _ => None,
        }
    }

    /// Objects the server sent from outside the shard, which the reflector dropped.
    pub fn outside_shard(&self) -> u64 {
        self.0.outside_shard.load(Ordering::Relaxed)
    }

    /// Records the mode a list found; returns the previous one.
    fn set_shard_mode(&self, mode: ShardMode) -> Option<ShardMode> {
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

    fn count_outside_shard(&self) {
        Self::count(&self.0.outside_shard);
    }

    /// List and watch errors reported (each also went to the error hook).
    pub fn errors(&self) -> u64 {
        self.0.errors.load(Ordering::Relaxed)
    }

    /// Since when the API server has not served the resource: every list and watch since
    /// then was answered 404 (a CRD deleted, or not installed yet). `None` while it is
    /// served, and before the first answer.
    pub fn resource_missing_since(&self) -> Option<SystemTime> {
        match self.0.missing_since.load(Ordering::Relaxed) {
            0 => None,
            millis => Some(UNIX_EPOCH + Duration::from_millis(millis)),
        }
    }

    /// The server answered 404: true if it served the resource until now.
    fn mark_missing(&self) -> bool {
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
    fn mark_served(&self) -> bool {
        self.0.missing_since.swap(0, Ordering::Relaxed) != 0
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Lists and watches `L` into `S`.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{reflector::{Reflector, ReflectorConfig}, testing::{FakeListWatch, StoreWriter}};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let fake = FakeListWatch::<ConfigMap>::new("configmaps");
/// fake.add(FakeListWatch::<ConfigMap>::object(Some("ns"), "a"));
/// let writer = StoreWriter::new();
/// let store = writer.store();
/// let reflector = Reflector::new(fake.clone(), writer, ReflectorConfig::default());
/// let version = reflector.synced_version();
/// let stop = CancellationToken::new();
/// let task = tokio::spawn(reflector.run(stop.clone()));
/// fake.wait_for_calls(|c| c.watches == 1).await;
/// assert_eq!(store.len(), 1);
/// assert_eq!(version.get().as_deref(), Some("2"));
/// stop.cancel();
/// task.await.unwrap();
/// # }
/// ```
///
/// The list-then-watch loop (client-go's `Reflector`).
///
/// A [`Reflector`] keeps a [`ReflectorStore`] equal to the API server's state of one
/// resource:
///
/// 1. **List** in pages of [`page_size`](ReflectorConfig::page_size) (500) following
///    `continue` tokens. The first list asks for resourceVersion `"0"` (any cached state: cheap
///    for the server, which may then ignore the page size); later relists ask for data not
///    older than the last resourceVersion seen (`resourceVersionMatch=NotOlderThan`), so the
///    cache never goes back in time, and the server's watch cache can answer; when that
///    version expired (410 Gone, or a continue token that expired mid-list) or the server
///    has not reached it yet (504 "Too large resource version", a lagging API server or a
///    restored etcd), the list is restarted from page one at resourceVersion `""` (a
///    consistent read). Each page is read as a stream
///    ([`ListWatch::list_stream`]): objects go to the store as they are decoded, while the
///    server is still sending, and nothing holds a whole page; when the last page is in,
///    objects that were not listed are removed ([`finish_list`](ReflectorStore::finish_list)).
///    A relist is applied atomically, as client-go's (1.36) is: the store writes it in
///    one step at its end (see [`ReflectorStore`] and the
///    [informer's event order](crate::SharedInformer)), so readers never see two lists
///    mixed, and a relist that fails part-way leaves the store as it was.
///
///    With [`ListMode::Streaming`] the list is a *streaming list* instead (client-go's
///    watch-list): one watch with `sendInitialEvents=true` delivers the current objects as
///    events, which go to the store as they arrive, then a bookmark marked
///    `k8s.io/initial-events-end`, after which the same watch carries on with changes.
///    Objects not seen by the end bookmark are removed. A server that rejects
///    `sendInitialEvents` or ignores it makes the reflector fall back to paged lists.
/// 2. **Watch** from the list's resourceVersion with `allowWatchBookmarks` and a random
///    server-side timeout in `[min_watch_timeout, 2 × min_watch_timeout)` (5–10 min), applying
///    each event to the store. Bookmarks only advance the resourceVersion.
/// 3. A watch that **ends normally** is resumed from the last resourceVersion, without a
///    relist. A **410 Gone** (error or `ERROR` event, "too old resource version") relists
///    from the last resourceVersion, as client-go does. An **undecodable or malformed
///    event** is reported and relists (an event was lost, so only a list can tell the
///    truth). A watch silent (no event, no bookmark) for
///    [`idle_timeout`](ReflectorConfig::idle_timeout) is presumed dead and reconnected.
///    A watch call the server **refuses** (403, 5xx, ...) relists after a backoff, as
///    client-go's `ListAndWatch` loop does, so a cache whose watch never works still
///    follows the server at the pace of its lists; only an unreachable server, 429 Too
///    Many Requests and 503 Service Unavailable retry the watch alone. Other errors back
///    off (800 ms doubling to 30 s, jittered, reset after 2 min of health; see
///    [`Backoff`]) and retry. A server that cannot be reached (connection refused or
///    reset, a dead connection) is tried again sooner: 250 ms doubling to at most 1 s,
///    since an attempt that never reaches it costs it nothing and the first one after it
///    is back should not wait out a long backoff. So is a server answering 503 (starting,
///    or cut off from etcd), for its first 12 answers in a row; then the ordinary backoff
///    applies.
/// 4. A **panic** in code the reflector runs for the user or the wire (a transform, an
///    index function, a codec, a decoder) is caught, reported as [`Error::Panicked`], and
///    repaired by a relist after a backoff: the cache never stops following the server in
///    silence while it says it has synced.
///
/// Every list/watch error goes to the [error hook](Reflector::with_error_hook), if any, and
/// to `tracing`.
pub struct Reflector<K, L, S> {
    lw: L,
    store: S,
    config: ReflectorConfig,
    transform: Option<TransformFn<K>>,
    error_hook: Option<ErrorHook>,
    synced: SyncedVersion,
    stats: ReflectorStats,
    /// Asks for a relist from a consistent read (a divergence check found drift, the
    /// shard changed).
    relist: Option<Arc<Notify>>,
    /// `None` for an unsharded reflector, whose objects are never hashed.
    shard: Option<ShardCell>,
    resource: String,
    namespace: Option<String>,
    /// Reads a warm restart's snapshot, once, before the first step.
    restore: Option<Restore<K>>,
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

/// [`read_snapshot`] for one type.
pub(crate) type ReadSnapshot<K> = fn(
    &std::path::Path,
    &str,
    bool,
    &mut dyn FnMut(Vec<RestoredObject<K>>) -> bool,
) -> Result<String, SnapshotError>;

/// [`write_snapshot`] for one type.
pub(crate) type WriteSnapshot<K> = fn(
    &std::path::Path,
    &str,
    &str,
    &[(ObjectKey, crate::store::Kept<K>)],
) -> std::io::Result<usize>;

impl<K, L, S> Reflector<K, L, S>
where
    K: Resource + Send + Sync + 'static,
    L: ListWatch<K>,
    S: ReflectorStore<K>,
{
    /// A reflector from `list_watch` into `store`.
    pub fn new(list_watch: L, store: S, config: ReflectorConfig) -> Self {
        let resource = list_watch.resource();
        let namespace = list_watch.namespace();
        let shard = config.shard.clone().map(|configured| {
            let cell = ShardCell::default();
            cell.set(configured);
            cell
        });
        Self {
            lw: list_watch,
            store,
            config,
            transform: None,
            error_hook: None,
            synced: SyncedVersion::default(),
            stats: ReflectorStats::default(),
            relist: None,
            shard,
            resource,
            namespace,
            restore: None,
        }
    }

    /// Starts from a warm restart's snapshot that `restore` reads, when it can be used,
    /// instead of a full list (see [`WarmRestart`]).
    #[must_use]
    pub(crate) fn with_restore(mut self, restore: Restore<K>) -> Self {
        self.restore = Some(restore);
        self
    }

    /// Applies `transform` to every object before it is stored.
    #[must_use]
    pub fn with_transform(mut self, transform: TransformFn<K>) -> Self {
        self.transform = Some(transform);
        self
    }

    /// Calls `hook` with every list/watch error.
    #[must_use]
    pub fn with_error_hook(mut self, hook: ErrorHook) -> Self {
        self.error_hook = Some(hook);
        self
    }

    /// Shares the last-synced resourceVersion with `version` (the informer passes its own).
    #[must_use]
    pub fn with_synced_version(mut self, version: SyncedVersion) -> Self {
        self.synced = version;
        self
    }

    /// Counts this reflector's lists, watches and errors into `stats` (the informer passes
    /// its own).
    #[must_use]
    pub fn with_stats(mut self, stats: ReflectorStats) -> Self {
        self.stats = stats;
        self
    }

    /// A handle on this reflector's counters.
    pub fn stats(&self) -> ReflectorStats {
        self.stats.clone()
    }

    /// Relists from a consistent read (`resourceVersion=""`) whenever `trigger` is notified
    /// while watching.
    #[must_use]
    pub fn with_relist_trigger(mut self, trigger: Arc<Notify>) -> Self {
        self.relist = Some(trigger);
        self
    }

    /// Whether `object` belongs to the reflector's shard (every object does without one);
    /// counts one that does not.
    fn in_shard(&self, object: &K) -> bool {
        let inside = self.shard.as_ref().is_none_or(|cell| cell.contains(object));
        if !inside {
            self.stats.count_outside_shard();
        }
        inside
    }

    /// Follows the shard in `cell` (the informer passes its own, so it can change it),
    /// holding the configured one until it is changed.
    #[must_use]
    pub(crate) fn with_shard_cell(mut self, cell: ShardCell) -> Self {
        if let Some(configured) = self.current_shard() {
            cell.set(configured);
        }
        self.shard = Some(cell);
        self
    }

    /// The shard the next list or watch asks for.
    fn current_shard(&self) -> Option<Shard> {
        self.shard.as_ref().and_then(ShardCell::get)
    }

    /// A handle on the last-synced resourceVersion.
    pub fn synced_version(&self) -> SyncedVersion {
        self.synced.clone()
    }

    /// Runs until `cancel` fires; never returns earlier.
    pub async fn run(self, cancel: CancellationToken) {
        let span = info_span!("reflector", resource = %self.resource, namespace = self.namespace.as_deref().unwrap_or(""));
        self.run_loop(cancel).instrument(span).await;
    }

    async fn run_loop(mut self, cancel: CancellationToken) {
        let mut backoff = Backoff::new(self.config.backoff.clone());
        let mut reconnect = Backoff::new(reconnect_backoff(&self.config.backoff));
        let list_mode = match self.config.shard {
            Some(_) => ListMode::Paged,
            None => self.config.list_mode,
        };
        let mut state = State::new(list_mode);
        if let Some(restore) = self.restore.take()
            && let Some(resource_version) = self.restore_snapshot(restore).await
        {
            state = State::resumed(list_mode, resource_version);
        }
        loop {
            if cancel.is_cancelled() {
                break;
            }
            // Each step runs code that is not the reflector's (transforms, index functions,
            // codecs, decoders): a panic there is caught, reported, and repaired by a
            // relist, never left as a cache that stopped following the server.
            let next = match (state.phase(), state.sync_mode()) {
                (Phase::Sync(from), ListMode::Streaming) => {
                    let start = state.streaming_start(from).to_owned();
                    debug!(rv = %start, "streaming list");
                    ReflectorStats::count(&self.stats.0.lists);
                    ReflectorStats::count(&self.stats.0.streaming_lists);
                    match self
                        .guarded(self.watch(&cancel, &start, StreamingList::Yes))
                        .await
                    {
                        Ok(report) => {
                            self.report_watch_end(&report.end);
                            state.watched(&report)
                        }
                        Err(()) => state.panicked(),
                    }
                }
                (Phase::Sync(from), ListMode::Paged) => {
                    ReflectorStats::count(&self.stats.0.lists);
                    if state.last_rv().is_empty()
                        && let Some(trigger) = &self.relist
                    {
                        // A first list is a consistent read of the shard as it is now: a
                        // relist asked for before it (a reshard before the start) is done.
                        let _ = trigger.notified().now_or_never();
                    }
                    let listed = tokio::select! {
                        biased;
                        () = cancel.cancelled() => break,
                        r = self.guarded(self.list_all(from, state.last_rv())) => r,
                    };
                    match listed {
                        Ok(Ok(rv)) => {
                            self.served();
                            state.listed(rv)
                        }
                        Ok(Err(error)) => {
                            self.report(&error);
                            if error.is_gone() {
                                debug!("list expired; listing again from resourceVersion \"\"");
                            }
                            state.list_failed(&error)
                        }
                        Err(()) => state.panicked(),
                    }
                }
                (Phase::Watch, _) => {
                    let start = state.last_rv().to_owned();
                    ReflectorStats::count(&self.stats.0.watches);
                    let streaming = if state.resuming() {
                        StreamingList::Resuming
                    } else {
                        StreamingList::No
                    };
                    match self.guarded(self.watch(&cancel, &start, streaming)).await {
                        Ok(report) => {
                            self.report_watch_end(&report.end);
                            state.watched(&report)
                        }
                        Err(()) => state.panicked(),
                    }
                }
            };
            match next {
                Next::Go => {}
                Next::Backoff => {
                    if !self.sleep(&cancel, &mut backoff).await {
                        break;
                    }
                }
                Next::Reconnect => {
                    if !self.sleep(&cancel, &mut reconnect).await {
                        break;
                    }
                }
                Next::Stop => break,
            }
        }
        debug!("reflector stopped");
    }

    /// Reads a warm restart's snapshot and stores its objects; the resourceVersion to
    /// resume the watch from, or `None` (a full list follows) when it cannot be used.
    async fn restore_snapshot(&self, restore: Restore<K>) -> Option<String> {
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
                self.store.start_list();
            }
            objects += part.len();
            let part_started = std::time::Instant::now();
            self.store.restore_objects(part);
            storing += part_started.elapsed();
            // The handlers' tasks take the initial adds meanwhile.
            tokio::task::coop::consume_budget().await;
        }
        match reading.await {
            Ok(Ok(resource_version)) => {
                if !listing {
                    self.store.start_list();
                }
                self.store.finish_restore(&resource_version);
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

    /// Runs one step; a panic in it is reported as [`Error::Panicked`] and returned as
    /// `Err(())`.
    async fn guarded<T>(&self, step: impl Future<Output = T>) -> Result<T, ()> {
        match AssertUnwindSafe(step).catch_unwind().await {
            Ok(done) => Ok(done),
            Err(panic) => {
                let message = panic_message(&*panic).to_owned();
                error!(%message, "panic while listing or watching; relisting after a backoff");
                self.report(&Error::Panicked {
                    resource: self.resource.clone(),
                    message,
                });
                Err(())
            }
        }
    }

    /// Logs and reports how a watch ended, when that is news.
    fn report_watch_end(&self, end: &WatchEnd) {
        if !matches!(end, WatchEnd::Refused { .. } | WatchEnd::Cancelled) {
            // The watch was opened: the resource is served.
            self.served();
        }
        match end {
            WatchEnd::Failed {
                error: error @ Error::StreamingListUnsupported { .. },
                ..
            } => {
                self.report(error);
                warn!("falling back to paged lists");
            }
            WatchEnd::Failed { error, .. } | WatchEnd::Refused { error } => {
                self.report(error);
            }
            WatchEnd::Closed { events: 0, elapsed } if *elapsed < Duration::from_secs(1) => {
                warn!("watch closed at once without events");
            }
            WatchEnd::RelistRequested => info!("relisting from a consistent read, as asked"),
            WatchEnd::Cancelled | WatchEnd::Closed { .. } | WatchEnd::Idle => {}
        }
    }

    fn report(&self, error: &Error) {
        if error.is_resource_missing() {
            // Said once: until the resource is back, every retry gets the same answer.
            if self.stats.mark_missing() {
                warn!(
                    %error,
                    retry_at_most_every = ?self.config.backoff.max,
                    "the API server does not serve this resource (its CRD deleted or not \
                     installed?); the cache keeps its last state, and the informer resumes \
                     once the resource is served again"
                );
            } else {
                debug!(%error, "resource still not served");
            }
        } else {
            warn!(%error, "list/watch error");
        }
        ReflectorStats::count(&self.stats.0.errors);
        if let Some(hook) = &self.error_hook {
            hook(error);
        }
    }

    /// A list or watch was served: the resource is there (again).
    fn served(&self) {
        if self.stats.mark_served() {
            info!("the API server serves this resource again");
        }
    }

    /// Sleeps the next backoff delay; false if cancelled meanwhile.
    async fn sleep(&self, cancel: &CancellationToken, backoff: &mut Backoff) -> bool {
        let delay = backoff.next_delay();
        debug!(delay_ms = delay.as_millis() as u64, "backing off");
        tokio::select! {
            biased;
            () = cancel.cancelled() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }

    fn undecodable(&self, verb: Verb, object: &Undecodable) -> Error {
        Error::UndecodableObject {
            resource: self.resource.clone(),
            verb,
            key: object.key.to_string(),
            reason: object.reason.clone(),
        }
    }

    fn unsupported(&self, refusal: StreamingRefusal, detail: String) -> Error {
        Error::StreamingListUnsupported {
            resource: self.resource.clone(),
            refusal,
            detail,
        }
    }

    /// The object to store, keyed, and its wire bytes: none once transformed, as they are
    /// no longer the object's.
    fn prepare(
        &self,
        obj: K,
        raw: Option<RawObject>,
    ) -> Result<(ObjectKey, Arc<K>, Option<RawObject>), K> {
        let (obj, raw) = match &self.transform {
            Some(t) => (t(obj), None),
            None => (obj, raw),
        };
        match ObjectKey::from_object(&obj) {
            Ok(key) => Ok((key, Arc::new(obj), raw)),
            Err(_) => Err(obj),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        error::Verb,
        list_watch::WatchEvent,
        store::Store,
        testing::{FakeListWatch, decode_error, gone, status, transport_error},
    };
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::api::VersionMatch;
    use std::sync::Mutex;
    use tokio::time::Instant;

    type Fake = FakeListWatch<ConfigMap>;

    /// These tests follow paged lists; streaming lists have their own (tests/streaming_list.rs).
    fn paged() -> ReflectorConfig {
        ReflectorConfig::default().list_mode(ListMode::Paged)
    }

    fn cm(name: &str) -> ConfigMap {
        Fake::object(Some("ns"), name)
    }

    struct Harness {
        store: Store<ConfigMap>,
        errors: Arc<Mutex<Vec<String>>>,
        stop: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    fn start(fake: &Fake, config: ReflectorConfig) -> Harness {
        let writer = Writer::new();
        let store = writer.store();
        let errors = Arc::new(Mutex::new(Vec::new()));
        let hook_errors = errors.clone();
        let reflector = Reflector::new(fake.clone(), writer, config).with_error_hook(Arc::new(
            move |e: &Error| hook_errors.lock().unwrap().push(e.to_string()),
        ));
        let stop = CancellationToken::new();
        let task = tokio::spawn(reflector.run(stop.clone()));
        Harness {
            store,
            errors,
            stop,
            task,
        }
    }

    impl Harness {
        async fn stop(self) {
            self.stop.cancel();
            self.task.await.unwrap();
        }
        fn errors(&self) -> Vec<String> {
            self.errors.lock().unwrap().clone()
        }
    }

    fn list_rvs(fake: &Fake) -> Vec<(Option<String>, Option<VersionMatch>, bool)> {
        fake.list_requests()
            .into_iter()
            .map(|o| {
                (
                    o.resource_version,
                    o.version_match,
                    o.continue_token.is_some(),
                )
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn pages_of_500_then_watch_from_list_rv() {
        let fake = Fake::new("configmaps");
        for i in 0..1201 {
            fake.add(cm(&format!("o{i:04}")));
        }
        let h = start(&fake, paged());
        fake.wait_for_calls(|c| c.watches == 1).await;
        assert_eq!(h.store.len(), 1201);
        let lists = fake.list_requests();
        assert_eq!(lists.len(), 3);
        assert!(lists.iter().all(|o| o.limit == Some(500)));
        assert_eq!(lists[0].resource_version.as_deref(), Some("0"));
        assert!(lists[1].continue_token.is_some() && lists[1].resource_version.is_none());
        let watch = &fake.watch_requests()[0];
        assert_eq!(watch.resource_version, fake.resource_version());
        assert!(watch.allow_bookmarks);
        let t = watch.timeout.unwrap();
        assert!(
            t >= Duration::from_secs(300) && t < Duration::from_secs(600),
            "{t:?}"
        );
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn gone_in_the_middle_of_a_paged_list_restarts_from_latest() {
        let fake = Fake::new("configmaps");
        for i in 0..1200 {
            fake.add(cm(&format!("o{i:04}")));
        }
        fake.fail_next_continue(gone("configmaps", Verb::List));
        let h = start(&fake, paged());
        fake.wait_for_calls(|c| c.watches == 1).await;
        assert_eq!(
            list_rvs(&fake),
            [
                (Some("0".into()), None, false),
                (None, None, true),  // 410 here
                (None, None, false), // restart at RV "" from page 1
                (None, None, true),
                (None, None, true),
            ]
        );
        assert_eq!(h.store.len(), 1200);
        assert_eq!(h.errors().len(), 1);
        assert!(h.errors()[0].contains("410"));
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn watch_end_resumes_from_last_rv_without_relist() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        let h = start(&fake, paged());
        fake.wait_for_calls(|c| c.watches == 1).await;
        fake.add(cm("b"));
        let rv = fake.update(cm("a"));
        fake.end_watches();
        fake.wait_for_calls(|c| c.watches == 2).await;
        assert_eq!(fake.calls().lists, 1, "no relist");
        assert_eq!(fake.watch_requests()[1].resource_version, rv);
        assert_eq!(h.store.len(), 2);
        // a bookmark moves the resume point too
        fake.bookmark();
        let bookmark_rv = fake.resource_version();
        fake.add(cm("c"));
        let after = fake.resource_version();
        fake.end_watches();
        fake.wait_for_calls(|c| c.watches == 3).await;
        assert_eq!(fake.watch_requests()[2].resource_version, after);
        assert_ne!(bookmark_rv, "");
        assert!(h.errors().is_empty());
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn stats_count_lists_watches_restarts_and_errors() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        let reflector = Reflector::new(fake.clone(), Writer::new(), paged());
        let stats = reflector.stats();
        let stop = CancellationToken::new();
        let task = tokio::spawn(reflector.run(stop.clone()));
        fake.wait_for_calls(|c| c.watches == 1).await;
        assert_eq!(
            (stats.lists(), stats.watches(), stats.watch_restarts()),
            (1, 1, 0)
        );
        // A watch that ends resumes: one more watch, no list.
        fake.end_watches();
        fake.wait_for_calls(|c| c.watches == 2).await;
        assert_eq!(
            (stats.lists(), stats.watches(), stats.watch_restarts()),
            (1, 2, 1)
        );
        assert_eq!(stats.errors(), 0);
        // A 410 on the watch relists: one error, one list, then a watch.
        fake.fail_next_watch(gone("configmaps", Verb::Watch));
        fake.end_watches();
        fake.wait_for_calls(|c| c.watches == 4).await;
        assert_eq!(stats.errors(), 1);
        assert_eq!((stats.lists(), stats.watch_restarts()), (2, 3));
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn gone_on_watch_relists_from_the_last_version() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        fake.add(cm("b"));
        let h = start(&fake, paged());
        fake.wait_for_calls(|c| c.watches == 1).await;
        // changes the watch never sees, then history is compacted
        fake.set_broadcast(false);
        fake.delete(Some("ns"), "a");
        fake.add(cm("c"));
        fake.compact();
        fake.set_broadcast(true);
        fake.end_watches(); // resume from an expired RV -> ERROR 410 event
        fake.wait_for_calls(|c| c.watches == 3).await;
        assert_eq!(fake.calls().lists, 2);
        // Served from the watch cache, as client-go does; an expired list would fall back.
        let (rv, version_match, _) = list_rvs(&fake)[1].clone();
        assert!(rv.is_some_and(|rv| rv != "0"));
        assert_eq!(version_match, Some(VersionMatch::NotOlderThan));
        let mut keys: Vec<_> = h
            .store
            .list_keys()
            .into_iter()
            .map(|k| k.to_string())
            .collect();
        keys.sort();
        assert_eq!(keys, ["ns/b", "ns/c"]);
        assert!(h.errors()[0].contains("410"), "{:?}", h.errors());
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn errors_back_off_and_later_relists_use_last_rv() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        for _ in 0..3 {
            fake.fail_next_list(transport_error("configmaps", Verb::List));
        }
        let t0 = Instant::now();
        let h = start(&fake, paged());
        fake.wait_for_calls(|c| c.watches == 1).await;
        // 3 unreachable-server failures: delays of at most 0.25 + 0.5 + 1 s (the reconnect
        // backoff, capped at 1 s), at least 75% of that
        let waited = t0.elapsed();
        assert!(waited <= Duration::from_millis(1750), "{waited:?}");
        assert!(waited >= Duration::from_millis(1300), "{waited:?}");
        assert_eq!(h.errors().len(), 3);
        // a decode error on the watch relists at the last seen RV, NotOlderThan
        let rv = fake.resource_version();
        fake.inject(Err(decode_error("configmaps", Verb::Watch)));
        fake.wait_for_calls(|c| c.watches == 2).await;
        let last = fake.list_requests().pop().unwrap();
        assert_eq!(last.resource_version.as_deref(), Some(rv.as_str()));
        assert_eq!(last.version_match, Some(VersionMatch::NotOlderThan));
        assert!(h.errors()[3].contains("decode"), "{:?}", h.errors());
        h.stop().await;
    }

    /// Found by the soak (seed 20261203): after a storm of faults had grown the backoff,
    /// a custom resource's watch answered 503 by a restarting API server waited out
    /// 25 s of backoff, its cache that long behind a server that was back.
    #[tokio::test(start_paused = true)]
    async fn a_503_after_a_storm_of_failures_is_retried_within_a_second() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        let answer = |code, reason: &str, message: &str| {
            Error::from_status(
                status(code, reason, message),
                Verb::Watch,
                "configmaps",
                None,
            )
        };
        for _ in 0..5 {
            fake.fail_next_watch(answer(
                500,
                "InternalError",
                "etcdserver: request timed out",
            ));
        }
        fake.fail_next_watch(answer(
            503,
            "ServiceUnavailable",
            "the request has been made before all known HTTP paths have been installed",
        ));
        let h = start(&fake, paged());
        fake.wait_for_calls(|c| c.watches == 6).await;
        let refused = Instant::now();
        fake.wait_for_calls(|c| c.watches == 7).await;
        let waited = refused.elapsed();
        assert!(waited <= Duration::from_secs(1), "{waited:?}");
        assert!(h.errors()[5].contains("503"), "{:?}", h.errors());
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn idle_watch_is_reconnected() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        let config = paged().idle_timeout(Duration::from_secs(60));
        let h = start(&fake, config);
        fake.wait_for_calls(|c| c.watches == 1).await;
        let t0 = Instant::now();
        // bookmarks keep it alive
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(50)).await;
            fake.bookmark();
        }
        assert_eq!(fake.calls().watches, 1);
        // then silence
        fake.wait_for_calls(|c| c.watches == 2).await;
        let elapsed = t0.elapsed();
        assert!(
            elapsed >= Duration::from_secs(210) && elapsed < Duration::from_secs(212),
            "{elapsed:?}"
        );
        assert_eq!(fake.calls().lists, 1, "an idle reconnect does not relist");
        assert!(h.errors()[0].contains("no event"), "{:?}", h.errors());
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn malformed_event_is_reported_and_relisted() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        let h = start(&fake, paged());
        fake.wait_for_calls(|c| c.watches == 1).await;
        fake.inject(Ok(WatchEvent::Added(ConfigMap::default()))); // no name
        fake.wait_for_calls(|c| c.watches == 2).await;
        assert_eq!(fake.calls().lists, 2);
        assert!(h.errors()[0].contains("malformed"), "{:?}", h.errors());
        // and an ERROR event that is not a 410 backs off and re-watches
        fake.inject(Ok(WatchEvent::Error(status(
            500,
            "InternalError",
            "etcd unavailable",
        ))));
        fake.wait_for_calls(|c| c.watches == 3).await;
        assert_eq!(fake.calls().lists, 2);
        assert!(h.errors()[1].contains("etcd unavailable"));
        assert_eq!(h.store.len(), 1);
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_forbidden_watch_is_reported_and_relisted() {
        let fake = Fake::new("configmaps");
        fake.fail_next_watch(Error::from_status(
            status(403, "Forbidden", "denied"),
            Verb::Watch,
            "configmaps",
            Some("ns"),
        ));
        let h = start(&fake, paged());
        fake.wait_for_calls(|c| c.watches == 2).await;
        // As client-go's `ListAndWatch` loop: a watch that cannot start may never start, so
        // the cache follows the server by lists meanwhile.
        assert_eq!(fake.calls().lists, 2);
        assert!(h.errors()[0].contains("cannot watch configmaps in namespace \"ns\""));
        h.stop().await;
    }
}
