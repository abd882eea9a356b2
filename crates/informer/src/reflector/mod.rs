//! The list-then-watch loop (client-go's `Reflector`).
//! The full documentation is on [`Reflector`].
//!
//! An informer runs one for you; what a user of an informer meets here is its
//! configuration ([`ReflectorConfig`], [`BackoffConfig`], [`ListMode`], given to
//! [`InformerBuilder`](crate::informer::InformerBuilder)) and its counters ([`ReflectorStats`],
//! [`SyncedVersion`]). [`Reflector`] and [`ReflectorStore`] run the loop into a store of
//! your own.

mod backoff;
mod config;
mod list;
mod restore;
mod run;
mod shard;
mod snapshot;
mod state;
mod stats;
mod store;
mod watch;

use std::sync::Arc;

use kube_core::Resource;
use tokio::sync::Notify;

use crate::{
    error::{Error, StreamingRefusal, Verb},
    key::ObjectKey,
    list_watch::{ListWatch, RawObject, Shard, Undecodable},
    stats::LiveStats,
    store::TransformFn,
};

pub use backoff::{Backoff, BackoffConfig};
pub use config::{ListMode, ReflectorConfig};
use restore::Restore;
pub(crate) use restore::{ReadSnapshot, WriteSnapshot, store_encoded};
pub(crate) use shard::ShardCell;
pub(crate) use snapshot::selection as snapshot_selection;
pub use snapshot::{RestoredObject, WarmRestart};
pub(crate) use snapshot::{read as read_snapshot, write as write_snapshot};
pub(crate) use stats::ReflectorCounters;
pub(crate) use stats::Synced;
pub use stats::{CatchUp, ReflectorStats, SyncedVersion};
pub use store::{ReflectorEvent, ReflectorStore};

/// A callback that receives every list/watch error (client-go's `WatchErrorHandler`).
pub(crate) type ErrorHook = Arc<dyn Fn(&Error) + Send + Sync>;

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
///    objects that were not listed are removed ([`ListEnd`](ReflectorEvent::ListEnd)).
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
/// 5. A **server that lies** is caught before the cache takes the lie. A change older than
///    a version the watch already reached (or whose version is no number, where the
///    server's are) ends the watch unapplied, and a relist follows; a bookmark with such a
///    version is reported and dropped, so the next watch resumes from the last good one. A
///    paged list whose `continue` token comes back fails with [`Error::ContinueLoop`] and
///    starts over after the backoff. An object larger than 64 MiB on the wire, or a watch
///    line that never ends, fails the list or watch instead of being buffered.
///
/// Every list/watch error goes to the [error hook](Reflector::on_watch_error), if any, and
/// to `tracing`.
pub struct Reflector<K, L, S> {
    lw: L,
    store: S,
    config: ReflectorConfig,
    transform: Option<TransformFn<K>>,
    error_hook: Option<ErrorHook>,
    synced: SyncedVersion,
    stats: ReflectorCounters,
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
            stats: ReflectorCounters::default(),
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

    /// Applies `transform` to every object before it is stored (to drop fields the
    /// program never reads, say).
    #[must_use]
    pub fn transform(mut self, transform: impl Fn(K) -> K + Send + Sync + 'static) -> Self {
        self.transform = Some(Arc::new(transform));
        self
    }

    /// Calls `hook` with every list/watch error.
    #[must_use]
    pub fn on_watch_error(mut self, hook: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        self.error_hook = Some(Arc::new(hook));
        self
    }

    /// Shares the last-synced resourceVersion with `version` (the informer's own).
    #[must_use]
    pub(crate) fn with_synced_version(mut self, version: SyncedVersion) -> Self {
        self.synced = version;
        self
    }

    /// Counts this reflector's lists, watches and errors into `stats` (the informer's own).
    #[must_use]
    pub(crate) fn with_stats(mut self, stats: ReflectorCounters) -> Self {
        self.stats = stats;
        self
    }

    /// What this reflector does, readable while it runs and after.
    pub fn stats(&self) -> LiveStats<ReflectorStats> {
        let counters = self.stats.clone();
        LiveStats::new(move || counters.snapshot())
    }

    /// Relists from a consistent read (`resourceVersion=""`) whenever `trigger` is notified
    /// while watching.
    #[must_use]
    pub fn relist_on(mut self, trigger: Arc<Notify>) -> Self {
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
        list_watch::{ListOptions, ListPage, WatchEvent, WatchOptions, WatchStream},
        store::{Store, Writer},
        testing::{FakeListWatch, decode_error, gone, status, transport_error},
    };
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::api::VersionMatch;
    use std::{
        sync::{
            Mutex,
            atomic::{AtomicUsize, Ordering},
        },
        time::Duration,
    };
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;

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
        let reflector = Reflector::new(fake.clone(), writer, config)
            .on_watch_error(move |e: &Error| hook_errors.lock().unwrap().push(e.to_string()));
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

    /// A store that records what the reflector hands it, as data.
    struct Recorded(tokio::sync::watch::Sender<Vec<String>>);

    impl ReflectorStore<ConfigMap> for Recorded {
        fn apply(&self, event: ReflectorEvent<ConfigMap>) {
            let line = match event {
                ReflectorEvent::ListStart => "list start".to_owned(),
                ReflectorEvent::Listed { key, .. } => format!("listed {key}"),
                ReflectorEvent::ListedUndecodable(key) => format!("undecodable {key}"),
                ReflectorEvent::Restored(objects) => format!("restored {}", objects.len()),
                ReflectorEvent::ListEnd(version) => format!("list end {version}"),
                ReflectorEvent::RestoreEnd(version) => format!("restore end {version}"),
                ReflectorEvent::CaughtUp(version) => format!("caught up {version}"),
                ReflectorEvent::Upsert { key, object, .. } => format!(
                    "upsert {key} {}",
                    object.metadata.resource_version.as_deref().unwrap_or("")
                ),
                ReflectorEvent::Delete { key, .. } => format!("delete {key}"),
                ReflectorEvent::Bookmark(version) => format!("bookmark {version}"),
            };
            self.0.send_modify(|lines| lines.push(line));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_reflector_reads_as_a_sequence_of_events() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        let listed_at = fake.add(cm("b"));
        let (lines, mut seen) = tokio::sync::watch::channel(Vec::new());
        let reflector = Reflector::new(fake.clone(), Recorded(lines), paged());
        let stop = CancellationToken::new();
        let task = tokio::spawn(reflector.run(stop.clone()));
        fake.wait_for_calls(|c| c.watches == 1).await;
        let created = fake.add(cm("c"));
        let updated = fake.update(cm("a"));
        fake.delete(Some("ns"), "b");
        fake.bookmark();
        let at = fake.resource_version();
        let expected = [
            "list start".to_owned(),
            "listed ns/a".to_owned(),
            "listed ns/b".to_owned(),
            format!("list end {listed_at}"),
            format!("upsert ns/c {created}"),
            format!("upsert ns/a {updated}"),
            "delete ns/b".to_owned(),
            format!("bookmark {at}"),
        ];
        let got = seen
            .wait_for(|lines| lines.len() >= expected.len())
            .await
            .unwrap()
            .clone();
        assert_eq!(got, expected);
        stop.cancel();
        task.await.unwrap();
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
            {
                let now = stats.read();
                (now.lists, now.watches, now.watch_restarts)
            },
            (1, 1, 0)
        );
        // A watch that ends resumes: one more watch, no list.
        fake.end_watches();
        fake.wait_for_calls(|c| c.watches == 2).await;
        assert_eq!(
            {
                let now = stats.read();
                (now.lists, now.watches, now.watch_restarts)
            },
            (1, 2, 1)
        );
        assert_eq!(stats.read().errors, 0);
        // A 410 on the watch relists: one error, one list, then a watch.
        fake.fail_next_watch(gone("configmaps", Verb::Watch));
        fake.end_watches();
        fake.wait_for_calls(|c| c.watches == 4).await;
        let now = stats.read();
        assert_eq!((now.errors, now.lists, now.watch_restarts), (1, 2, 3));
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
    async fn a_change_older_than_the_watch_is_never_applied_and_relists() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        let h = start(&fake, paged());
        fake.wait_for_calls(|c| c.watches == 1).await;
        let reached = fake.update(cm("a"));
        let mut stale = fake.get("ns/a").unwrap();
        stale.metadata.resource_version = Some("1".to_owned());
        stale.data = Some([("stale".to_owned(), "yes".to_owned())].into());
        // A repeat of the version reached is applied as the same state, without a relist.
        fake.inject(Ok(WatchEvent::Modified(fake.get("ns/a").unwrap())));
        fake.inject(Ok(WatchEvent::Modified(stale)));
        fake.wait_for_calls(|c| c.watches == 2).await;
        assert_eq!(fake.calls().lists, 2, "relisted");
        let relist = fake.list_requests().pop().unwrap();
        assert_eq!(relist.resource_version.as_deref(), Some(reached.as_str()));
        assert_eq!(relist.version_match, Some(VersionMatch::NotOlderThan));
        let a = h.store.get_by_key("ns/a").unwrap();
        assert_eq!(
            a.metadata.resource_version.as_deref(),
            Some(reached.as_str())
        );
        assert!(a.data.is_none(), "the stale state was never stored");
        assert_eq!(h.errors().len(), 1, "{:?}", h.errors());
        assert!(
            h.errors()[0].contains(&format!(
                "change of ns/a: resourceVersion 1 is older than {reached}"
            )),
            "{:?}",
            h.errors()
        );
        h.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_bookmark_the_watch_cannot_be_at_is_reported_and_ignored() {
        let fake = Fake::new("configmaps");
        fake.add(cm("a"));
        let h = start(&fake, paged());
        fake.wait_for_calls(|c| c.watches == 1).await;
        let reached = fake.update(cm("a"));
        for garbage in ["garbage", "1", "99999999999999999999999", ""] {
            fake.inject(Ok(WatchEvent::Bookmark {
                resource_version: garbage.to_owned(),
                initial_events_end: false,
            }));
        }
        fake.end_watches();
        fake.wait_for_calls(|c| c.watches == 2).await;
        assert_eq!(fake.calls().lists, 1, "no relist");
        assert_eq!(fake.watch_requests()[1].resource_version, reached);
        let errors = h.errors();
        assert_eq!(errors.len(), 3, "an empty version is no error: {errors:?}");
        assert!(
            errors[0].contains("\"garbage\" is not a version"),
            "{errors:?}"
        );
        assert!(errors[1].contains("1 is older than"), "{errors:?}");
        assert!(errors[2].contains("99999999999999999999999"), "{errors:?}");
        assert!(errors.iter().all(|e| e.contains("ignored")), "{errors:?}");
        h.stop().await;
    }

    /// Pages of one object each, whose tokens go `1`, `2`, `3` and back to `1`; counts the
    /// pages asked for.
    struct LoopingPages(Fake, Arc<AtomicUsize>);

    impl ListWatch<ConfigMap> for LoopingPages {
        fn resource(&self) -> String {
            self.0.resource()
        }

        async fn list(&self, options: &ListOptions) -> Result<ListPage<ConfigMap>, Error> {
            let page: u32 = options
                .continue_token
                .as_deref()
                .map_or(0, |t| t.parse().unwrap());
            self.1.fetch_add(1, Ordering::SeqCst);
            Ok(ListPage {
                items: vec![cm(&format!("p{page}"))],
                resource_version: "5".to_owned(),
                continue_token: Some((page % 3 + 1).to_string()),
                shard_selector: None,
            })
        }

        async fn watch(&self, options: &WatchOptions) -> Result<WatchStream<ConfigMap>, Error> {
            self.0.watch(options).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_continue_token_that_comes_back_ends_the_list_with_an_error() {
        let fake = Fake::new("configmaps");
        let pages = Arc::new(AtomicUsize::new(0));
        let writer = Writer::new();
        let store = writer.store();
        let (errors, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let looping = LoopingPages(fake.clone(), pages.clone());
        let reflector =
            Reflector::new(looping, writer, paged()).on_watch_error(move |e: &Error| {
                let _ = errors.send(e.to_string());
            });
        let version = reflector.synced_version();
        let stop = CancellationToken::new();
        let task = tokio::spawn(reflector.run(stop.clone()));
        for attempt in 1..=2 {
            let error = seen.recv().await.unwrap();
            assert!(
                error.contains("continue token \"1\" came back after 4 pages"),
                "{error}"
            );
            // Pages 0, 1, 2 and 3 each time, and never one more.
            assert_eq!(pages.load(Ordering::SeqCst), 4 * attempt);
        }
        assert_eq!(version.get(), None, "never synced");
        assert_eq!(store.len(), 4, "the objects of each page, once");
        assert_eq!(fake.calls().watches, 0);
        stop.cancel();
        task.await.unwrap();
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
