//! An in-memory [`ListWatch`] for tests: a tiny API server for one resource.
//!
//! [`FakeListWatch`] keeps objects, hands out increasing resourceVersions, serves paged lists
//! (honouring `limit` and `continue`), and watches that replay history from a
//! resourceVersion and then stream live changes. Tests script failures (`fail_next_list`,
//! `fail_next_continue`, `fail_next_watch`), compaction (`compact`: older resourceVersions
//! get 410), raw events (`inject`: bookmarks, `ERROR` statuses, decode errors), and the end
//! or silence of watches, and await the calls the reflector makes (`wait_for_calls`) instead
//! of sleeping.
//!
//! It is public behind the `testing` feature so that controller tests (and this crate's
//! doctests) can drive a [`SharedInformer`](crate::SharedInformer) without an API server.
//!
//! ```
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_informer::{SharedInformer, testing::FakeListWatch};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let fake = FakeListWatch::<ConfigMap>::new("configmaps");
//! fake.add(FakeListWatch::<ConfigMap>::object(Some("default"), "a"));
//! let informer = SharedInformer::new(fake.clone()).spawn(CancellationToken::new());
//! informer.wait_synced().await;
//! assert!(informer.store().get_by_key("default/a").is_some());
//! informer.stop().await;
//! # }
//! ```

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use futures::StreamExt;
use kube_core::{Resource, Status};
use tokio::sync::{mpsc, watch};

use kube_client::api::VersionMatch;

use crate::{
    error::{Error, Verb},
    key::ObjectKey,
    list_watch::{
        Change as ListChange, ListItem, ListOptions, ListPage, ListStream, ListWatch, Undecodable,
        WatchEvent, WatchOptions, WatchStream,
    },
};

/// A store's writer, for filling a [`Store`](crate::Store) by hand in tests. An informer's
/// own writer is never handed out.
pub use crate::store::writer::Writer as StoreWriter;

/// How many list and watch calls a [`FakeListWatch`] has served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// List calls (each page counts).
    pub lists: usize,
    /// Watch calls.
    pub watches: usize,
}

#[derive(Clone, Copy)]
enum Change {
    Added,
    Modified,
    Deleted,
}

type Sender<K> = mpsc::UnboundedSender<Result<WatchEvent<K>, Error>>;

/// An in-memory API server for one resource. Cheap to clone (shared state).
pub struct FakeListWatch<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for FakeListWatch<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<K> {
    resource: String,
    state: Mutex<State<K>>,
    calls: watch::Sender<CallCounts>,
}

struct State<K> {
    objects: BTreeMap<ObjectKey, K>,
    rv: u64,
    compacted: u64,
    history: Vec<(u64, WatchEvent<K>)>,
    broadcast: bool,
    list_failures: VecDeque<Error>,
    continue_failures: VecDeque<Error>,
    watch_failures: VecDeque<Error>,
    snapshots: HashMap<String, (String, Vec<K>)>,
    next_token: u64,
    watchers: Vec<Sender<K>>,
    list_requests: Vec<ListOptions>,
    watch_requests: Vec<WatchOptions>,
    streaming_lists: bool,
    cut_initial_events: VecDeque<usize>,
    /// Keys whose objects are served as [`ListItem::Undecodable`] and
    /// [`WatchEvent::Undecodable`], as a server does for objects the client's type rejects.
    undecodable: HashSet<ObjectKey>,
    /// Every list and watch answers 404, as for a CRD deleted.
    missing: bool,
}

/// Why a [marked](FakeListWatch::mark_undecodable) object does not decode.
const UNDECODABLE: &str = "marked undecodable by the test";

/// A `Status` with this code, reason and message.
pub fn status(code: u16, reason: &str, message: &str) -> Box<Status> {
    Box::new(Status {
        status: None,
        code,
        message: message.to_owned(),
        metadata: None,
        reason: reason.to_owned(),
        details: None,
    })
}

/// A 404 Not Found error for `resource`, as the API server answers a list or watch of a
/// resource it does not serve (a CRD deleted or not installed).
pub fn not_found(resource: &str, verb: Verb) -> Error {
    Error::from_status(
        status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
        verb,
        resource,
        None,
    )
}

/// A 410 Gone error for `resource`, as the API server reports an expired resourceVersion.
pub fn gone(resource: &str, verb: Verb) -> Error {
    Error::from_status(
        status(410, "Expired", "too old resource version"),
        verb,
        resource,
        None,
    )
}

/// A transport error (connection reset) for `resource`.
pub fn transport_error(resource: &str, verb: Verb) -> Error {
    Error::Transport {
        resource: resource.to_owned(),
        verb,
        source: Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        )),
    }
}

/// A decode error, as an undecodable watch event produces.
pub fn decode_error(resource: &str, verb: Verb) -> Error {
    let source = serde_json::from_str::<u32>("{\"kind\":").unwrap_err();
    Error::Decode {
        resource: resource.to_owned(),
        verb,
        source: Box::new(source),
    }
}

impl<K: Resource + Default> FakeListWatch<K> {
    /// A fresh object with this namespace and name (other fields default).
    pub fn object(namespace: Option<&str>, name: &str) -> K {
        let mut obj = K::default();
        obj.meta_mut().name = Some(name.to_owned());
        obj.meta_mut().namespace = namespace.map(str::to_owned);
        obj
    }
}

impl<K: Resource + Clone + Send + Sync + 'static> FakeListWatch<K> {
    /// An empty fake serving `resource` (used in error messages).
    pub fn new(resource: &str) -> Self {
        Self {
            shared: Arc::new(Shared {
                resource: resource.to_owned(),
                state: Mutex::new(State {
                    objects: BTreeMap::new(),
                    rv: 1,
                    compacted: 0,
                    history: Vec::new(),
                    broadcast: true,
                    list_failures: VecDeque::new(),
                    continue_failures: VecDeque::new(),
                    watch_failures: VecDeque::new(),
                    snapshots: HashMap::new(),
                    next_token: 0,
                    watchers: Vec::new(),
                    list_requests: Vec::new(),
                    watch_requests: Vec::new(),
                    streaming_lists: true,
                    cut_initial_events: VecDeque::new(),
                    undecodable: HashSet::new(),
                    missing: false,
                }),
                calls: watch::channel(CallCounts::default()).0,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<K>> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn change(&self, mut obj: K, kind: Change) -> String {
        let key = ObjectKey::from_object(&obj).expect("fake objects need a name");
        let mut st = self.state();
        st.rv += 1;
        let rv = st.rv.to_string();
        obj.meta_mut().resource_version = Some(rv.clone());
        let undecodable = st.undecodable.contains(&key).then(|| Undecodable {
            key: key.clone(),
            resource_version: Some(rv.clone()),
            reason: UNDECODABLE.to_owned(),
        });
        let event = match kind {
            Change::Deleted => {
                st.objects.remove(&key);
                WatchEvent::Deleted(obj)
            }
            Change::Added => {
                st.objects.insert(key, obj.clone());
                WatchEvent::Added(obj)
            }
            Change::Modified => {
                st.objects.insert(key, obj.clone());
                WatchEvent::Modified(obj)
            }
        };
        let event = match (undecodable, kind) {
            (None, _) => event,
            (Some(object), kind) => WatchEvent::Undecodable {
                change: match kind {
                    Change::Added => ListChange::Added,
                    Change::Modified => ListChange::Modified,
                    Change::Deleted => ListChange::Deleted,
                },
                object,
            },
        };
        let n = st.rv;
        st.history.push((n, event.clone()));
        if st.broadcast {
            st.watchers.retain(|w| w.send(Ok(event.clone())).is_ok());
        }
        rv
    }

    /// From now on, serves the object under `key` as one that does not decode (in lists and
    /// in the events of its later changes), until [`mark_decodable`](Self::mark_decodable).
    pub fn mark_undecodable(&self, key: &str) {
        self.state().undecodable.insert(ObjectKey::from(key));
    }

    /// Serves the object under `key` normally again.
    pub fn mark_decodable(&self, key: &str) {
        self.state().undecodable.remove(key);
    }

    /// Creates or replaces an object (an `ADDED` event); returns its new resourceVersion.
    pub fn add(&self, obj: K) -> String {
        self.change(obj, Change::Added)
    }

    /// Changes an object (a `MODIFIED` event); returns its new resourceVersion.
    pub fn update(&self, obj: K) -> String {
        self.change(obj, Change::Modified)
    }

    /// Deletes an object (a `DELETED` event); returns the deleted object.
    pub fn delete(&self, namespace: Option<&str>, name: &str) -> Option<K> {
        let key = ObjectKey::new(namespace, name);
        let obj = self.state().objects.get(&key).cloned()?;
        self.change(obj.clone(), Change::Deleted);
        Some(obj)
    }

    /// The stored object under `key`.
    pub fn get(&self, key: &str) -> Option<K> {
        self.state().objects.get(key).cloned()
    }

    /// The current resourceVersion of the collection.
    pub fn resource_version(&self) -> String {
        self.state().rv.to_string()
    }

    /// When `false`, changes are not sent to open watches (as if the events were lost); they
    /// are still in the history unless [`compact`](Self::compact) drops them.
    pub fn set_broadcast(&self, on: bool) {
        self.state().broadcast = on;
    }

    /// Forgets the history: watches and `Exact` lists from an older resourceVersion get 410.
    pub fn compact(&self) {
        let mut st = self.state();
        st.compacted = st.rv;
        st.history.clear();
    }

    /// Sends a raw item (event or error) to every open watch.
    pub fn inject(&self, item: Result<WatchEvent<K>, Error>) {
        let mut st = self.state();
        let mut item = Some(item);
        let last = st.watchers.len();
        let mut keep = Vec::new();
        for (i, w) in std::mem::take(&mut st.watchers).into_iter().enumerate() {
            let it = if i + 1 == last {
                item.take().expect("item")
            } else {
                clone_item(item.as_ref().expect("item"))
            };
            if w.send(it).is_ok() {
                keep.push(w);
            }
        }
        st.watchers = keep;
    }

    /// Sends a `BOOKMARK` at the current resourceVersion to every open watch.
    pub fn bookmark(&self) {
        let rv = self.resource_version();
        self.inject(Ok(WatchEvent::Bookmark {
            resource_version: rv,
            initial_events_end: false,
        }));
    }

    /// When `false`, watches ignore `sendInitialEvents`, as API servers before 1.27 (or with
    /// the `WatchList` feature off) do: no initial events, no `initial_events_end` bookmark.
    pub fn set_streaming_lists(&self, on: bool) {
        self.state().streaming_lists = on;
    }

    /// The next streaming list sends only its first `after` initial events and then ends,
    /// as a connection torn in the middle of the initial state does.
    pub fn cut_next_initial_events(&self, after: usize) {
        self.state().cut_initial_events.push_back(after);
    }

    /// With `true`, the resource is no longer served, as when its CRD is deleted: open
    /// watches end and every list and watch answers 404 ([`not_found`]) until called with
    /// `false`. The objects stay (delete them first to mimic a CRD's deletion).
    pub fn set_resource_missing(&self, missing: bool) {
        let mut st = self.state();
        st.missing = missing;
        if missing {
            st.watchers.clear();
        }
    }

    /// Ends every open watch normally (as the server's `timeoutSeconds` does).
    pub fn end_watches(&self) {
        self.state().watchers.clear();
    }

    /// Number of watches still open.
    pub fn open_watches(&self) -> usize {
        let mut st = self.state();
        st.watchers.retain(|w| !w.is_closed());
        st.watchers.len()
    }

    /// The next list call without a continue token fails with `err`.
    pub fn fail_next_list(&self, err: Error) {
        self.state().list_failures.push_back(err);
    }

    /// The next list call *with* a continue token (a later page) fails with `err`.
    pub fn fail_next_continue(&self, err: Error) {
        self.state().continue_failures.push_back(err);
    }

    /// The next watch call fails with `err`.
    pub fn fail_next_watch(&self, err: Error) {
        self.state().watch_failures.push_back(err);
    }

    /// Every list request served so far.
    pub fn list_requests(&self) -> Vec<ListOptions> {
        self.state().list_requests.clone()
    }

    /// Every watch request served so far.
    pub fn watch_requests(&self) -> Vec<WatchOptions> {
        self.state().watch_requests.clone()
    }

    /// Call counts so far.
    pub fn calls(&self) -> CallCounts {
        *self.shared.calls.borrow()
    }

    /// Waits until the call counts satisfy `pred`.
    pub async fn wait_for_calls(&self, pred: impl Fn(&CallCounts) -> bool) -> CallCounts {
        let mut rx = self.shared.calls.subscribe();
        *rx.wait_for(|c| pred(c))
            .await
            .expect("sender lives in self")
    }

    fn count(&self, f: impl FnOnce(&mut CallCounts)) {
        self.shared.calls.send_modify(f);
    }
}

fn clone_item<K: Clone>(item: &Result<WatchEvent<K>, Error>) -> Result<WatchEvent<K>, Error> {
    match item {
        Ok(e) => Ok(e.clone()),
        Err(e) => Err(Error::Transport {
            resource: String::new(),
            verb: Verb::Watch,
            source: e.to_string().into(),
        }),
    }
}

fn parse_rv(rv: Option<&str>) -> Option<u64> {
    rv.filter(|r| !r.is_empty() && *r != "0")
        .and_then(|r| r.parse().ok())
}

impl<K: Resource + Clone + Send + Sync + 'static> ListWatch<K> for FakeListWatch<K> {
    fn resource(&self) -> String {
        self.shared.resource.clone()
    }

    async fn list(&self, options: &ListOptions) -> Result<ListPage<K>, Error> {
        let result = {
            let mut st = self.state();
            st.list_requests.push(options.clone());
            if st.missing {
                Err(not_found(&self.shared.resource, Verb::List))
            } else {
                self.list_locked(&mut st, options)
            }
        };
        self.count(|c| c.lists += 1);
        result
    }

    async fn list_stream(&self, options: &ListOptions) -> Result<ListStream<K>, Error>
    where
        K: Send + 'static,
    {
        let page = self.list(options).await?;
        let undecodable = self.state().undecodable.clone();
        let items =
            page.items
                .into_iter()
                .map(move |object| match ObjectKey::from_object(&object) {
                    Ok(key) if undecodable.contains(&key) => ListItem::Undecodable(Undecodable {
                        resource_version: object.meta().resource_version.clone(),
                        key,
                        reason: UNDECODABLE.to_owned(),
                    }),
                    _ => ListItem::Object(object),
                });
        let end = ListItem::End {
            resource_version: page.resource_version,
            continue_token: page.continue_token,
            shard_selector: page.shard_selector,
        };
        Ok(futures::stream::iter(items.chain([end]).map(Ok)).boxed())
    }

    async fn watch(&self, options: &WatchOptions) -> Result<WatchStream<K>, Error> {
        let result = {
            let mut st = self.state();
            st.watch_requests.push(options.clone());
            if st.missing {
                Err(not_found(&self.shared.resource, Verb::Watch))
            } else if let Some(err) = st.watch_failures.pop_front() {
                Err(err)
            } else {
                let (tx, mut rx) = mpsc::unbounded_channel();
                let from = parse_rv(Some(&options.resource_version)).unwrap_or(st.rv);
                if options.send_initial_events && st.streaming_lists {
                    // Not older than `from`: the current state always is.
                    let cut = st.cut_initial_events.pop_front();
                    for obj in st.objects.values().take(cut.unwrap_or(usize::MAX)) {
                        let _ = tx.send(Ok(WatchEvent::Added(obj.clone())));
                    }
                    if cut.is_none() {
                        let _ = tx.send(Ok(WatchEvent::Bookmark {
                            resource_version: st.rv.to_string(),
                            initial_events_end: true,
                        }));
                        st.watchers.push(tx);
                    }
                } else if from < st.compacted {
                    let _ = tx.send(Ok(WatchEvent::Error(status(
                        410,
                        "Expired",
                        &format!("too old resource version: {from} ({})", st.compacted),
                    ))));
                } else {
                    for (rv, event) in &st.history {
                        if *rv > from {
                            let _ = tx.send(Ok(event.clone()));
                        }
                    }
                    st.watchers.push(tx);
                }
                let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
                Ok(stream.boxed())
            }
        };
        self.count(|c| c.watches += 1);
        result
    }
}

impl<K: Resource + Clone + Send + Sync + 'static> FakeListWatch<K> {
    fn list_locked(&self, st: &mut State<K>, options: &ListOptions) -> Result<ListPage<K>, Error> {
        let (rv, mut items) = if let Some(token) = &options.continue_token {
            if let Some(err) = st.continue_failures.pop_front() {
                return Err(err);
            }
            st.snapshots
                .remove(token)
                .ok_or_else(|| gone(&self.shared.resource, Verb::List))?
        } else {
            if let Some(err) = st.list_failures.pop_front() {
                return Err(err);
            }
            if options.version_match == Some(VersionMatch::Exact)
                && parse_rv(options.resource_version.as_deref()).is_some_and(|rv| rv < st.compacted)
            {
                return Err(gone(&self.shared.resource, Verb::List));
            }
            (st.rv.to_string(), st.objects.values().cloned().collect())
        };
        let mut continue_token = None;
        if let Some(limit) = options.limit.filter(|l| *l > 0)
            && items.len() > limit as usize
        {
            let rest = items.split_off(limit as usize);
            st.next_token += 1;
            let token = format!("page-{}", st.next_token);
            st.snapshots.insert(token.clone(), (rv.clone(), rest));
            continue_token = Some(token);
        }
        Ok(ListPage {
            items,
            resource_version: rv,
            continue_token,
            // A server without the ShardedListAndWatch gate: it ignores the shard.
            shard_selector: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    type Fake = FakeListWatch<ConfigMap>;

    #[tokio::test]
    async fn pages_and_watch_replay() {
        let fake = Fake::new("configmaps");
        for i in 0..5 {
            fake.add(Fake::object(Some("ns"), &format!("o{i}")));
        }
        let page = fake
            .list(&ListOptions {
                limit: Some(2),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(page.items.len(), 2);
        let rv = page.resource_version.clone();
        let page2 = fake
            .list(&ListOptions {
                limit: Some(2),
                continue_token: page.continue_token,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(page2.resource_version, rv);
        assert!(page2.continue_token.is_some());

        let mut w = fake
            .watch(&WatchOptions {
                resource_version: "3".into(),
                timeout: None,
                allow_bookmarks: true,
                send_initial_events: false,
                shard: None,
            })
            .await
            .unwrap();
        // rv 4, 5, 6 are o2, o3, o4
        for _ in 0..3 {
            assert!(matches!(w.next().await, Some(Ok(WatchEvent::Added(_)))));
        }
        fake.delete(Some("ns"), "o0");
        assert!(matches!(w.next().await, Some(Ok(WatchEvent::Deleted(_)))));
        fake.end_watches();
        assert!(w.next().await.is_none());
        fake.compact();
        let mut w = fake
            .watch(&WatchOptions {
                resource_version: "3".into(),
                timeout: None,
                allow_bookmarks: true,
                send_initial_events: false,
                shard: None,
            })
            .await
            .unwrap();
        assert!(matches!(w.next().await, Some(Ok(WatchEvent::Error(s))) if s.code == 410));
        assert_eq!(
            fake.calls(),
            CallCounts {
                lists: 2,
                watches: 2
            }
        );
    }
}
