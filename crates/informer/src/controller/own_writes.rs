//! What a controller's client wrote, per cache, and the waits that hold its reads until
//! the cache has observed those writes.
//!
//! A write is kept as the resourceVersion the server answered with (for a delete that
//! answered with a status, the deleted object's UID). A cache has observed a version once
//! its informer's synced version has reached it: the reflector sets that version after
//! the store has taken the event, list or bookmark it came with, and a watch delivers a
//! resource's changes in resourceVersion order, so the cache then holds the write or a
//! later state. A deletion is observed once the cache no longer holds that UID under the
//! key. A record is dropped once a read has seen the cache pass it, and the records a read
//! never asks for again are swept whenever the table has doubled since the last sweep.

use std::{
    any::{Any, TypeId},
    cmp::Ordering,
    fmt,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering as AtomicOrdering},
    },
    time::Duration,
};

use dashmap::{DashMap, mapref::entry::Entry};
use kube_core::Resource;
#[cfg(feature = "prometheus")]
use std::sync::OnceLock;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[cfg(feature = "prometheus")]
use super::metrics::OwnWriteRecorder;
use crate::{informer::InformerHandle, key::ObjectKey, reflector::Synced};

/// Whether a controller's reads wait for its own writes (see
/// [`ControllerClient`](crate::ControllerClient)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnWrites {
    /// A read through the controller's client waits until the cache it reads has
    /// observed what the client wrote to the keys it reads, for at most `timeout` (the
    /// default, with 10 s).
    Awaited {
        /// How long a read waits before failing with
        /// [`ClientError::NotObserved`](crate::ClientError::NotObserved).
        timeout: Duration,
    },
    /// Writes are not recorded and reads never wait: the cache as it is.
    Ignored,
}

impl Default for OwnWrites {
    fn default() -> Self {
        Self::Awaited {
            timeout: Duration::from_secs(10),
        }
    }
}

/// What a controller's reads did about its own writes, from
/// [`Controller::own_write_stats`](crate::Controller::own_write_stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OwnWriteStats {
    /// Writes recorded (those whose type the controller has an informer of).
    pub recorded: u64,
    /// Reads that found their cache behind one of the controller's writes and waited,
    /// timeouts included.
    pub waited: u64,
    /// How long those reads waited in all.
    pub waited_for: Duration,
    /// Reads that gave up waiting ([`ClientError::NotObserved`](crate::ClientError::NotObserved)).
    pub timed_out: u64,
}

/// The counters behind [`OwnWriteStats`].
#[derive(Debug, Default)]
struct OwnWriteCounters {
    recorded: AtomicU64,
    waited: AtomicU64,
    waited_nanos: AtomicU64,
    timed_out: AtomicU64,
}

impl OwnWriteCounters {
    fn snapshot(&self) -> OwnWriteStats {
        OwnWriteStats {
            recorded: self.recorded.load(AtomicOrdering::Relaxed),
            waited: self.waited.load(AtomicOrdering::Relaxed),
            waited_for: Duration::from_nanos(self.waited_nanos.load(AtomicOrdering::Relaxed)),
            timed_out: self.timed_out.load(AtomicOrdering::Relaxed),
        }
    }
}

/// A resourceVersion that compares as the integer it spells (apimachinery's
/// `CompareResourceVersion`): decimal digits without a leading zero, of any length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ResourceVersion(String);

impl ResourceVersion {
    /// `None` for a version that is not such an integer (a server with other storage):
    /// its writes cannot be ordered, so they are not waited for.
    pub(super) fn parse(version: &str) -> Option<Self> {
        let canonical = match version.as_bytes() {
            [b'0'] => true,
            [first, rest @ ..] => {
                (b'1'..=b'9').contains(first) && rest.iter().all(u8::is_ascii_digit)
            }
            [] => false,
        };
        canonical.then(|| Self(version.to_owned()))
    }

    fn as_str(&self) -> &str {
        &self.0
    }
}

impl Ord for ResourceVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.cmp(&other.0))
    }
}

impl PartialOrd for ResourceVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// What the client last wrote to one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Written {
    /// The object as of this version (a create, update, patch or apply; a delete that
    /// left the object in place with its deletion timestamp set).
    Version(ResourceVersion),
    /// The object with this UID was deleted.
    Deleted {
        /// Its UID.
        uid: String,
    },
}

impl Written {
    /// One record for two writes to a key: the later version, or whichever came last
    /// when one is a deletion.
    fn merge(self, later: Written) -> Written {
        match (self, later) {
            (Written::Version(a), Written::Version(b)) => Written::Version(a.max(b)),
            (_, later) => later,
        }
    }
}

impl fmt::Display for Written {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Written::Version(version) => write!(f, "write at resourceVersion {}", version.as_str()),
            Written::Deleted { uid } => write!(f, "deletion of uid {uid}"),
        }
    }
}

/// Why a read's wait ended without the cache having observed the writes.
#[derive(Debug)]
pub(super) enum NotObserved {
    /// The wait's bound passed; the first write not yet observed.
    TimedOut {
        key: ObjectKey,
        written: Written,
        waited: Duration,
    },
    /// The reconcile's token was cancelled.
    Cancelled,
    /// The informer stopped.
    Stopped,
}

/// One informer of the controller and the writes its reads wait for.
pub(super) struct Cache<C> {
    handle: InformerHandle<C>,
    written: DashMap<ObjectKey, Written>,
    /// Sweep the table when it grows past this.
    sweep_at: AtomicUsize,
}

const MIN_SWEEP: usize = 64;

impl<C: Resource + Send + Sync + 'static> Cache<C> {
    fn new(handle: InformerHandle<C>) -> Self {
        Self {
            handle,
            written: DashMap::new(),
            sweep_at: AtomicUsize::new(MIN_SWEEP),
        }
    }

    pub(super) fn handle(&self) -> &InformerHandle<C> {
        &self.handle
    }

    /// Records a write to `key`.
    pub(super) fn record(&self, key: ObjectKey, written: Written) {
        match self.written.entry(key) {
            Entry::Occupied(mut recorded) => {
                let merged = recorded.get().clone().merge(written);
                recorded.insert(merged);
            }
            Entry::Vacant(vacant) => {
                vacant.insert(written);
            }
        }
        if self.written.len() >= self.sweep_at.load(AtomicOrdering::Relaxed) {
            self.sweep();
        }
    }

    /// Drops the records the cache has passed; the next sweep comes when the table has
    /// doubled, so recording stays amortised O(1).
    fn sweep(&self) {
        let synced = self.handle.watch_synced_version().borrow().clone();
        self.written
            .retain(|key, written| !self.observed(key, written, &synced));
        let next = (self.written.len() * 2).max(MIN_SWEEP);
        self.sweep_at.store(next, AtomicOrdering::Relaxed);
    }

    /// Whether the cache, at `synced`, has observed `written` to `key`.
    fn observed(&self, key: &ObjectKey, written: &Written, synced: &Synced) -> bool {
        match written {
            Written::Version(version) => synced
                .resource_version
                .as_deref()
                .and_then(ResourceVersion::parse)
                .is_some_and(|seen| seen >= *version),
            Written::Deleted { uid } => self
                .handle
                .store()
                .get_by_key(key)
                .is_none_or(|obj| obj.meta().uid.as_deref() != Some(uid.as_str())),
        }
    }

    /// The records a read of `key` (or, with `None`, a read of many keys) waits for.
    fn pending(&self, key: Option<&ObjectKey>) -> Vec<(ObjectKey, Written)> {
        match key {
            Some(key) => self
                .written
                .get(key)
                .map(|w| vec![(key.clone(), w.value().clone())])
                .unwrap_or_default(),
            None => self
                .written
                .iter()
                .map(|e| (e.key().clone(), e.value().clone()))
                .collect(),
        }
    }

    /// Waits until the cache has observed what was recorded for `key` (for every key with
    /// `None`), for at most `timeout`, or until `cancel` fires. Returns how long it waited
    /// (zero when the cache had observed it all already).
    pub(super) async fn observe(
        &self,
        key: Option<&ObjectKey>,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<Duration, NotObserved> {
        let pending = self.pending(key);
        if pending.is_empty() {
            return Ok(Duration::ZERO);
        }
        let all_observed = |synced: &Synced| {
            pending
                .iter()
                .all(|(key, written)| self.observed(key, written, synced))
        };
        let mut versions = self.handle.watch_synced_version();
        let now = versions.borrow_and_update().clone();
        if all_observed(&now) {
            self.forget(&pending);
            return Ok(Duration::ZERO);
        }
        if now.stopped {
            return Err(NotObserved::Stopped);
        }
        let started = Instant::now();
        let waited = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(NotObserved::Cancelled),
            waited = tokio::time::timeout(timeout, versions.wait_for(|s| s.stopped || all_observed(s))) => {
                waited.map(|seen| seen.map(|synced| synced.clone()))
            }
        };
        match waited {
            Ok(Ok(synced)) if !synced.stopped || all_observed(&synced) => {
                self.forget(&pending);
                Ok(started.elapsed())
            }
            Ok(_) => Err(NotObserved::Stopped),
            Err(_) => {
                let synced = versions.borrow().clone();
                let behind = pending
                    .iter()
                    .find(|(key, written)| !self.observed(key, written, &synced));
                match behind {
                    Some((key, written)) => Err(NotObserved::TimedOut {
                        key: key.clone(),
                        written: written.clone(),
                        waited: started.elapsed(),
                    }),
                    // Observed in the instant the bound passed.
                    None => {
                        self.forget(&pending);
                        Ok(started.elapsed())
                    }
                }
            }
        }
    }

    /// Drops the records a wait has seen observed, unless a later write replaced them.
    fn forget(&self, observed: &[(ObjectKey, Written)]) {
        for (key, written) in observed {
            self.written.remove_if(key, |_, now| now == written);
        }
    }
}

/// The controller's informers by type (the first of each type: the primary, then the
/// sources in the order they were added), with its own-writes mode and counters.
pub(super) struct Caches {
    by_type: DashMap<TypeId, Arc<dyn Any + Send + Sync>>,
    mode: Mutex<OwnWrites>,
    stats: OwnWriteCounters,
    /// Cancelled when the controller stops: ends the waits of its workers and clients.
    stopped: CancellationToken,
    #[cfg(feature = "prometheus")]
    recorder: OnceLock<OwnWriteRecorder>,
}

impl fmt::Debug for Caches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Caches")
            .field("types", &self.by_type.len())
            .field("mode", &self.mode())
            .finish_non_exhaustive()
    }
}

impl Default for Caches {
    fn default() -> Self {
        Self {
            by_type: DashMap::new(),
            mode: Mutex::new(OwnWrites::default()),
            stats: OwnWriteCounters::default(),
            stopped: CancellationToken::new(),
            #[cfg(feature = "prometheus")]
            recorder: OnceLock::new(),
        }
    }
}

impl Caches {
    /// Adds `handle` as the cache of `C`, unless `C` has one already.
    pub(super) fn register<C: Resource + Send + Sync + 'static>(&self, handle: InformerHandle<C>) {
        self.by_type
            .entry(TypeId::of::<C>())
            .or_insert_with(|| Arc::new(Cache::new(handle)));
    }

    /// The cache of `C`, if the controller has an informer of it.
    pub(super) fn cache<C: Resource + Send + Sync + 'static>(&self) -> Option<Arc<Cache<C>>> {
        let cache = self.by_type.get(&TypeId::of::<C>())?.value().clone();
        cache.downcast::<Cache<C>>().ok()
    }

    pub(super) fn mode(&self) -> OwnWrites {
        *self.mode.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn set_mode(&self, mode: OwnWrites) {
        *self.mode.lock().unwrap_or_else(PoisonError::into_inner) = mode;
    }

    /// Ends every wait for the cache to observe a write, now and from now on: the
    /// controller has stopped.
    pub(super) fn stop(&self) {
        self.stopped.cancel();
    }

    pub(super) fn stats(&self) -> OwnWriteStats {
        self.stats.snapshot()
    }

    #[cfg(feature = "prometheus")]
    pub(super) fn set_recorder(&self, recorder: OwnWriteRecorder) {
        // A controller runs once; a second run keeps the first one's handles.
        let _ = self.recorder.set(recorder);
    }

    /// Waits, as the [mode](OwnWrites) says, until `cache` has observed this controller's
    /// writes to `key` (to every key with `None`), counting the wait. Both the client's
    /// reads and a worker, before it hands a key's object to the reconcile, wait here: a
    /// reconcile the controller's own write triggered again (through a child it deleted,
    /// say) then sees that write, never the state before it. The wait ends when the
    /// controller [stops](Self::stop).
    pub(super) async fn observe<C: Resource + Send + Sync + 'static>(
        &self,
        cache: &Cache<C>,
        key: Option<&ObjectKey>,
    ) -> Result<(), NotObserved> {
        let OwnWrites::Awaited { timeout } = self.mode() else {
            return Ok(());
        };
        match cache.observe(key, timeout, &self.stopped).await {
            Ok(waited) => {
                if !waited.is_zero() {
                    self.count_wait(waited, false);
                }
                Ok(())
            }
            Err(not_observed) => {
                if let NotObserved::TimedOut { waited, .. } = &not_observed {
                    self.count_wait(*waited, true);
                }
                Err(not_observed)
            }
        }
    }

    pub(super) fn count_recorded(&self) {
        self.stats.recorded.fetch_add(1, AtomicOrdering::Relaxed);
    }

    /// Counts a read that waited `took`, and whether it gave up.
    fn count_wait(&self, took: Duration, timed_out: bool) {
        let stats = &self.stats;
        stats.waited.fetch_add(1, AtomicOrdering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        stats.waited_nanos.fetch_add(nanos, AtomicOrdering::Relaxed);
        if timed_out {
            stats.timed_out.fetch_add(1, AtomicOrdering::Relaxed);
        }
        #[cfg(feature = "prometheus")]
        if let Some(recorder) = self.recorder.get() {
            recorder.waited(took, timed_out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        informer::{RunningInformer, SharedInformer},
        testing::FakeListWatch,
    };
    use futures::FutureExt;
    use k8s_openapi::api::core::v1::ConfigMap;

    type Fake = FakeListWatch<ConfigMap>;

    fn cm(name: &str, value: &str) -> ConfigMap {
        let mut obj = Fake::object(Some("ns"), name);
        obj.metadata.uid = Some(format!("uid-{name}"));
        obj.data = Some([("v".to_owned(), value.to_owned())].into());
        obj
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(Some("ns"), name)
    }

    fn cached_value(cache: &Cache<ConfigMap>, name: &str) -> Option<String> {
        let obj = cache.handle.store().get_by_key(key(name))?;
        obj.data.as_ref()?.get("v").cloned()
    }

    /// An informer over a fake holding `a`, synced, whose watch is open; the fake then
    /// holds back its events until `set_broadcast(true)`.
    async fn synced_cache() -> (Fake, Cache<ConfigMap>, RunningInformer<ConfigMap>) {
        let fake = Fake::new("configmaps");
        fake.add(cm("a", "0"));
        let informer = SharedInformer::builder(fake.clone()).paged_list().build();
        let handle = informer.handle();
        let running = informer.spawn(CancellationToken::new());
        handle.wait_synced().await;
        fake.wait_for_calls(|c| c.watches == 1).await;
        fake.set_broadcast(false);
        (fake, Cache::new(handle), running)
    }

    const PATIENCE: Duration = Duration::from_secs(10);

    /// Records the write that answered with `resource_version`, as the client does.
    fn recorded(cache: &Cache<ConfigMap>, name: &str, resource_version: &str) {
        let version = ResourceVersion::parse(resource_version).unwrap();
        cache.record(key(name), Written::Version(version));
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_waits_for_the_event_of_its_write_and_then_forgets_it() {
        let (fake, cache, _stop) = synced_cache().await;
        let written = fake.update(cm("a", "1"));
        recorded(&cache, "a", &written);
        let cancel = CancellationToken::new();
        let a = key("a");
        let mut read = Box::pin(cache.observe(Some(&a), PATIENCE, &cancel));
        assert!(
            (&mut read).now_or_never().is_none(),
            "the cache has not seen the write yet"
        );
        assert_eq!(cached_value(&cache, "a").as_deref(), Some("0"));

        // Someone else's later write releases it as well as the write itself would.
        fake.set_broadcast(true);
        fake.update(cm("a", "2"));
        read.await.expect("released by the later event");
        assert_eq!(cached_value(&cache, "a").as_deref(), Some("2"));
        assert!(cache.written.is_empty(), "an observed write is forgotten");
        // Nothing left to wait for: a read of another key does not wait either.
        let waited = cache
            .observe(Some(&key("b")), PATIENCE, &cancel)
            .await
            .unwrap();
        assert_eq!(waited, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_relist_that_passes_the_write_releases_a_list() {
        let (fake, cache, _stop) = synced_cache().await;
        let written = fake.add(cm("b", "1"));
        recorded(&cache, "b", &written);
        let cancel = CancellationToken::new();
        let mut read = Box::pin(cache.observe(None, PATIENCE, &cancel));
        assert!((&mut read).now_or_never().is_none());

        // The watch's history is gone: the reflector relists, and the list carries it.
        fake.compact();
        fake.end_watches();
        read.await.expect("released by the relist");
        assert_eq!(cached_value(&cache, "b").as_deref(), Some("1"));
        assert!(fake.calls().lists >= 2, "{:?}", fake.calls());
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_gives_up_after_its_timeout_and_names_the_write() {
        let (fake, cache, _stop) = synced_cache().await;
        let written = fake.update(cm("a", "1"));
        recorded(&cache, "a", &written);
        let outcome = cache
            .observe(
                Some(&key("a")),
                Duration::from_secs(2),
                &CancellationToken::new(),
            )
            .await;
        let Err(NotObserved::TimedOut {
            key: k,
            written: w,
            waited,
        }) = outcome
        else {
            panic!("expected a timeout, got {outcome:?}");
        };
        assert_eq!(k, key("a"));
        assert_eq!(w.to_string(), format!("write at resourceVersion {written}"));
        assert!(waited >= Duration::from_secs(2), "{waited:?}");
        assert_eq!(cache.written.len(), 1, "a write not observed is kept");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_reconcile_and_a_stopped_informer_end_the_wait() {
        let (fake, cache, running) = synced_cache().await;
        let written = fake.update(cm("a", "1"));
        recorded(&cache, "a", &written);
        let cancel = CancellationToken::new();
        let a = key("a");
        let mut read = Box::pin(cache.observe(Some(&a), PATIENCE, &cancel));
        assert!((&mut read).now_or_never().is_none());
        cancel.cancel();
        assert!(matches!(read.await, Err(NotObserved::Cancelled)));

        let cancel = CancellationToken::new();
        let a = key("a");
        let mut read = Box::pin(cache.observe(Some(&a), PATIENCE, &cancel));
        assert!((&mut read).now_or_never().is_none());
        let (outcome, ()) = tokio::join!(read, running.stop());
        assert!(matches!(outcome, Err(NotObserved::Stopped)), "{outcome:?}");
        // And a read after the stop fails at once.
        let again = cache.observe(Some(&key("a")), PATIENCE, &cancel).await;
        assert!(matches!(again, Err(NotObserved::Stopped)), "{again:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_deletion_is_observed_when_its_uid_leaves_the_cache() {
        let (fake, cache, _stop) = synced_cache().await;
        fake.delete(Some("ns"), "a");
        cache.record(
            key("a"),
            Written::Deleted {
                uid: "uid-a".into(),
            },
        );
        let cancel = CancellationToken::new();
        let a = key("a");
        let mut read = Box::pin(cache.observe(Some(&a), PATIENCE, &cancel));
        assert!(
            (&mut read).now_or_never().is_none(),
            "the cache still holds uid-a"
        );
        // The watch resumes from its last version and replays the deletion.
        fake.set_broadcast(true);
        fake.end_watches();
        read.await.expect("released once the deletion arrived");
        assert!(cache.handle.store().get_by_key(key("a")).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn records_the_cache_has_passed_are_swept_as_the_table_grows() {
        let (fake, cache, _stop) = synced_cache().await;
        fake.set_broadcast(true);
        let mut last = String::new();
        for i in 0..MIN_SWEEP {
            last = fake.add(cm(&format!("o{i}"), "1"));
        }
        // Wait for the cache to pass the last write (a record read back releases at once).
        cache.record(
            key("probe"),
            Written::Version(ResourceVersion::parse(&last).unwrap()),
        );
        cache
            .observe(Some(&key("probe")), PATIENCE, &CancellationToken::new())
            .await
            .unwrap();
        for i in 0..MIN_SWEEP {
            let rv = fake
                .get(&format!("ns/o{i}"))
                .unwrap()
                .metadata
                .resource_version
                .unwrap();
            cache.record(
                key(&format!("o{i}")),
                Written::Version(ResourceVersion::parse(&rv).unwrap()),
            );
        }
        assert!(
            cache.written.len() < MIN_SWEEP,
            "swept at {MIN_SWEEP}: {}",
            cache.written.len()
        );
    }

    fn rv(v: &str) -> ResourceVersion {
        ResourceVersion::parse(v).unwrap()
    }

    #[test]
    fn resource_versions_compare_as_integers() {
        assert!(rv("10") > rv("9"));
        assert!(rv("100") > rv("99"));
        assert!(rv("123") < rv("124"));
        assert_eq!(rv("7").cmp(&rv("7")), Ordering::Equal);
        assert!(rv("18446744073709551616") > rv("18446744073709551615"));
        for bad in ["", "01", "-1", "1a", " 1", "+1"] {
            assert_eq!(ResourceVersion::parse(bad), None, "{bad:?}");
        }
        assert_eq!(ResourceVersion::parse("0"), Some(rv("0")));
    }

    #[test]
    fn records_keep_the_later_write() {
        let v = |s: &str| Written::Version(rv(s));
        let gone = || Written::Deleted { uid: "u".into() };
        assert_eq!(v("9").merge(v("10")), v("10"));
        assert_eq!(v("10").merge(v("9")), v("10"));
        assert_eq!(v("10").merge(gone()), gone());
        assert_eq!(gone().merge(v("3")), v("3"));
    }
}
