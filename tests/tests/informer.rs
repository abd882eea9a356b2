//! The informer against a real control plane: paged lists, handler events, indexes, a 410
//! after etcd compaction, an apiserver restart, a blocked handler, typed / dynamic /
//! metadata-only informers, RBAC and decode errors. Also the exact requests the `Api`
//! list-watch sends, read back from the apiserver's audit log.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
    future::Future,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{
    NamespaceResourceScope,
    api::core::v1::{ConfigMap, Pod, ServiceAccount},
    api::rbac::v1::{Role, RoleBinding},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube_client::{
    Api, Client, Config,
    api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    config::{AuthInfo, KubeConfigOptions, Kubeconfig},
    core::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta, Resource},
};
use kube_informer::{
    ApiListWatch, BackoffConfig, DeletedObject, Error, HandlerRegistration, ListItem, ListOptions,
    ListPage, ListWatch, Selector, SharedInformer, Verb, VersionMatch, WatchEvent, WatchOptions,
    WatchStream, handler_fn, index::label_index,
};
use kube_testenv::TestEnv;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Generous bound for conditions that take seconds; hitting it means a hang.
const PATIENCE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// helpers

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {PATIENCE:?} waiting for {what}"))
}

/// Waits until a list served from the API server's watch cache (resourceVersion "0", as an
/// informer's first list) returns at least `count` objects: that cache may lag the writes
/// just made, and a test that expects its informer to sync with them must wait for it.
async fn watch_cache_holds<K>(api: &Api<K>, count: usize)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    within("the watch cache to take in the writes", async {
        while api
            .list(&ListParams::default().match_any())
            .await
            .unwrap()
            .items
            .len()
            < count
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// Polls `condition` every 50 ms until it holds; panics after [`PATIENCE`].
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < PATIENCE,
            "timed out after {PATIENCE:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn labelled(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut cm = config_map(name, &[]);
    cm.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    cm
}

fn name<K: Resource>(o: &K) -> String {
    o.meta().name.clone().unwrap_or_default()
}

fn rv<K: Resource>(o: &K) -> String {
    o.meta().resource_version.clone().unwrap_or_default()
}

fn data(cm: &ConfigMap, key: &str) -> Option<String> {
    cm.data.as_ref().and_then(|d| d.get(key).cloned())
}

async fn create_all(api: &Api<ConfigMap>, objects: Vec<ConfigMap>) {
    let created: Vec<ConfigMap> = within(
        "creating ConfigMaps",
        futures::stream::iter(objects)
            .map(|cm| {
                let api = api.clone();
                async move { api.create(&PostParams::default(), &cm).await }
            })
            .buffer_unordered(32)
            .try_collect(),
    )
    .await
    .expect("ConfigMaps are created");
    assert!(!created.is_empty());
}

/// `name -> resourceVersion` of what the API server lists now.
async fn server_state(api: &Api<ConfigMap>) -> BTreeMap<String, String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| (name(o), rv(o)))
        .collect()
}

fn cache_state<K: Resource + Send + Sync + 'static>(
    informer: &SharedInformer<K>,
) -> BTreeMap<String, String> {
    informer
        .store()
        .list()
        .iter()
        .map(|o| (name(&**o), rv(&**o)))
        .collect()
}

/// Waits until the informer's cache holds exactly what the API server lists.
async fn converges(informer: &SharedInformer<ConfigMap>, api: &Api<ConfigMap>) {
    let started = Instant::now();
    loop {
        let server = server_state(api).await;
        let cache = cache_state(informer);
        if cache == server {
            return;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the cache did not converge to the server's list in {PATIENCE:?}:\n cache  {cache:?}\n server {server:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A running informer that stops (and is checked not to have panicked) at the end.
struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn run<K: Resource + Send + Sync + 'static>(informer: &SharedInformer<K>) -> Running {
    let stop = CancellationToken::new();
    let task = tokio::spawn(informer.run(stop.clone()));
    Running { stop, task }
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        within("the informer to stop", self.task)
            .await
            .expect("the informer's run future does not panic");
    }
}

/// What a handler was told.
#[derive(Debug)]
enum Ev<K> {
    Add(Arc<K>, bool),
    Update(Arc<K>, Arc<K>),
    Delete(DeletedObject<K>),
}

impl<K: Resource> Ev<K> {
    fn name(&self) -> String {
        match self {
            Ev::Add(o, _) | Ev::Update(_, o) => name(&**o),
            Ev::Delete(d) => name(&**d.object()),
        }
    }
}

fn recorder<K: Resource + Send + Sync + 'static>(
    informer: &SharedInformer<K>,
) -> (HandlerRegistration, mpsc::UnboundedReceiver<Ev<K>>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (t1, t2, t3) = (tx.clone(), tx.clone(), tx);
    let registration = informer.add_handler(
        handler_fn::<K>()
            .on_add(move |o, initial| {
                let _ = t1.send(Ev::Add(o.clone(), initial));
            })
            .on_update(move |old, new| {
                let _ = t2.send(Ev::Update(old.clone(), new.clone()));
            })
            .on_delete(move |d| {
                let _ = t3.send(Ev::Delete(d.clone()));
            }),
    );
    (registration, rx)
}

async fn next_event<K>(rx: &mut mpsc::UnboundedReceiver<Ev<K>>, what: &str) -> Ev<K> {
    within(what, rx.recv())
        .await
        .expect("the handler's channel stays open")
}

/// An error the watch-error hook received.
#[derive(Clone, Debug)]
struct SeenError {
    text: String,
    gone: bool,
    forbidden: bool,
    /// `(resource, verb)` of an [`Error::Decode`].
    decode: Option<(String, Verb)>,
}

type ErrorLog = Arc<watch::Sender<Vec<SeenError>>>;

fn error_log() -> (ErrorLog, impl Fn(&Error) + Send + Sync + 'static) {
    let log: ErrorLog = Arc::new(watch::channel(Vec::new()).0);
    let hook_log = log.clone();
    let hook = move |e: &Error| {
        let seen = SeenError {
            text: e.to_string(),
            gone: e.is_gone(),
            forbidden: e.is_forbidden(),
            decode: match e {
                Error::Decode { resource, verb, .. } => Some((resource.clone(), *verb)),
                _ => None,
            },
        };
        hook_log.send_modify(|v| v.push(seen));
    };
    (log, hook)
}

async fn wait_errors(log: &ErrorLog, what: &str, f: impl FnMut(&Vec<SeenError>) -> bool) {
    let mut rx = log.subscribe();
    within(what, rx.wait_for(f))
        .await
        .expect("the log's sender is alive");
}

/// One list call seen by [`Recording`].
#[derive(Clone, Debug)]
struct ListCall {
    options: ListOptions,
    /// Items and resourceVersion of the page, or the error.
    result: Result<(usize, String, bool), String>,
}

#[derive(Clone, Debug, Default)]
struct Calls {
    lists: Vec<ListCall>,
    watches: Vec<WatchOptions>,
}

/// A real [`ListWatch`] (normally an [`ApiListWatch`] on the real API server) that records
/// every call, and can hold new watch calls back at a gate, as a network partition would.
#[derive(Clone)]
struct Recording<L> {
    inner: L,
    calls: Arc<watch::Sender<Calls>>,
    gate: Arc<watch::Sender<bool>>,
}

impl<L> Recording<L> {
    fn new(inner: L) -> Self {
        Self {
            inner,
            calls: Arc::new(watch::channel(Calls::default()).0),
            gate: Arc::new(watch::channel(true).0),
        }
    }

    fn calls(&self) -> Calls {
        self.calls.borrow().clone()
    }

    async fn wait_calls(&self, what: &str, f: impl FnMut(&Calls) -> bool) {
        let mut rx = self.calls.subscribe();
        within(what, rx.wait_for(f))
            .await
            .expect("the sender is alive");
    }

    /// New watch calls wait until [`release_watches`](Self::release_watches).
    fn hold_watches(&self) {
        self.gate.send_replace(false);
    }

    fn release_watches(&self) {
        self.gate.send_replace(true);
    }
}

impl<K, L> ListWatch<K> for Recording<L>
where
    K: Send + 'static,
    L: ListWatch<K>,
{
    fn resource(&self) -> String {
        self.inner.resource()
    }

    fn namespace(&self) -> Option<String> {
        self.inner.namespace()
    }

    async fn list(&self, options: &ListOptions) -> Result<ListPage<K>, Error> {
        let result = self.inner.list(options).await;
        let call = ListCall {
            options: options.clone(),
            result: match &result {
                Ok(page) => Ok((
                    page.items.len(),
                    page.resource_version.clone(),
                    page.continue_token.is_some(),
                )),
                Err(e) => Err(e.to_string()),
            },
        };
        self.calls.send_modify(|c| c.lists.push(call));
        result
    }

    async fn watch(&self, options: &WatchOptions) -> Result<WatchStream<K>, Error> {
        self.calls.send_modify(|c| c.watches.push(options.clone()));
        let mut gate = self.gate.subscribe();
        let _ = gate.wait_for(|open| *open).await;
        self.inner.watch(options).await
    }
}

/// Lists every page as the reflector does, returning the page sizes and the names.
async fn list_pages<K: Resource, L: ListWatch<K>>(
    lw: &L,
    first: ListOptions,
) -> (Vec<usize>, Vec<String>) {
    let mut options = first;
    let mut sizes = Vec::new();
    let mut names = Vec::new();
    loop {
        let page = lw.list(&options).await.expect("a list page");
        sizes.push(page.items.len());
        names.extend(page.items.iter().map(|o| name(o)));
        match page.continue_token {
            Some(token) => {
                options = ListOptions {
                    limit: options.limit,
                    continue_token: Some(token),
                    ..Default::default()
                }
            }
            None => return (sizes, names),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. paged lists

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_hundred_config_maps_sync_through_paged_lists() {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("paged").await.unwrap();
    let client = env.client().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    // Something in another namespace the informer must not see.
    let other = env.create_namespace("paged-other").await.unwrap();
    Api::<ConfigMap>::namespaced(client, &other)
        .create(&PostParams::default(), &config_map("elsewhere", &[]))
        .await
        .unwrap();
    let expected: Vec<String> = (0..1200).map(|i| format!("cm-{i:04}")).collect();
    create_all(
        &api,
        expected
            .iter()
            .map(|n| config_map(n, &[("n", n)]))
            .collect(),
    )
    .await;
    // The informer's first list (resourceVersion "0") is served from the API server's watch
    // cache, which may still be taking in the last creates: start once it holds them all, so
    // that list alone must bring all 1,200.
    watch_cache_holds(&api, 1200).await;

    let lw = Recording::new(ApiListWatch::new(api.clone()));
    let informer = SharedInformer::new(lw.clone());
    let running = run(&informer);
    within("the informer to sync", informer.wait_synced()).await;

    let store = informer.store();
    assert_eq!(store.len(), 1200);
    let mut keys: Vec<String> = store.list_keys().iter().map(ToString::to_string).collect();
    keys.sort();
    let expected_keys: Vec<String> = expected
        .iter()
        .map(|n| format!("{namespace}/{n}"))
        .collect();
    assert_eq!(
        keys, expected_keys,
        "exactly the 1,200, none from elsewhere"
    );
    assert_eq!(cache_state(&informer), server_state(&api).await);

    // The reflector's first list: resourceVersion "0" (any cached state) with a limit of 500.
    // The server may serve it whole from its watch cache (1.36 does: one page of 1,200);
    // every page it did send is counted.
    lw.wait_calls("the first watch", |c| !c.watches.is_empty())
        .await;
    let calls = lw.calls();
    let first = &calls.lists[0];
    assert_eq!(first.options.limit, Some(500));
    assert_eq!(first.options.resource_version.as_deref(), Some("0"));
    assert!(first.options.continue_token.is_none());
    let listed: usize = calls
        .lists
        .iter()
        .map(|c| c.result.as_ref().expect("no list failed").0)
        .sum();
    assert_eq!(listed, 1200, "{:?}", calls.lists);
    for later in &calls.lists[1..] {
        assert!(later.options.continue_token.is_some() && later.options.resource_version.is_none());
    }
    let list_rv = first.result.as_ref().unwrap().1.clone();
    assert_eq!(calls.watches[0].resource_version, list_rv);
    assert!(calls.watches[0].allow_bookmarks);

    // A relist after a 410 asks for resourceVersion "" (a consistent read from etcd), which the
    // server always pages: 500 + 500 + 200, following continue tokens that carry no RV.
    let before = lw.calls().lists.len();
    let (sizes, mut names) = list_pages(
        &lw,
        ListOptions {
            limit: Some(500),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(sizes, [500, 500, 200]);
    names.sort();
    assert_eq!(names, expected);
    let relist = &lw.calls().lists[before..];
    assert!(relist[0].options.resource_version.is_none());
    assert!(
        relist[1..]
            .iter()
            .all(|c| c.options.continue_token.is_some())
    );

    // A later relist (resourceVersionMatch=NotOlderThan the last seen RV) pages too.
    let (sizes, _) = list_pages(
        &lw,
        ListOptions {
            limit: Some(500),
            resource_version: informer.last_sync_resource_version(),
            version_match: Some(VersionMatch::NotOlderThan),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(sizes.iter().sum::<usize>(), 1200);
    assert!(sizes.iter().all(|s| *s <= 500), "{sizes:?}");
    running.stop().await;
}

/// Reads one page through [`ListWatch::list_stream`]: the names, then the page's end.
async fn stream_page<K: Resource + Send + 'static, L: ListWatch<K>>(
    lw: &L,
    options: &ListOptions,
) -> Result<(Vec<String>, String, Option<String>), Error> {
    let mut stream = lw.list_stream(options).await?;
    let mut names = Vec::new();
    while let Some(item) = stream.next().await {
        match item? {
            ListItem::Object(o) => names.push(name(&o)),
            ListItem::End {
                resource_version,
                continue_token,
            } => {
                assert!(stream.next().await.is_none(), "End is the last item");
                return Ok((names, resource_version, continue_token));
            }
        }
    }
    panic!("the page stream ended without End");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_read_as_streams_match_decoded_pages() {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("list-stream").await.unwrap();
    let client = env.client().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let expected: Vec<String> = (0..600).map(|i| format!("cm-{i:04}")).collect();
    create_all(
        &api,
        expected
            .iter()
            .map(|n| config_map(n, &[("n", n)]))
            .collect(),
    )
    .await;

    // Page by page from a consistent read: the same names, versions and tokens as `list`
    // (continue tokens differ only in what they encode, so compare their presence).
    let mut options = ListOptions {
        limit: Some(250),
        ..Default::default()
    };
    let mut streamed = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let (names, rv, token) = stream_page(&api, &options).await.expect("a page");
        let page = ListWatch::<ConfigMap>::list(&api, &options)
            .await
            .expect("the same page");
        assert_eq!(names, page.items.iter().map(name).collect::<Vec<_>>());
        assert_eq!(token.is_some(), page.continue_token.is_some());
        if options.continue_token.is_some() {
            assert_eq!(rv, page.resource_version, "one snapshot for all pages");
        }
        sizes.push(names.len());
        streamed.extend(names);
        match token {
            Some(token) => {
                options = ListOptions {
                    limit: Some(250),
                    continue_token: Some(token),
                    ..Default::default()
                }
            }
            None => break,
        }
    }
    assert_eq!(sizes, [250, 250, 100]);
    assert_eq!(streamed, expected);

    // From the watch cache, whole, through the filtering ApiListWatch too.
    let lw = ApiListWatch::new(api.clone()).fields("metadata.name=cm-0007");
    let (names, rv, token) = stream_page(
        &lw,
        &ListOptions {
            limit: Some(500),
            resource_version: Some("0".into()),
            ..Default::default()
        },
    )
    .await
    .expect("a filtered page");
    assert_eq!(names, ["cm-0007"]);
    assert!(!rv.is_empty() && token.is_none());

    // Errors come back sorted, as from `list`: an unknown resource is a 404.
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("nothing.example.com", "v1", "Nope"));
    let missing: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &ar);
    let err = stream_page(&missing, &ListOptions::default())
        .await
        .unwrap_err();
    match &err {
        Error::Api { status, verb, .. } => {
            assert_eq!(status.code, 404, "{err}");
            assert_eq!(*verb, Verb::List);
        }
        other => panic!("expected a 404, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_list_into_a_compact_cache_syncs_and_follows() {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("streamed").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().await.unwrap(), &namespace);
    let expected: Vec<String> = (0..1200).map(|i| format!("cm-{i:04}")).collect();
    create_all(
        &api,
        expected
            .iter()
            .map(|n| labelled(n, &[("app", if n.ends_with('0') { "db" } else { "web" })]))
            .collect(),
    )
    .await;

    let lw = Recording::new(ApiListWatch::new(api.clone()));
    let informer = SharedInformer::builder(lw.clone())
        .streaming_list()
        .compact()
        .index_fn("app", label_index("app"))
        .build();
    let (registration, mut rx) = recorder(&informer);
    let running = run(&informer);
    within("the informer to sync", registration.wait_synced()).await;

    // The whole state came on one watch with sendInitialEvents, without a LIST.
    let calls = lw.calls();
    assert!(calls.lists.is_empty(), "{:?}", calls.lists);
    assert_eq!(calls.watches.len(), 1);
    assert!(calls.watches[0].send_initial_events);
    assert_eq!(calls.watches[0].resource_version, "");
    let mut initial = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Ev::Add(o, true) => initial.push(name(&*o)),
            other => panic!("expected initial adds only, got {other:?}"),
        }
    }
    initial.sort();
    assert_eq!(initial, expected);

    let store = informer.store();
    assert!(store.is_compact());
    assert_eq!(cache_state(&informer), server_state(&api).await);
    assert_eq!(store.by_index("app", "db").unwrap().len(), 120);
    let synced_rv: u64 = informer
        .last_sync_resource_version()
        .expect("the end bookmark's version")
        .parse()
        .unwrap();
    let newest = server_state(&api)
        .await
        .values()
        .map(|rv| rv.parse::<u64>().unwrap())
        .max();
    assert!(
        Some(synced_rv) >= newest,
        "synced at {synced_rv}, objects up to {newest:?}"
    );

    // Changes follow on the same watch; the old object comes back from the compact form.
    let before = api.get("cm-0001").await.unwrap();
    let updated = api
        .patch(
            "cm-0001",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "app": "db" } } })),
        )
        .await
        .unwrap();
    match next_event(&mut rx, "the update").await {
        Ev::Update(old, new) => {
            assert_eq!(*old, before);
            assert_eq!(rv(&*new), rv(&updated));
        }
        other => panic!("expected an update, got {other:?}"),
    }
    assert_eq!(store.by_index("app", "db").unwrap().len(), 121);
    api.delete("cm-0002", &DeleteParams::default())
        .await
        .unwrap();
    match next_event(&mut rx, "the delete").await {
        Ev::Delete(deleted) => {
            assert!(!deleted.is_final_state_unknown());
            assert_eq!(name(&**deleted.object()), "cm-0002");
        }
        other => panic!("expected a delete, got {other:?}"),
    }
    assert_eq!(store.len(), 1199);
    assert_eq!(
        lw.calls().watches.len(),
        1,
        "the streaming watch carried on"
    );
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 2. handler events

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_update_delete_reach_handlers_with_old_and_new() {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("events").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().await.unwrap(), &namespace);
    api.create(&PostParams::default(), &config_map("before", &[("v", "0")]))
        .await
        .unwrap();

    let informer = SharedInformer::new(api.clone());
    let (registration, mut rx) = recorder(&informer);
    let running = run(&informer);
    match next_event(&mut rx, "the initial add").await {
        Ev::Add(o, initial) => {
            assert_eq!(name(&*o), "before");
            assert!(initial, "objects of the first list are initial adds");
        }
        other => panic!("expected the initial add, got {other:?}"),
    }
    within("the handler to sync", registration.wait_synced()).await;

    let created = api
        .create(&PostParams::default(), &config_map("a", &[("v", "1")]))
        .await
        .unwrap();
    match next_event(&mut rx, "the add").await {
        Ev::Add(o, initial) => {
            assert_eq!(name(&*o), "a");
            assert!(!initial);
            assert_eq!(data(&o, "v").as_deref(), Some("1"));
            assert_eq!(rv(&*o), rv(&created));
        }
        other => panic!("expected an add, got {other:?}"),
    }

    let updated = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "v": "2" } })),
        )
        .await
        .unwrap();
    match next_event(&mut rx, "the update").await {
        Ev::Update(old, new) => {
            assert_eq!(name(&*new), "a");
            assert_eq!(
                data(&old, "v").as_deref(),
                Some("1"),
                "old is the previous state"
            );
            assert_eq!(
                data(&new, "v").as_deref(),
                Some("2"),
                "new is the updated state"
            );
            assert_eq!(rv(&*old), rv(&created));
            assert_eq!(rv(&*new), rv(&updated));
        }
        other => panic!("expected an update, got {other:?}"),
    }

    api.delete("a", &DeleteParams::default()).await.unwrap();
    match next_event(&mut rx, "the delete").await {
        Ev::Delete(deleted) => {
            assert!(!deleted.is_final_state_unknown(), "the watch saw it");
            let last = deleted.object();
            assert_eq!(name(&**last), "a");
            assert_eq!(data(last, "v").as_deref(), Some("2"), "the last state");
            assert_eq!(deleted.key().to_string(), format!("{namespace}/a"));
        }
        other => panic!("expected a delete, got {other:?}"),
    }
    assert!(
        informer
            .store()
            .get_by_key(format!("{namespace}/a"))
            .is_none()
    );
    assert!(rx.try_recv().is_err(), "nothing else was delivered");
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 3. indexes and listers

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_index_and_lister_by_selector() {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("index").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().await.unwrap(), &namespace);
    create_all(
        &api,
        vec![
            labelled("web-1", &[("app", "web"), ("tier", "front")]),
            labelled("web-2", &[("app", "web"), ("tier", "front")]),
            labelled("web-3", &[("app", "web")]),
            labelled("db-1", &[("app", "db"), ("tier", "back")]),
            labelled("db-2", &[("app", "db")]),
            labelled("plain", &[]),
        ],
    )
    .await;
    watch_cache_holds(&api, 6).await;

    let informer = SharedInformer::builder(api.clone())
        .index_fn("app", label_index("app"))
        .build();
    let running = run(&informer);
    within("the informer to sync", informer.wait_synced()).await;
    let store = informer.store();

    let names_of = |v: Vec<Arc<ConfigMap>>| {
        let mut n: Vec<String> = v.iter().map(|o| name(&**o)).collect();
        n.sort();
        n
    };
    assert_eq!(
        names_of(store.by_index("app", "web").unwrap()),
        ["web-1", "web-2", "web-3"]
    );
    assert_eq!(
        names_of(store.by_index("app", "db").unwrap()),
        ["db-1", "db-2"]
    );
    assert!(store.by_index("app", "none").unwrap().is_empty());
    let mut values = store.list_index_values("app").unwrap();
    values.sort();
    assert_eq!(values, ["db", "web"]);
    assert_eq!(store.index_keys("app", "db").unwrap().len(), 2);
    assert!(matches!(
        store.by_index("missing", "x"),
        Err(Error::IndexNotFound(_))
    ));

    let lister = informer.lister();
    let select = |s: &str| names_of(lister.list_selector(&s.parse::<Selector>().unwrap()));
    assert_eq!(select("app=web"), ["web-1", "web-2", "web-3"]);
    assert_eq!(select("app in (web, db),tier"), ["db-1", "web-1", "web-2"]);
    assert_eq!(select("!app"), ["plain"]);
    assert_eq!(select("app!=web"), ["db-1", "db-2", "plain"]);
    assert_eq!(
        names_of(lister.list_namespace_selector(&namespace, &"tier=back".parse().unwrap())),
        ["db-1"]
    );
    assert!(
        lister
            .list_namespace_selector("elsewhere", &Selector::everything())
            .is_empty()
    );
    assert_eq!(lister.list_namespace(&namespace).len(), 6);
    assert!(lister.get(namespace.as_str(), "plain").is_some());

    // Relabelling and deleting move objects between index values.
    api.patch(
        "web-3",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "labels": { "app": "db" } } })),
    )
    .await
    .unwrap();
    api.delete("db-1", &DeleteParams::default()).await.unwrap();
    eventually("the index to follow the relabel and the delete", || {
        names_of(store.by_index("app", "db").unwrap()) == ["db-2", "web-3"]
    })
    .await;
    assert_eq!(
        names_of(store.by_index("app", "web").unwrap()),
        ["web-1", "web-2"]
    );
    assert_eq!(select("app=db"), ["db-2", "web-3"]);
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 4. compaction: 410 Gone, relist, tombstones

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_compaction_forces_a_relist_that_converges() {
    // Without the watch cache, watches and lists are served by etcd, so a compacted revision is
    // refused at once (see testenv.rs).
    let env = TestEnv::builder()
        .apiserver_arg("--watch-cache=false")
        .start()
        .await
        .unwrap();
    let namespace = env.create_namespace("compact").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().await.unwrap(), &namespace);
    for n in ["a", "b", "c"] {
        api.create(&PostParams::default(), &config_map(n, &[("v", "1")]))
            .await
            .unwrap();
    }

    let lw = Recording::new(ApiListWatch::new(api.clone()));
    let (errors, hook) = error_log();
    let informer = SharedInformer::builder(lw.clone())
        .on_watch_error(hook)
        .build();
    let (_registration, mut rx) = recorder(&informer);
    let running = run(&informer);
    within("the informer to sync", informer.wait_synced()).await;
    for _ in 0..3 {
        assert!(matches!(
            next_event(&mut rx, "initial adds").await,
            Ev::Add(_, true)
        ));
    }
    // A continue token taken now expires with the compaction below.
    let first_page = ListWatch::<ConfigMap>::list(
        &api,
        &ListOptions {
            limit: Some(1),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let token = first_page.continue_token.expect("3 objects, pages of 1");

    // Cut the informer off: new watch calls wait at the gate, and a restart of the apiserver
    // breaks the running watch for real. The reflector tries to resume from its last RV.
    let remembered: i64 = informer
        .last_sync_resource_version()
        .unwrap()
        .parse()
        .unwrap();
    lw.hold_watches();
    env.restart_apiserver().await.unwrap();
    lw.wait_calls("the reflector to try to resume its watch", |c| {
        c.watches.len() >= 2
    })
    .await;
    let lists_before = lw.calls().lists.len();
    assert_eq!(
        lw.calls().watches[1].resource_version,
        remembered.to_string(),
        "a broken watch resumes from the last RV"
    );

    // Changes the informer cannot see, then etcd forgets the history since its RV.
    api.create(&PostParams::default(), &config_map("d", &[("v", "1")]))
        .await
        .unwrap();
    api.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "v": "2" } })),
    )
    .await
    .unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let compacted = env.compact_etcd().await.unwrap();
    assert!(compacted > remembered + 1, "{compacted} {remembered}");

    // An expired continue token is a 410 on the list too.
    let expired = ListWatch::<ConfigMap>::list(
        &api,
        &ListOptions {
            limit: Some(1),
            continue_token: Some(token),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            &expired,
            Error::Gone {
                verb: Verb::List,
                ..
            }
        ),
        "{expired}"
    );

    lw.release_watches();
    wait_errors(&errors, "a 410 Gone on the resumed watch", |e| {
        e.iter().any(|e| e.gone)
    })
    .await;
    converges(&informer, &api).await;
    let gone = errors.borrow().iter().find(|e| e.gone).cloned().unwrap();
    assert!(gone.text.contains("configmaps"), "{gone:?}");
    // The relist after the 410 was a consistent read (resourceVersion "").
    let relist = &lw.calls().lists[lists_before];
    assert!(
        relist.options.resource_version.is_none() && relist.options.continue_token.is_none(),
        "{relist:?}"
    );

    // Handlers: d added, b updated from v1 to v2, a deleted with a tombstone of its last state.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.push(next_event(&mut rx, "the relist's events").await);
    }
    seen.sort_by_key(Ev::name);
    match &seen[..] {
        [Ev::Delete(a), Ev::Update(old_b, new_b), Ev::Add(d, false)] => {
            assert!(a.is_final_state_unknown(), "only a relist saw the deletion");
            assert_eq!(name(&**a.object()), "a");
            assert_eq!(data(a.object(), "v").as_deref(), Some("1"));
            assert_eq!(a.key().to_string(), format!("{namespace}/a"));
            assert_eq!(data(old_b, "v").as_deref(), Some("1"));
            assert_eq!(data(new_b, "v").as_deref(), Some("2"));
            assert_eq!(name(&**d), "d");
        }
        other => panic!("expected delete a, update b, add d; got {other:?}"),
    }
    assert!(rx.try_recv().is_err(), "c did not change and got no event");
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 5. apiserver restart, and the exact requests (audit log)

fn audit_policy(dir: &std::path::Path) -> (String, std::path::PathBuf) {
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(
        &policy,
        r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    resources:
      - group: ""
        resources: ["configmaps"]
  - level: None
"#,
    )
    .unwrap();
    (
        format!("--audit-policy-file={}", policy.display()),
        dir.join("audit.log"),
    )
}

/// `(verb, requestURI)` of each audited configmap request in `namespace`, in order.
fn audited(log: &std::path::Path, namespace: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["objectRef"]["namespace"] == namespace)
        .filter(|e| seen.insert(e["auditID"].as_str().unwrap_or_default().to_owned()))
        .map(|e| {
            (
                e["verb"].as_str().unwrap_or_default().to_owned(),
                e["requestURI"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn query(uri: &str) -> HashMap<String, String> {
    uri.split_once('?')
        .map(|(_, q)| q)
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apiserver_restart_is_survived_without_spurious_events() {
    let audit_dir = tempfile::tempdir().unwrap();
    let (policy_arg, audit_log) = audit_policy(audit_dir.path());
    let env = TestEnv::builder()
        .apiserver_arg(policy_arg)
        .apiserver_arg(format!("--audit-log-path={}", audit_log.display()))
        .start()
        .await
        .unwrap();
    let namespace = env.create_namespace("restart").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().await.unwrap(), &namespace);
    let n = 10;
    create_all(
        &api,
        (0..n)
            .map(|i| config_map(&format!("cm-{i}"), &[("v", "1")]))
            .collect(),
    )
    .await;

    let lw = Recording::new(ApiListWatch::new(api.clone()));
    let informer = SharedInformer::new(lw.clone());
    let events: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
    let record = |kind: &'static str| {
        let events = events.clone();
        move |o: &ConfigMap| {
            events
                .lock()
                .unwrap()
                .entry(name(o))
                .or_default()
                .push(kind.to_owned());
        }
    };
    let (on_add, on_initial, on_update, on_delete) = (
        record("add"),
        record("initial-add"),
        record("update"),
        record("delete"),
    );
    informer.add_handler(
        handler_fn::<ConfigMap>()
            .on_add(move |o, initial| if initial { on_initial(o) } else { on_add(o) })
            .on_update(move |_, new| on_update(new))
            .on_delete(move |d| on_delete(d.object())),
    );
    let running = run(&informer);
    within("the informer to sync", informer.wait_synced()).await;
    lw.wait_calls("the first watch", |c| !c.watches.is_empty())
        .await;
    eventually("the initial adds", || events.lock().unwrap().len() == n).await;

    env.restart_apiserver().await.unwrap();
    api.create(&PostParams::default(), &config_map("after-restart", &[]))
        .await
        .unwrap();
    eventually("the new object to reach the handler", || {
        events.lock().unwrap().contains_key("after-restart")
    })
    .await;
    converges(&informer, &api).await;
    let events = events.lock().unwrap().clone();
    for i in 0..n {
        assert_eq!(
            events[&format!("cm-{i}")],
            ["initial-add"],
            "no spurious events for an unchanged object: {events:?}"
        );
    }
    assert_eq!(events["after-restart"], ["add"]);
    assert_eq!(events.len(), n + 1);

    // What went over the wire, from the apiserver's audit log.
    let list_rv = lw.calls().lists[0].result.clone().unwrap().1;
    let mut requests = Vec::new();
    eventually(
        "the audit log to show the informer's list and watch",
        || {
            requests = audited(&audit_log, &namespace);
            requests.iter().any(|(verb, _)| verb == "watch")
        },
    )
    .await;
    let (verb, uri) = requests
        .iter()
        .find(|(verb, _)| verb == "list")
        .expect("the informer listed");
    let q = query(uri);
    assert_eq!(verb, "list");
    assert_eq!(q.get("limit").map(String::as_str), Some("500"), "{uri}");
    assert_eq!(
        q.get("resourceVersion").map(String::as_str),
        Some("0"),
        "{uri}"
    );
    let (_, uri) = requests.iter().find(|(verb, _)| verb == "watch").unwrap();
    let q = query(uri);
    assert_eq!(q.get("watch").map(String::as_str), Some("true"), "{uri}");
    assert_eq!(
        q.get("allowWatchBookmarks").map(String::as_str),
        Some("true"),
        "{uri}"
    );
    assert_eq!(q.get("resourceVersion"), Some(&list_rv), "{uri}");
    let timeout: u64 = q["timeoutSeconds"].parse().unwrap();
    assert!((300..600).contains(&timeout), "{uri}");
    running.stop().await;

    // The other list shapes the reflector sends, straight through the `Api` list-watch.
    let api_lw = ApiListWatch::new(api.clone());
    let page = api_lw
        .list(&ListOptions {
            limit: Some(4),
            ..Default::default()
        })
        .await
        .unwrap();
    let token = page.continue_token.clone().expect("11 objects, pages of 4");
    let next = api_lw
        .list(&ListOptions {
            limit: Some(4),
            continue_token: Some(token.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(next.items.len(), 4);
    assert_eq!(next.resource_version, page.resource_version);
    let not_older = api_lw
        .list(&ListOptions {
            limit: Some(4),
            resource_version: Some(page.resource_version.clone()),
            version_match: Some(VersionMatch::NotOlderThan),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(not_older.items.len(), 4);
    // Told apart from the informer's requests by their page size.
    let direct = |requests: &[(String, String)]| -> Vec<HashMap<String, String>> {
        requests
            .iter()
            .filter(|(verb, _)| verb == "list")
            .map(|(_, uri)| query(uri))
            .filter(|q| q.get("limit").map(String::as_str) == Some("4"))
            .collect()
    };
    let mut lists = Vec::new();
    eventually("the audit log to show the three lists", || {
        lists = direct(&audited(&audit_log, &namespace));
        lists.len() >= 3
    })
    .await;
    assert_eq!(lists.len(), 3, "{lists:?}");
    let no_rv = &lists[0];
    assert!(!no_rv.contains_key("resourceVersion"), "{no_rv:?}");
    let continued = &lists[1];
    assert!(continued.contains_key("continue"), "{continued:?}");
    assert!(!continued.contains_key("resourceVersion"), "{continued:?}");
    let last = &lists[2];
    assert_eq!(last.get("resourceVersion"), Some(&page.resource_version));
    assert_eq!(
        last.get("resourceVersionMatch").map(String::as_str),
        Some("NotOlderThan")
    );
}

// ---------------------------------------------------------------------------------------------
// 6. a blocked handler

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocked_handler_does_not_delay_another() {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("slow").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().await.unwrap(), &namespace);
    let informer = SharedInformer::new(api.clone());

    // The slow handler blocks its thread on its first event until the test releases it (or,
    // if the test fails first, after a while, so the runtime can shut down).
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = Mutex::new(released);
    let slow_seen = Arc::new(AtomicUsize::new(0));
    let slow_count = slow_seen.clone();
    informer.add_handler(handler_fn::<ConfigMap>().on_add(move |_, _| {
        if slow_count.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = released.lock().unwrap().recv_timeout(2 * PATIENCE);
        }
    }));
    let (_fast, mut fast_rx) = recorder(&informer);
    let running = run(&informer);
    within("the informer to sync", informer.wait_synced()).await;

    let count = 20;
    create_all(
        &api,
        (0..count)
            .map(|i| config_map(&format!("cm-{i:02}"), &[]))
            .collect(),
    )
    .await;
    let mut fast_names = Vec::new();
    while fast_names.len() < count {
        match next_event(&mut fast_rx, "the fast handler's adds").await {
            Ev::Add(o, _) => fast_names.push(name(&*o)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        slow_seen.load(Ordering::SeqCst),
        1,
        "the slow handler is still stuck on its first event"
    );
    assert_eq!(
        informer.store().len(),
        count,
        "the reflector was not held up"
    );
    release.send(()).unwrap();
    eventually("the slow handler to catch up", || {
        slow_seen.load(Ordering::SeqCst) == count
    })
    .await;
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 7. typed Pods, dynamic CRs, metadata only

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_dynamic_and_metadata_only_informers() {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("kinds").await.unwrap();
    let client = env.client().await.unwrap();

    // Pods (no nodes: they stay Pending).
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let pod_informer = SharedInformer::new(pods.clone());
    let pod_run = run(&pod_informer);
    within("the Pod informer to sync", pod_informer.wait_synced()).await;
    for i in 0..3 {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": format!("pod-{i}"), "labels": { "app": "demo" } },
            "spec": { "containers": [{ "name": "c", "image": "busybox" }] }
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    eventually("the Pods in the cache", || pod_informer.store().len() == 3).await;
    let pod = pod_informer
        .lister()
        .get(namespace.as_str(), "pod-1")
        .unwrap();
    assert_eq!(
        pod.spec.as_ref().unwrap().containers[0].image.as_deref(),
        Some("busybox")
    );
    pod_run.stop().await;

    // A CRD, served once Established, through DynamicObject.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": { "name": "widgets.test.kube-informer.dev" },
        "spec": {
            "group": "test.kube-informer.dev",
            "scope": "Namespaced",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList" },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } }
                } }
            }]
        }
    }))
    .unwrap();
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube_client::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating the CRD: {e}"),
    }
    let started = Instant::now();
    loop {
        let current = crds.get("widgets.test.kube-informer.dev").await.unwrap();
        let established = current
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            break;
        }
        assert!(started.elapsed() < PATIENCE, "the CRD was not Established");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gvk = GroupVersionKind::gvk("test.kube-informer.dev", "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &ar);
    assert_eq!(
        ListWatch::<DynamicObject>::resource(&widgets),
        "widgets.test.kube-informer.dev"
    );
    let widget_informer = SharedInformer::new(widgets.clone());
    let (_reg, mut widget_rx) = recorder(&widget_informer);
    let widget_run = run(&widget_informer);
    // Discovery may lag Established by a moment; the reflector retries until served.
    within("the widget informer to sync", widget_informer.wait_synced()).await;
    let widget = DynamicObject::new("w1", &ar).data(json!({ "spec": { "size": 3 } }));
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    match next_event(&mut widget_rx, "the widget's add").await {
        Ev::Add(w, false) => {
            assert_eq!(name(&*w), "w1");
            assert_eq!(w.data["spec"]["size"], 3);
            assert_eq!(w.types.as_ref().unwrap().kind, "Widget");
        }
        other => panic!("expected the widget's add, got {other:?}"),
    }
    widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "size": 4 } })),
        )
        .await
        .unwrap();
    match next_event(&mut widget_rx, "the widget's update").await {
        Ev::Update(old, new) => {
            assert_eq!(old.data["spec"]["size"], 3);
            assert_eq!(new.data["spec"]["size"], 4);
        }
        other => panic!("expected the widget's update, got {other:?}"),
    }
    widget_run.stop().await;

    // Metadata only (kube-client asks for PartialObjectMetadata).
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let created = config_maps
        .create(
            &PostParams::default(),
            &labelled("meta", &[("app", "demo")]),
        )
        .await
        .unwrap();
    let metas: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client, &namespace);
    let meta_informer = SharedInformer::builder(metas)
        .index_fn("app", label_index("app"))
        .build();
    let meta_run = run(&meta_informer);
    within("the metadata informer to sync", meta_informer.wait_synced()).await;
    // Its list may predate the create in the watch cache; the watch brings it then.
    eventually("the ConfigMap's metadata in the cache", || {
        meta_informer
            .store()
            .get_by_key(format!("{namespace}/meta"))
            .is_some()
    })
    .await;
    let cached = meta_informer
        .store()
        .get_by_key(format!("{namespace}/meta"))
        .expect("the ConfigMap's metadata is cached");
    assert_eq!(rv(&*cached), rv(&created));
    assert_eq!(cached.types.as_ref().unwrap().kind, "PartialObjectMetadata");
    assert_eq!(
        meta_informer.store().by_index("app", "demo").unwrap().len(),
        1
    );
    meta_run.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 8. errors from the real server

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_forbidden_is_fatal_at_start_and_heals_when_granted() {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("rbac").await.unwrap();
    let admin = env.client().await.unwrap();
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("reader".to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let mut kubectl = env.kubectl();
    kubectl.args(["create", "token", "reader", "-n", &namespace]);
    let output = tokio::task::spawn_blocking(move || kubectl.output())
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let token = String::from_utf8(output.stdout).unwrap().trim().to_owned();

    let kubeconfig = Kubeconfig::read_from(env.kubeconfig_path()).unwrap();
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.auth_info = AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let client = Client::try_from(config).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);

    // The `Api` list-watch sorts the 403 for both verbs.
    let list = ListWatch::<ConfigMap>::list(&api, &ListOptions::default())
        .await
        .unwrap_err();
    assert!(list.is_forbidden(), "{list}");
    let watch = ListWatch::<ConfigMap>::watch(
        &api,
        &WatchOptions {
            resource_version: "0".into(),
            timeout: Some(Duration::from_secs(10)),
            allow_bookmarks: true,
            send_initial_events: false,
        },
    )
    .await
    .err()
    .expect("watching is forbidden too");
    assert!(
        matches!(
            &watch,
            Error::Forbidden {
                verb: Verb::Watch,
                ..
            }
        ),
        "{watch}"
    );

    let (errors, hook) = error_log();
    let informer = SharedInformer::builder(api.clone())
        .on_watch_error(hook)
        .build();
    let running = run(&informer);
    let error = within("the first sync to fail", informer.wait_synced_or_fatal())
        .await
        .unwrap_err();
    match &error {
        Error::Forbidden {
            resource,
            verb,
            namespace: ns,
            message,
        } => {
            assert_eq!(resource, "configmaps");
            assert_eq!(*verb, Verb::List);
            assert_eq!(ns.as_deref(), Some(namespace.as_str()));
            assert!(
                message.contains(&format!("system:serviceaccount:{namespace}:reader")),
                "{message}"
            );
        }
        other => panic!("expected Forbidden, got {other}"),
    }
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "cannot list configmaps in namespace \"{namespace}\""
        )),
        "{text}"
    );
    assert!(errors.borrow().iter().all(|e| e.forbidden));
    assert!(!informer.has_synced());

    // The reflector keeps retrying: granting the permission lets it sync.
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": "read-config-maps" },
        "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"] }]
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "reader-reads-config-maps" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-config-maps" },
        "subjects": [{ "kind": "ServiceAccount", "name": "reader", "namespace": namespace }]
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin, &namespace)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    within("the informer to sync once allowed", informer.wait_synced()).await;
    running.stop().await;
}

/// A ConfigMap as a stricter program sees it: `data.required` must exist.
#[derive(Clone, Debug, Deserialize)]
struct StrictConfigMap {
    metadata: ObjectMeta,
    #[allow(dead_code)]
    data: StrictData,
}

#[derive(Clone, Debug, Deserialize)]
struct StrictData {
    #[allow(dead_code)]
    required: String,
}

impl Resource for StrictConfigMap {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ConfigMap".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "configmaps".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// An object that does not decode is reported as `Decode` naming the resource, first on the
/// watch, then on every relist; the reflector keeps relisting with backoff (the cache keeps
/// its last good state, `has_synced` stays true, and every failed attempt reaches the hook);
/// once the object is fixed the next relist succeeds and the cache catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_object_is_reported_and_relisted_until_fixed() {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("decode").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().await.unwrap(), &namespace);
    api.create(
        &PostParams::default(),
        &config_map("good", &[("required", "x")]),
    )
    .await
    .unwrap();

    let (errors, hook) = error_log();
    let informer = SharedInformer::builder(Api::<StrictConfigMap>::namespaced(
        env.client().await.unwrap(),
        &namespace,
    ))
    .backoff(BackoffConfig {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(1),
        ..Default::default()
    })
    .on_watch_error(hook)
    .build();
    let (_reg, mut rx) = recorder(&informer);
    let running = run(&informer);
    within("the informer to sync", informer.wait_synced()).await;
    assert!(matches!(
        next_event(&mut rx, "the initial add").await,
        Ev::Add(_, true)
    ));

    api.create(
        &PostParams::default(),
        &config_map("bad", &[("other", "y")]),
    )
    .await
    .unwrap();
    wait_errors(
        &errors,
        "Decode on the watch, then on several relists",
        |e| {
            let watch = e
                .iter()
                .any(|e| e.decode == Some(("configmaps".into(), Verb::Watch)));
            let lists = e
                .iter()
                .filter(|e| e.decode == Some(("configmaps".into(), Verb::List)))
                .count();
            watch && lists >= 3
        },
    )
    .await;
    assert!(
        errors.borrow().iter().all(|e| e.decode.is_some()),
        "{:?}",
        errors.borrow()
    );
    assert!(errors.borrow()[0].text.contains("configmaps"));
    assert!(informer.has_synced());
    assert_eq!(
        cache_state(&informer).keys().collect::<Vec<_>>(),
        ["good"],
        "the cache keeps its last good state"
    );

    api.patch(
        "bad",
        &PatchParams::default(),
        &Patch::Merge(json!({ "data": { "required": "now" } })),
    )
    .await
    .unwrap();
    match next_event(&mut rx, "the fixed object's add").await {
        Ev::Add(o, false) => assert_eq!(name(&*o), "bad"),
        other => panic!("expected the fixed object's add, got {other:?}"),
    }
    assert_eq!(cache_state(&informer).len(), 2);
    running.stop().await;
}

// ---------------------------------------------------------------------------------------------
// the `Api` list-watch's stream: events and bookmarks

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_watch_streams_events_and_a_bookmark_before_its_timeout() {
    let env = TestEnv::shared().await;
    let namespace = env.create_namespace("stream").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(env.client().await.unwrap(), &namespace);
    let start = ListWatch::<ConfigMap>::list(&api, &ListOptions::default())
        .await
        .unwrap();
    let mut stream = ListWatch::<ConfigMap>::watch(
        &api,
        &WatchOptions {
            resource_version: start.resource_version.clone(),
            timeout: Some(Duration::from_secs(6)),
            allow_bookmarks: true,
            send_initial_events: false,
        },
    )
    .await
    .unwrap();
    let created = api
        .create(&PostParams::default(), &config_map("x", &[]))
        .await
        .unwrap();
    let mut added = None;
    let mut bookmark = None;
    // The server ends the watch at its timeout; it sends a bookmark shortly before.
    while let Some(event) = within("the watch to end at its timeout", stream.next()).await {
        match event.expect("no stream error") {
            WatchEvent::Added(o) => added = Some(o),
            WatchEvent::Bookmark {
                resource_version, ..
            } => bookmark = Some(resource_version),
            other => panic!("unexpected {other:?}"),
        }
    }
    let added = added.expect("the create was streamed");
    assert_eq!(rv(&added), rv(&created));
    let bookmark = bookmark.expect("a bookmark before the timeout");
    assert!(
        bookmark.parse::<u64>().unwrap() >= rv(&created).parse::<u64>().unwrap(),
        "{bookmark}"
    );
}
