//! The informer against an API server that lies, over real HTTP: objects of 100 MiB, a
//! watch line that never ends, versions that go backwards or repeat, a continue token that
//! loops, a bookmark whose version is garbage, HTML sent with 200, a body cut short, and a
//! flood of events faster than a handler. Each answer must end in a clear error or a
//! bounded backlog, in memory under a stated bound, with a cache that never says it has
//! synced while it holds what the server never had.
//!
//! The server ([`server`]) is written by hand: no real API server sends these. The client
//! is the library's own ([`kube_informer::client`]) and the informer the real one, paged
//! lists and all; the server answers in JSON whatever the client accepts (the library
//! asks built-in kinds for protobuf or JSON), except where a case needs protobuf.

mod server;

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{
        Arc, Condvar, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use futures::{FutureExt, Stream, StreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::{Api, Config};
use kube_informer::{
    CancellationToken, Delivery, Error, RunningInformer, SharedInformer, handler_fn,
    informer::{HANDLER_COALESCE_AFTER, HandlerRegistration, InformerBuilder, InformerHealth},
    list_watch::{ApiListWatch, ListOptions, ListWatch, WireFormat},
    reflector::BackoffConfig,
};
use serde_json::{Value, json};
use server::{Body, Outcome, PATIENCE, Reply, Request, Server};
use tokio::sync::{RwLock, Semaphore, mpsc};

const MIB: usize = 1 << 20;

/// The most bytes the library buffers for one object (a list item, a JSON watch event)
/// before it refuses it.
const OBJECT_LIMIT: usize = 64 * MIB;

/// What a process may hold besides one object at the limit while refusing it: the HTTP
/// stack's buffers, the decoder's, and the allocator's slack.
const MARGIN: usize = 32 * MIB;

/// Held for reading by every test, and for writing by one that measures the process's
/// peak memory, which nothing else may then move.
static MEMORY: RwLock<()> = RwLock::const_new(());

/// The process's peak resident memory since a point, as Linux counts it.
struct Peak {
    /// Resident bytes when the count started.
    baseline: usize,
}

impl Peak {
    /// Starts counting: the peak is reset to what the process holds now. `None` where the
    /// kernel offers no such count.
    fn start() -> Option<Self> {
        std::fs::write("/proc/self/clear_refs", "5").ok()?;
        Some(Self {
            baseline: status_kib("VmRSS:")? * 1024,
        })
    }

    /// How far the peak rose above where it started.
    fn growth(&self) -> usize {
        let peak = status_kib("VmHWM:").expect("VmHWM in /proc/self/status") * 1024;
        peak.saturating_sub(self.baseline)
    }
}

/// A field of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Asserts that the memory `peak` counted rose by at most `bound` bytes (where it could
/// be counted).
fn assert_peak_within(peak: Option<&Peak>, bound: usize, what: &str) {
    match peak {
        Some(peak) => {
            let growth = peak.growth();
            eprintln!("{what}: the peak rose by {} MiB", growth / MIB);
            assert!(
                growth <= bound,
                "{what}: the peak rose by {} MiB, more than {} MiB",
                growth / MIB,
                bound / MIB
            );
        }
        None => eprintln!("{what}: no peak memory count on this system; not checked"),
    }
}

/// `fut`'s output; a panic as soon as the memory `peak` counts rises past `bound`, so a
/// test of a limit fails at once, rather than take the machine's memory, when the limit
/// does not hold.
async fn in_memory<T>(peak: Option<&Peak>, bound: usize, fut: impl Future<Output = T>) -> T {
    let Some(peak) = peak else {
        return fut.await;
    };
    let watchdog = async {
        loop {
            let growth = peak.growth();
            if growth > bound {
                return growth;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        out = fut => out,
        growth = watchdog => panic!(
            "the peak rose by {} MiB, more than {} MiB",
            growth / MIB,
            bound / MIB
        ),
    }
}

/// A list/watch error the informer reported, sorted.
#[derive(Debug)]
struct Reported {
    kind: &'static str,
    text: String,
}

/// The variant of `error`, in a word.
fn kind(error: &Error) -> &'static str {
    match error {
        Error::Decode { .. } => "decode",
        Error::Transport { .. } => "transport",
        Error::MalformedEvent { .. } => "malformed",
        Error::ContinueLoop { .. } => "continue loop",
        Error::IdleTimeout { .. } => "idle",
        _ => "other",
    }
}

/// The errors an informer reports, as they come.
struct Errors(mpsc::UnboundedReceiver<Reported>);

impl Errors {
    /// The next one; panics naming `what` after [`PATIENCE`].
    async fn next(&mut self, what: &str) -> Reported {
        within(what, self.0.recv())
            .await
            .expect("the informer holds the sender")
    }

    /// Those reported so far and not taken yet.
    fn rest(&mut self) -> Vec<Reported> {
        std::iter::from_fn(|| self.0.try_recv().ok()).collect()
    }
}

type Builder = InformerBuilder<ConfigMap, Api<ConfigMap>>;

/// An informer of the ConfigMaps of namespace `ns` that `server` serves, through the
/// library's client, in paged lists, retrying within a tenth of a second; `configure`
/// changes what it needs.
fn informer(
    server: &Server,
    configure: impl FnOnce(Builder) -> Builder,
) -> (SharedInformer<ConfigMap>, Errors) {
    let config = Config::new(server.url().parse().expect("the server's URL"));
    let client = kube_informer::client(config).expect("a client");
    let (tx, rx) = mpsc::unbounded_channel();
    let builder = SharedInformer::builder(Api::<ConfigMap>::namespaced(client, "ns"))
        .paged_list()
        .backoff(
            BackoffConfig::default()
                .initial(Duration::from_millis(20))
                .max(Duration::from_millis(100)),
        )
        .on_watch_error(move |error: &Error| {
            let _ = tx.send(Reported {
                kind: kind(error),
                text: error.to_string(),
            });
        });
    (configure(builder).build(), Errors(rx))
}

fn start(informer: SharedInformer<ConfigMap>) -> RunningInformer<ConfigMap> {
    informer.spawn(CancellationToken::new())
}

/// `fut`'s output, or a panic naming `what` after [`PATIENCE`].
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {PATIENCE:?}"))
}

/// Waits until `condition` holds, looking every few milliseconds: for states nothing
/// announces (what the cache or a handler holds).
async fn until(what: &str, mut condition: impl FnMut() -> bool) {
    within(what, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// A ConfigMap `ns/<name>` at `rv`, whose `data.v` is `value`.
fn config_map(name: &str, rv: u64, value: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name, "namespace": "ns", "resourceVersion": rv.to_string() },
        "data": { "v": value },
    })
}

/// A list page at `rv` holding `items`, continued by `next`.
fn page(rv: u64, items: &[Value], next: Option<&str>) -> Reply {
    Reply::json(&json!({
        "apiVersion": "v1",
        "kind": "ConfigMapList",
        "metadata": { "resourceVersion": rv.to_string(), "continue": next.unwrap_or("") },
        "items": items,
    }))
}

/// One JSON watch event, its line ended.
fn event(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({ "type": kind, "object": object })).expect("JSON");
    line.push(b'\n');
    line.into()
}

fn bookmark(rv: &str) -> Bytes {
    let object = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "resourceVersion": rv },
    });
    event("BOOKMARK", &object)
}

/// A JSON watch that sends `events`, then stays open without a word.
fn watch_then_hold(events: Vec<Bytes>) -> Reply {
    let body = stream::iter(events).chain(stream::pending());
    Reply::streamed("application/json", body.boxed())
}

/// A JSON watch that sends `events`, then ends.
fn watch_then_end(events: Vec<Bytes>) -> Reply {
    Reply::streamed("application/json", stream::iter(events).boxed())
}

/// `len` bytes of `x`, in chunks of 64 KiB that share one buffer.
fn filler(len: usize) -> impl Stream<Item = Bytes> + Send + 'static {
    let chunk = Bytes::from(vec![b'x'; 64 << 10]);
    let full = len / chunk.len();
    let last = chunk.slice(..len % chunk.len());
    stream::iter(std::iter::repeat_n(chunk, full).chain([last]))
}

/// A list page at version 10 holding one ConfigMap whose data is `len` bytes.
fn list_with_an_object_of(len: usize) -> Reply {
    let head = r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"10"},"items":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"huge","namespace":"ns","resourceVersion":"9"},"data":{"v":""#;
    let body = stream::iter([Bytes::from_static(head.as_bytes())])
        .chain(filler(len))
        .chain(stream::iter([Bytes::from_static(br#""}}]}"#)]));
    Reply::streamed("application/json", body.boxed())
}

/// The version of the cached `ns/<name>`, if it is cached.
fn cached_rv(informer: &RunningInformer<ConfigMap>, name: &str) -> Option<String> {
    let object = informer.store().get_by_key(format!("ns/{name}"))?;
    object.metadata.resource_version.clone()
}

/// The cache as `name -> (resourceVersion, data.v)`.
fn cached(informer: &RunningInformer<ConfigMap>) -> BTreeMap<String, (String, String)> {
    informer
        .store()
        .list()
        .into_iter()
        .map(|cm| {
            let name = cm.metadata.name.clone().unwrap_or_default();
            let rv = cm.metadata.resource_version.clone().unwrap_or_default();
            let v = cm
                .data
                .as_ref()
                .and_then(|d| d.get("v").cloned())
                .unwrap_or_default();
            (name, (rv, v))
        })
        .collect()
}

fn state(entries: &[(&str, u64, &str)]) -> BTreeMap<String, (String, String)> {
    entries
        .iter()
        .map(|(name, rv, v)| ((*name).to_owned(), (rv.to_string(), (*v).to_owned())))
        .collect()
}

/// A gate that scripted replies wait at until the test opens it, so the test can look at
/// the informer between two answers.
#[derive(Clone)]
struct Gate(Arc<Semaphore>);

impl Gate {
    fn closed() -> Self {
        Self(Arc::new(Semaphore::new(0)))
    }

    async fn pass(&self) {
        let _ = self.0.acquire().await;
    }

    /// Opens it for good: each reply that passes gives the permit back.
    fn open(&self) {
        self.0.add_permits(1);
    }
}

/// Counts calls: each call gets the number of calls before it.
#[derive(Clone, Default)]
struct Counter(Arc<AtomicUsize>);

impl Counter {
    fn next(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_list_with_an_object_of_100_mib_is_refused_in_bounded_memory() {
    let _alone = MEMORY.write().await;
    let (lists, gate) = (Counter::default(), Gate::closed());
    let script_gate = gate.clone();
    let server = Server::start(move |request: Request| {
        let (list, gate) = (lists.clone(), script_gate.clone());
        async move {
            if request.is_watch() {
                return watch_then_hold(vec![]);
            }
            if list.next() > 0 {
                gate.pass().await;
                return page(10, &[config_map("small", 10, "s")], None);
            }
            list_with_an_object_of(100 * MIB)
        }
        .boxed()
    })
    .await;

    let peak = Peak::start();
    let (informer, mut errors) = informer(&server, |b| b);
    let informer = start(informer);
    let error = in_memory(
        peak.as_ref(),
        OBJECT_LIMIT + MARGIN,
        errors.next("the refusal of the 100 MiB list"),
    )
    .await;
    assert_eq!(error.kind, "decode", "{error:?}");
    assert!(error.text.contains("list configmaps"), "{error:?}");
    assert!(error.text.contains("larger than 64 MiB"), "{error:?}");
    assert!(!informer.has_synced(), "synced on a list that was refused");
    assert_eq!(informer.health(), InformerHealth::Syncing);
    // The client hung up well before the object's end.
    let outcome = server.outcome(0).await;
    assert!(matches!(outcome, Outcome::ClientGone { .. }), "{outcome:?}");
    assert!(
        outcome.body_bytes() <= OBJECT_LIMIT + MARGIN,
        "{} MiB of the 100 MiB list sent",
        outcome.body_bytes() / MIB
    );
    assert_peak_within(peak.as_ref(), OBJECT_LIMIT + MARGIN, "the 100 MiB list");

    // The next answer is a list that can be read: the informer syncs on it alone.
    gate.open();
    within("the sync", informer.wait_synced()).await;
    assert_eq!(cached(&informer), state(&[("small", 10, "s")]));
    informer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_one_off_lists_and_version_probes_refuse_an_object_of_100_mib() {
    // The reads outside the informer's list stream: a page read whole in JSON (a custom
    // resource's, or any kind asked for in JSON), the keys-and-versions page the
    // divergence check reads, and the probe of the server cache's version.
    let _alone = MEMORY.write().await;
    let server = Server::start(|request: Request| {
        async move {
            assert!(!request.is_watch(), "nothing here watches");
            list_with_an_object_of(100 * MIB)
        }
        .boxed()
    })
    .await;
    let config = Config::new(server.url().parse().expect("the server's URL"));
    let client = kube_informer::client(config).expect("a client");
    let api = Api::<ConfigMap>::namespaced(client, "ns");
    let in_json = ApiListWatch::new(api.clone()).wire_format(WireFormat::Json);
    let options = ListOptions::default();

    let peak = Peak::start();
    let bound = OBJECT_LIMIT + MARGIN;
    let refusals = [
        (
            "list",
            in_memory(peak.as_ref(), bound, in_json.list(&options))
                .await
                .map(|_| ()),
        ),
        (
            "list_versions",
            in_memory(
                peak.as_ref(),
                bound,
                ListWatch::list_versions(&api, &options),
            )
            .await
            .map(|_| ()),
        ),
        (
            "cached_version",
            in_memory(peak.as_ref(), bound, ListWatch::cached_version(&api))
                .await
                .map(|_| ()),
        ),
    ];
    for (request, (what, refusal)) in refusals.into_iter().enumerate() {
        let error = refusal.expect_err(what);
        assert_eq!(kind(&error), "decode", "{what}: {error}");
        assert!(
            error.to_string().contains("larger than 64 MiB"),
            "{what}: {error}"
        );
        let outcome = server.outcome(request).await;
        assert!(
            matches!(outcome, Outcome::ClientGone { .. }),
            "{what}: {outcome:?}"
        );
        assert!(
            outcome.body_bytes() <= bound,
            "{what}: {} MiB of the 100 MiB list sent",
            outcome.body_bytes() / MIB
        );
    }
    assert_peak_within(peak.as_ref(), bound, "one-off lists of a 100 MiB object");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_watch_event_of_100_mib_is_refused_in_bounded_memory() {
    let _alone = MEMORY.write().await;
    let (watches, gate) = (Counter::default(), Gate::closed());
    let script_gate = gate.clone();
    let server = Server::start(move |request: Request| {
        let (watch, gate) = (watches.clone(), script_gate.clone());
        async move {
            if !request.is_watch() {
                return page(10, &[config_map("a", 10, "a")], None);
            }
            if watch.next() > 0 {
                return watch_then_hold(vec![]);
            }
            gate.pass().await;
            let head = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"huge","namespace":"ns","resourceVersion":"11"},"data":{"v":""#;
            let body = stream::iter([Bytes::from_static(head.as_bytes())])
                .chain(filler(100 * MIB))
                .chain(stream::iter([Bytes::from_static(b"\"}}}\n")]));
            Reply::streamed("application/json", body.boxed())
        }
        .boxed()
    })
    .await;

    let (informer, mut errors) = informer(&server, |b| b);
    let informer = start(informer);
    within("the sync", informer.wait_synced()).await;
    let peak = Peak::start();
    gate.open();
    let error = in_memory(
        peak.as_ref(),
        OBJECT_LIMIT + MARGIN,
        errors.next("the refusal of the 100 MiB event"),
    )
    .await;
    assert_eq!(error.kind, "decode", "{error:?}");
    assert!(error.text.contains("watch configmaps"), "{error:?}");
    assert!(error.text.contains("larger than 64 MiB"), "{error:?}");
    // An event was lost, so the informer relists (from where it was, not older), and
    // then watches again; the cache never held the object.
    let log = server
        .wait_for("a relist and a second watch", |l| l.watches().len() >= 2)
        .await;
    let relist = log.lists()[1];
    assert_eq!(relist.param("resourceVersion"), Some("10"));
    assert_eq!(relist.param("resourceVersionMatch"), Some("NotOlderThan"));
    let first_watch = log
        .requests
        .iter()
        .position(Request::is_watch)
        .expect("a watch");
    let outcome = server.outcome(first_watch).await;
    assert!(matches!(outcome, Outcome::ClientGone { .. }), "{outcome:?}");
    assert!(
        outcome.body_bytes() <= OBJECT_LIMIT + MARGIN,
        "{} MiB of the 100 MiB event sent",
        outcome.body_bytes() / MIB
    );
    assert_peak_within(peak.as_ref(), OBJECT_LIMIT + MARGIN, "the 100 MiB event");
    assert!(informer.has_synced());
    assert_eq!(cached(&informer), state(&[("a", 10, "a")]));
    assert!(errors.rest().is_empty());
    informer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_watch_that_never_ends_a_frame_is_dropped_at_the_limit() {
    let _alone = MEMORY.write().await;
    let watches = Counter::default();
    let server = Server::start(move |request: Request| {
        let watch = watches.clone();
        async move {
            if !request.is_watch() {
                return page(10, &[config_map("a", 10, "a")], None);
            }
            match watch.next() {
                // A JSON line that goes on for as long as it is read.
                0 => {
                    let head = r#"{"type":"ADDED","object":{"metadata":{"name":"endless","namespace":"ns"},"data":{"v":""#;
                    let chunk = Bytes::from(vec![b'x'; 64 << 10]);
                    let body = stream::iter([Bytes::from_static(head.as_bytes())])
                        .chain(stream::repeat(chunk));
                    Reply::streamed("application/json", body.boxed())
                }
                // A protobuf frame that says it is 4 GiB long, then its first bytes.
                1 => {
                    let body = stream::iter([Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0a])])
                        .chain(stream::pending());
                    Reply::streamed(
                        "application/vnd.kubernetes.protobuf;stream=watch",
                        body.boxed(),
                    )
                }
                _ => watch_then_hold(vec![]),
            }
        }
        .boxed()
    })
    .await;

    let peak = Peak::start();
    let (informer, mut errors) = informer(&server, |b| b);
    let informer = start(informer);
    let endless = in_memory(
        peak.as_ref(),
        OBJECT_LIMIT + MARGIN,
        errors.next("the refusal of the endless line"),
    )
    .await;
    assert_eq!(endless.kind, "decode", "{endless:?}");
    assert!(endless.text.contains("watch configmaps"), "{endless:?}");
    assert!(endless.text.contains("larger than 64 MiB"), "{endless:?}");
    let frame = errors.next("the refusal of the 4 GiB frame").await;
    assert_eq!(frame.kind, "decode", "{frame:?}");
    assert!(frame.text.contains("larger than the limit"), "{frame:?}");
    let log = server
        .wait_for("a third watch", |l| l.watches().len() >= 3)
        .await;
    let first_watch = log.requests.iter().position(Request::is_watch).unwrap();
    let outcome = server.outcome(first_watch).await;
    assert!(matches!(outcome, Outcome::ClientGone { .. }), "{outcome:?}");
    assert!(
        outcome.body_bytes() <= OBJECT_LIMIT + MARGIN,
        "{} MiB of the endless line sent",
        outcome.body_bytes() / MIB
    );
    assert_peak_within(peak.as_ref(), OBJECT_LIMIT + MARGIN, "the endless line");
    // Each failed watch relisted from where the cache was, which never changed.
    for relist in &log.lists()[1..] {
        assert_eq!(relist.param("resourceVersion"), Some("10"));
        assert_eq!(relist.param("resourceVersionMatch"), Some("NotOlderThan"));
    }
    assert!(informer.has_synced());
    assert_eq!(cached(&informer), state(&[("a", 10, "a")]));
    informer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_watch_that_trickles_a_frame_is_replaced_at_the_idle_timeout() {
    let _shared = MEMORY.read().await;
    let watches = Counter::default();
    let server = Server::start(move |request: Request| {
        let watch = watches.clone();
        async move {
            if !request.is_watch() {
                return page(10, &[config_map("a", 10, "a")], None);
            }
            if watch.next() > 0 {
                return watch_then_hold(vec![]);
            }
            // A byte every 50 ms, none of them a newline: alive, but never an event.
            let trickle = stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Some((Bytes::from_static(b" "), ()))
            });
            let body = stream::iter([Bytes::from_static(br#"{"type":"ADDED""#)]).chain(trickle);
            Reply::streamed("application/json", body.boxed())
        }
        .boxed()
    })
    .await;

    let (informer, mut errors) = informer(&server, |b| b.idle_timeout(Duration::from_millis(500)));
    let informer = start(informer);
    let error = errors.next("the idle timeout").await;
    assert_eq!(error.kind, "idle", "{error:?}");
    let log = server
        .wait_for("a second watch", |l| l.watches().len() >= 2)
        .await;
    // Reconnected from the same version, without a relist.
    assert_eq!(log.lists().len(), 1);
    assert_eq!(log.watches()[1].param("resourceVersion"), Some("10"));
    let first_watch = log.requests.iter().position(Request::is_watch).unwrap();
    let outcome = server.outcome(first_watch).await;
    assert!(matches!(outcome, Outcome::ClientGone { .. }), "{outcome:?}");
    assert!(outcome.body_bytes() < 1024, "{outcome:?}");
    assert!(informer.has_synced());
    assert_eq!(cached(&informer), state(&[("a", 10, "a")]));
    informer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_watch_whose_versions_go_backwards_never_reaches_the_cache() {
    let _shared = MEMORY.read().await;
    let (lists, watches) = (Counter::default(), Counter::default());
    let server = Server::start(move |request: Request| {
        let (list, watch) = (lists.clone(), watches.clone());
        async move {
            if !request.is_watch() {
                return match list.next() {
                    0 => page(6, &[config_map("a", 5, "5"), config_map("b", 6, "6")], None),
                    // What the server really holds.
                    _ => page(8, &[config_map("a", 8, "8"), config_map("b", 6, "6")], None),
                };
            }
            match watch.next() {
                // A change at 8, then a stale one at 7 (as a replay from the past).
                0 => watch_then_hold(vec![
                    event("MODIFIED", &config_map("a", 8, "8")),
                    event("MODIFIED", &config_map("a", 7, "stale")),
                ]),
                _ => watch_then_hold(vec![]),
            }
        }
        .boxed()
    })
    .await;

    let (informer, mut errors) = informer(&server, |b| b);
    let mut changes = Changes::record(&informer);
    let informer = start(informer);
    let error = errors.next("the stale change").await;
    assert_eq!(error.kind, "malformed", "{error:?}");
    assert!(
        error
            .text
            .contains("change of ns/a: resourceVersion 7 is older than 8"),
        "{error:?}"
    );
    let log = server
        .wait_for("a relist and a second watch", |l| l.watches().len() >= 2)
        .await;
    let relist = log.lists()[1];
    assert_eq!(relist.param("resourceVersion"), Some("8"));
    assert_eq!(relist.param("resourceVersionMatch"), Some("NotOlderThan"));
    assert_eq!(log.watches()[1].param("resourceVersion"), Some("8"));
    assert_eq!(
        cached(&informer),
        state(&[("a", 8, "8"), ("b", 6, "6")]),
        "the cache is the server's state"
    );
    assert_eq!(informer.last_sync_resource_version().as_deref(), Some("8"));
    // The handler saw every change once, and never the stale one.
    let seen = changes.so_far().await;
    assert_eq!(seen, ["add a@5=5", "add b@6=6", "update a@8=8"]);
    assert!(errors.rest().is_empty());
    informer.stop().await;
}

/// What a handler was told, as `add name@rv=data.v` and `update name@rv=data.v`.
struct Changes {
    registration: HandlerRegistration,
    seen: mpsc::UnboundedReceiver<String>,
}

impl Changes {
    fn record(informer: &SharedInformer<ConfigMap>) -> Self {
        let (added, seen) = mpsc::unbounded_channel();
        let updated = added.clone();
        let registration = informer
            .add_handler(
                handler_fn()
                    .on_add(move |cm: &Arc<ConfigMap>, _| {
                        let _ = added.send(format!("add {}", describe(cm)));
                    })
                    .on_update(move |_, cm: &Arc<ConfigMap>, _| {
                        let _ = updated.send(format!("update {}", describe(cm)));
                    }),
            )
            .expect("an informer that has not run has not stopped");
        Self { registration, seen }
    }

    /// What it was told of everything queued for it so far.
    async fn so_far(&mut self) -> Vec<String> {
        until("the handler caught up", || {
            self.registration.stats().waiting == 0
        })
        .await;
        std::iter::from_fn(|| self.seen.try_recv().ok()).collect()
    }
}

/// `name@rv=data.v`.
fn describe(cm: &ConfigMap) -> String {
    format!(
        "{}@{}={}",
        cm.metadata.name.as_deref().unwrap_or(""),
        cm.metadata.resource_version.as_deref().unwrap_or(""),
        cm.data
            .as_ref()
            .and_then(|d| d.get("v"))
            .map_or("", String::as_str)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_watch_events_that_repeat_are_applied_once() {
    let _shared = MEMORY.read().await;
    let watches = Counter::default();
    let server = Server::start(move |request: Request| {
        let watch = watches.clone();
        async move {
            if !request.is_watch() {
                return page(5, &[config_map("a", 5, "5")], None);
            }
            match watch.next() {
                0 => watch_then_end(vec![
                    event("MODIFIED", &config_map("a", 7, "7")),
                    event("MODIFIED", &config_map("a", 7, "7")),
                    event("ADDED", &config_map("b", 8, "8")),
                    event("ADDED", &config_map("b", 8, "8")),
                    bookmark("8"),
                    bookmark("8"),
                ]),
                _ => watch_then_hold(vec![]),
            }
        }
        .boxed()
    })
    .await;

    let (informer, mut errors) = informer(&server, |b| b);
    let mut changes = Changes::record(&informer);
    let informer = start(informer);
    let log = server
        .wait_for("the watch resumed", |l| l.watches().len() >= 2)
        .await;
    // The watch ended normally and resumed where it was, as client-go does: no relist.
    assert_eq!(log.lists().len(), 1);
    assert_eq!(log.watches()[1].param("resourceVersion"), Some("8"));
    assert_eq!(cached(&informer), state(&[("a", 7, "7"), ("b", 8, "8")]));
    let seen = changes.so_far().await;
    assert_eq!(seen, ["add a@5=5", "update a@7=7", "add b@8=8"]);
    assert!(errors.rest().is_empty());
    informer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bookmarks_with_garbage_versions_are_reported_and_ignored() {
    let _shared = MEMORY.read().await;
    let watches = Counter::default();
    let long_garbage: &'static str = "z".repeat(MIB).leak();
    let server = Server::start(move |request: Request| {
        let watch = watches.clone();
        async move {
            if !request.is_watch() {
                return page(5, &[config_map("a", 5, "5")], None);
            }
            match watch.next() {
                0 => watch_then_end(vec![
                    event("MODIFIED", &config_map("a", 6, "6")),
                    bookmark("not-a-version"),
                    bookmark("3"),
                    bookmark("99999999999999999999999"),
                    bookmark(long_garbage),
                    bookmark(""),
                    event("MODIFIED", &config_map("a", 7, "7")),
                ]),
                _ => watch_then_hold(vec![]),
            }
        }
        .boxed()
    })
    .await;

    let (informer, mut errors) = informer(&server, |b| b);
    let informer = start(informer);
    let log = server
        .wait_for("the watch resumed", |l| l.watches().len() >= 2)
        .await;
    // The resume point is the last good version: the garbage never became it.
    assert_eq!(log.watches()[1].param("resourceVersion"), Some("7"));
    assert_eq!(log.lists().len(), 1, "no relist");
    assert_eq!(informer.last_sync_resource_version().as_deref(), Some("7"));
    assert!(informer.has_synced());
    assert_eq!(cached(&informer), state(&[("a", 7, "7")]));
    let reported: Vec<Reported> = errors.rest();
    let says = [
        "\"not-a-version\" is not a version",
        "resourceVersion 3 is older than 6",
        "99999999999999999999999\" is not a version",
        "zzz…zzzzzzzzzzzzzzzz\" (1048576 bytes) is not a version",
    ];
    assert_eq!(
        reported.len(),
        says.len(),
        "an empty version is no error: {reported:?}"
    );
    for (error, says) in reported.iter().zip(says) {
        assert_eq!(error.kind, "malformed", "{error:?}");
        assert!(error.text.contains(says), "{error:?} does not say {says:?}");
        assert!(error.text.ends_with("; ignored"), "{error:?}");
        assert!(
            error.text.len() < 300,
            "a message of {} bytes",
            error.text.len()
        );
    }
    informer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_list_whose_continue_token_loops_is_cut_short() {
    let _shared = MEMORY.read().await;
    let (third_pages, gate) = (Counter::default(), Gate::closed());
    let script_gate = gate.clone();
    let server = Server::start(move |request: Request| {
        let (third_page, gate) = (third_pages.clone(), script_gate.clone());
        async move {
            if request.is_watch() {
                return watch_then_hold(vec![]);
            }
            let items = |a: &str, b: &str| [config_map(a, 1, a), config_map(b, 2, b)];
            match request.param("continue") {
                None => page(10, &items("a", "b"), Some("t1")),
                Some("t1") => page(10, &items("c", "d"), Some("t2")),
                // The first time, back to the second page; then the list's end.
                Some("t2") if third_page.next() == 0 => page(10, &items("e", "f"), Some("t1")),
                Some("t2") => {
                    gate.pass().await;
                    page(10, &items("e", "f"), None)
                }
                Some(other) => panic!("no such token {other:?}"),
            }
        }
        .boxed()
    })
    .await;

    let (informer, mut errors) = informer(&server, |b| b.page_size(2));
    let informer = start(informer);
    // The loop was never followed: the next list started again from its first page.
    let log = server
        .wait_for("six pages asked for", |l| l.lists().len() >= 6)
        .await;
    let tokens: Vec<Option<&str>> = log.lists().iter().map(|r| r.param("continue")).collect();
    assert_eq!(
        tokens,
        [None, Some("t1"), Some("t2"), None, Some("t1"), Some("t2")]
    );
    assert!(
        log.lists().iter().all(|r| r.param("limit") == Some("2")),
        "{log:?}"
    );
    assert!(
        log.requests
            .iter()
            .all(|r| r.path == "/api/v1/namespaces/ns/configmaps"),
        "{log:?}"
    );
    let error = errors.next("the loop").await;
    assert_eq!(error.kind, "continue loop", "{error:?}");
    assert!(
        error
            .text
            .contains("continue token \"t1\" came back after 3 pages"),
        "{error:?}"
    );
    assert!(!informer.has_synced(), "synced on a list that never ended");
    gate.open();
    within("the sync", informer.wait_synced()).await;
    assert_eq!(informer.store().len(), 6);
    assert!(errors.rest().is_empty());
    informer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_html_with_status_200_is_a_decode_error_naming_the_resource() {
    let _shared = MEMORY.read().await;
    let (lists, watches, gate) = (Counter::default(), Counter::default(), Gate::closed());
    let script_gate = gate.clone();
    let html = || Reply {
        status: 200,
        headers: vec![("Content-Type", "text/html; charset=utf-8".to_owned())],
        body: Body::Full(
            b"<html><body><h1>Sign in</h1><p>{\"not\": \"json\"}</p></body></html>\n".to_vec(),
        ),
    };
    let server = Server::start(move |request: Request| {
        let (list, watch, gate) = (lists.clone(), watches.clone(), script_gate.clone());
        async move {
            if request.is_watch() {
                return match watch.next() {
                    0 => html(),
                    _ => watch_then_hold(vec![]),
                };
            }
            match list.next() {
                0 => html(),
                _ => {
                    gate.pass().await;
                    page(10, &[config_map("a", 10, "a")], None)
                }
            }
        }
        .boxed()
    })
    .await;

    let (informer, mut errors) = informer(&server, |b| b);
    let informer = start(informer);
    let error = errors.next("the HTML list").await;
    assert_eq!(error.kind, "decode", "{error:?}");
    assert!(error.text.contains("list configmaps"), "{error:?}");
    assert!(error.text.contains("text/html"), "{error:?}");
    assert!(!informer.has_synced(), "synced on a login page");
    assert_eq!(informer.health(), InformerHealth::Syncing);

    gate.open();
    within("the sync", informer.wait_synced()).await;
    let error = errors.next("the HTML watch").await;
    assert_eq!(error.kind, "decode", "{error:?}");
    assert!(error.text.contains("watch configmaps"), "{error:?}");
    assert!(error.text.contains("text/html"), "{error:?}");
    let log = server
        .wait_for("a relist and a second watch", |l| l.watches().len() >= 2)
        .await;
    assert_eq!(log.lists().len(), 3);
    assert_eq!(log.lists()[2].param("resourceVersion"), Some("10"));
    assert!(informer.has_synced());
    assert_eq!(cached(&informer), state(&[("a", 10, "a")]));
    informer.stop().await;
}

/// `data` as one gzip member of a single stored (uncompressed) block: a valid gzip body,
/// built by hand.
fn gzip(data: &[u8]) -> Vec<u8> {
    let len = u16::try_from(data.len()).expect("one stored block");
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    out.push(1); // the last block, stored
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_gzip_body_cut_short_is_a_clear_error_then_retried() {
    let _shared = MEMORY.read().await;
    let (lists, gate) = (Counter::default(), Gate::closed());
    let script_gate = gate.clone();
    let server = Server::start(move |request: Request| {
        let (list, gate) = (lists.clone(), script_gate.clone());
        async move {
            if request.is_watch() {
                return watch_then_hold(vec![]);
            }
            if list.next() == 0 {
                let list = json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMapList",
                    "metadata": { "resourceVersion": "10" },
                    "items": [config_map("a", 10, "a")],
                });
                let body = gzip(&serde_json::to_vec(&list).unwrap());
                return Reply {
                    status: 200,
                    headers: vec![
                        ("Content-Type", "application/json".to_owned()),
                        ("Content-Encoding", "gzip".to_owned()),
                    ],
                    body: Body::CutShort {
                        claimed: body.len(),
                        sent: body[..body.len() / 2].to_vec(),
                    },
                };
            }
            gate.pass().await;
            page(10, &[config_map("a", 10, "a")], None)
        }
        .boxed()
    })
    .await;

    let (informer, mut errors) = informer(&server, |b| b);
    let informer = start(informer);
    let error = errors.next("the gzip body").await;
    assert_eq!(error.kind, "decode", "{error:?}");
    assert!(error.text.contains("list configmaps"), "{error:?}");
    assert!(
        error.text.contains("Content-Encoding \"gzip\""),
        "{error:?}"
    );
    assert!(!informer.has_synced(), "synced on half a body");
    gate.open();
    within("the sync", informer.wait_synced()).await;
    assert_eq!(cached(&informer), state(&[("a", 10, "a")]));
    informer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_cut_short_are_transport_errors_then_retried() {
    let _shared = MEMORY.read().await;
    let (lists, watches, gate) = (Counter::default(), Counter::default(), Gate::closed());
    let script_gate = gate.clone();
    let cut = |body: Vec<u8>, keep: usize| Reply {
        status: 200,
        headers: vec![("Content-Type", "application/json".to_owned())],
        body: Body::CutShort {
            claimed: body.len(),
            sent: body[..keep].to_vec(),
        },
    };
    let server = Server::start(move |request: Request| {
        let (list, watch, gate) = (lists.clone(), watches.clone(), script_gate.clone());
        async move {
            if request.is_watch() {
                return match watch.next() {
                    // One whole event, then half of the next, then the connection closes.
                    0 => {
                        let whole = event("MODIFIED", &config_map("a", 11, "11"));
                        let half = event("MODIFIED", &config_map("a", 12, "12"));
                        let body = [whole.as_ref(), half.as_ref()].concat();
                        let keep = whole.len() + half.len() / 2;
                        cut(body, keep)
                    }
                    _ => watch_then_hold(vec![]),
                };
            }
            let items = [config_map("a", 10, "10"), config_map("b", 10, "b")];
            let Body::Full(body) = page(10, &items, None).body else {
                unreachable!("a page is sent whole")
            };
            match list.next() {
                0 => cut(body.clone(), body.len() - 40),
                _ => {
                    gate.pass().await;
                    page(10, &items, None)
                }
            }
        }
        .boxed()
    })
    .await;

    let (informer, mut errors) = informer(&server, |b| b);
    let informer = start(informer);
    let error = errors.next("the list cut short").await;
    assert_eq!(error.kind, "transport", "{error:?}");
    assert!(error.text.contains("list configmaps"), "{error:?}");
    assert!(!informer.has_synced(), "synced on a list cut short");

    gate.open();
    within("the sync", informer.wait_synced()).await;
    let error = errors.next("the watch cut short").await;
    assert_eq!(error.kind, "transport", "{error:?}");
    assert!(error.text.contains("watch configmaps"), "{error:?}");
    // The event that arrived whole was applied; the watch resumed after it, no relist.
    let log = server
        .wait_for("the watch resumed", |l| l.watches().len() >= 2)
        .await;
    assert_eq!(log.watches()[1].param("resourceVersion"), Some("11"));
    assert_eq!(log.lists().len(), 2);
    assert_eq!(cached(&informer), state(&[("a", 11, "11"), ("b", 10, "b")]));
    informer.stop().await;
}

/// A gate a handler waits at, on its thread, until the test opens it.
#[derive(Clone, Default)]
struct HandlerGate(Arc<HandlerGateState>);

#[derive(Default)]
struct HandlerGateState {
    open: Mutex<bool>,
    opened: Condvar,
}

impl HandlerGate {
    fn pass(&self) {
        tokio::task::block_in_place(|| {
            let mut open = self.0.open.lock().unwrap();
            while !*open {
                open = self.0.opened.wait(open).unwrap();
            }
        });
    }

    fn open(&self) {
        *self.0.open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.0.opened.notify_all();
    }
}

/// Opens its gate when dropped: a test that fails leaves no handler stuck, which would
/// hold it up for ever (a runtime waits for its blocked threads before it goes).
struct OpensOnDrop(HandlerGate);

impl Drop for OpensOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_flood_of_events_faster_than_the_handler_keeps_its_backlog_bounded() {
    let _shared = MEMORY.read().await;
    const OBJECTS: u64 = 100;
    const EVENTS: u64 = 20_000;
    // Object `i` is listed at version `i + 1`; event `j` changes object `j % OBJECTS` to
    // version `OBJECTS + 1 + j`.
    let final_rv = |i: u64| OBJECTS + 1 + (EVENTS - OBJECTS) + i;
    let name = |i: u64| format!("o{i:03}");
    let watches = Counter::default();
    let server = Server::start(move |request: Request| {
        let watch = watches.clone();
        async move {
            if !request.is_watch() {
                let items: Vec<Value> = (0..OBJECTS)
                    .map(|i| config_map(&name(i), i + 1, "0"))
                    .collect();
                return page(OBJECTS, &items, None);
            }
            if watch.next() > 0 {
                return watch_then_hold(vec![]);
            }
            // Events made as they are sent, many to a chunk, as fast as the client reads.
            let chunks = (0..EVENTS / 200).map(move |c| {
                let mut chunk = Vec::new();
                for j in c * 200..(c + 1) * 200 {
                    let rv = OBJECTS + 1 + j;
                    let object = config_map(&name(j % OBJECTS), rv, &rv.to_string());
                    chunk.extend_from_slice(&event("MODIFIED", &object));
                }
                Bytes::from(chunk)
            });
            let body = stream::iter(chunks).chain(stream::pending());
            Reply::streamed("application/json", body.boxed())
        }
        .boxed()
    })
    .await;

    let (informer, mut errors) = informer(&server, |b| b);
    // A handler that stops at its first change until the test lets it go on, and keeps
    // the last version it saw of each object.
    let gate = HandlerGate::default();
    let _unstuck = OpensOnDrop(gate.clone());
    let last_seen = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let (handler_gate, seen_add, seen_update) =
        (gate.clone(), last_seen.clone(), last_seen.clone());
    let note = |seen: &Mutex<BTreeMap<String, u64>>, cm: &ConfigMap| {
        let rv = cm
            .metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse()
            .unwrap();
        let name = cm.metadata.name.clone().unwrap();
        seen.lock().unwrap().insert(name, rv);
    };
    let registration = informer
        .add_handler(
            handler_fn()
                .on_add(move |cm: &Arc<ConfigMap>, _| note(&seen_add, cm))
                .on_update(move |_, cm: &Arc<ConfigMap>, delivery| {
                    if delivery == Delivery::Live {
                        handler_gate.pass();
                    }
                    note(&seen_update, cm);
                }),
        )
        .expect("a handler");
    let informer = start(informer);

    // The cache follows the server while the handler is stuck.
    until("the cache holds the server's last versions", || {
        (0..OBJECTS).all(|i| cached_rv(&informer, &name(i)) == Some(final_rv(i).to_string()))
    })
    .await;
    // The last change is stored a moment before it is queued for the handler.
    until("every event queued", || {
        let stats = registration.stats();
        stats.delivered + stats.waiting + stats.coalesced == OBJECTS + EVENTS
    })
    .await;
    let stats = registration.stats();
    let bound = HANDLER_COALESCE_AFTER + 3 * OBJECTS;
    assert!(
        stats.waiting <= bound,
        "{} events wait for the stuck handler, more than {bound}",
        stats.waiting
    );
    assert!(stats.coalesced >= EVENTS - bound, "{stats:?}");

    // Let go, it ends with every object's last state, having handled far fewer events.
    gate.open();
    until("the handler saw every object's last version", || {
        let seen = last_seen.lock().unwrap();
        (0..OBJECTS).all(|i| seen.get(&name(i)) == Some(&final_rv(i)))
    })
    .await;
    until("the handler's backlog drained", || {
        registration.stats().waiting == 0
    })
    .await;
    let stats = registration.stats();
    assert!(
        stats.delivered <= OBJECTS + bound,
        "{} events handled",
        stats.delivered
    );
    assert_eq!(server.log().lists().len(), 1, "the flood needed no relist");
    assert!(errors.rest().is_empty());
    informer.stop().await;
}
