//! The kube-informer subject of the informer benchmark: a [`SharedInformer`] on the Pods
//! of one namespace that counts events and keeps the cache. See `benches::SubjectArgs`
//! for the protocol. With no flag it runs the library's defaults (a streaming list, a
//! compact cache of the bytes the server sent) through the client the guides recommend
//! (`kube_informer::client`, HTTP/2); `--client kube` uses kube-client's default (HTTP/1.1)
//! instead, `--paged-list` turns on the informer option of that name, `--cache decoded`
//! keeps decoded objects and `--cache json-codec` compact JSON encoded by the store (the
//! compact cache before it kept the server's bytes); `--json` reads JSON instead of
//! protobuf; `--object lazy` caches `LazyObject<Pod>`s, whose metadata alone is decoded
//! on arrival (its full reads decode the whole Pod, so they compare with the others'). Every
//! configuration indexes the Pods by their `bench-group` label.
//!
//! The reconcile case (`--reconciles`) is a controller as the library's users write one: the
//! update handler adds the key of each Pod whose `bench-reconcile` label changed to a
//! [`Queue`], and one worker reads the Pod back by key and lists its group through a
//! [`Lister`] by label [`Selector`].
//!
//! The controller case (`--controller`) sees the updates through a [`Controller`] on the
//! informer instead of the update handler: its reconcile reads the Pod from the cache by
//! key, as the client-go tutorials' sync does, and records the update the Pod carries, so
//! the latencies the driver reads are from each update to its reconcile. `--tracing
//! otlp-unreachable` (a build with the `opentelemetry` feature) runs it with the library's
//! spans exported by [`OtlpTracing`](kube_informer::telemetry::OtlpTracing) to a collector
//! that is down: what a user who turned tracing on pays while the collector is out.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{
        Arc, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

use anyhow::Context;
use benches::{
    GROUP_LABEL, LabelsReads, PodLabels, RECONCILE_LABEL, RELIST_LABEL, ReconcileLine, Recorder,
    RelistLine, SubjectArgs, UPDATE_LABEL,
};
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kube_client::{Api, Client, Resource};
use kube_informer::{
    Controller, Lister, ObjectKey, RunningInformer, Selector, SharedInformer, Store, WorkingSet,
    codec::JsonCodec,
    handler_fn,
    list_watch::LazyObject,
    list_watch::{ApiListWatch, WireFormat},
    retry_up_to,
    store::label_index,
    sync_by_key,
    workqueue::Queue,
};
use serde::{Serialize, de::DeserializeOwned};
use tokio_util::sync::CancellationToken;

/// How the cache keeps objects.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Cache {
    /// The default: compact, as the bytes the server sent.
    Wire,
    /// Decoded, shared objects (`InformerBuilder::decoded`).
    Decoded,
    /// Compact JSON the store encodes and checks (`InformerBuilder::codec(JsonCodec)`).
    JsonCodec,
}

/// What the informer caches.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Object {
    /// `Pod`s, decoded whole as they arrive.
    Pod,
    /// `LazyObject<Pod>`s: the metadata decoded as they arrive, the rest on demand.
    Lazy,
}

/// What the subject's reads do with the objects of a cache of its kind.
trait Cached: Sized {
    /// Whether a cached object reads whole, as a `get` of a `Pod` cache returns it.
    fn read_whole(&self) -> bool;
    /// The labels alone, read as this cache reads the least: how many the object at
    /// `key` has.
    fn labels_get(store: &Store<Self>, key: &str) -> anyhow::Result<usize>;
    /// How many of all the objects have labels.
    fn labels_list(store: &Store<Self>) -> anyhow::Result<usize>;
    /// How many of a `bench-group`'s objects have labels.
    fn labels_by_index(store: &Store<Self>, group: &str) -> anyhow::Result<usize>;
}

/// A `Pod` cache reads the labels alone as a projection of the stored bytes.
impl Cached for Pod {
    fn read_whole(&self) -> bool {
        true
    }

    fn labels_get(store: &Store<Self>, key: &str) -> anyhow::Result<usize> {
        Ok(store
            .get_as::<PodLabels>(key)?
            .map_or(0, |pod| pod.metadata.labels.len()))
    }

    fn labels_list(store: &Store<Self>) -> anyhow::Result<usize> {
        Ok(labelled(store.list_as::<PodLabels>()?))
    }

    fn labels_by_index(store: &Store<Self>, group: &str) -> anyhow::Result<usize> {
        Ok(labelled(
            store.by_index_as::<PodLabels>(GROUP_LABEL, group)?,
        ))
    }
}

/// A `LazyObject` cache reads them from the cached objects' metadata, and decodes the
/// whole Pod for a whole read.
impl Cached for LazyObject<Pod> {
    fn read_whole(&self) -> bool {
        self.decode().is_ok()
    }

    fn labels_get(store: &Store<Self>, key: &str) -> anyhow::Result<usize> {
        Ok(store
            .get_by_key(key)
            .and_then(|pod| pod.metadata.labels.as_ref().map(BTreeMap::len))
            .unwrap_or(0))
    }

    fn labels_list(store: &Store<Self>) -> anyhow::Result<usize> {
        Ok(labelled_lazy(&store.list()))
    }

    fn labels_by_index(store: &Store<Self>, group: &str) -> anyhow::Result<usize> {
        Ok(labelled_lazy(&store.by_index(GROUP_LABEL, group)?))
    }
}

fn labelled(pods: Vec<PodLabels>) -> usize {
    pods.iter()
        .filter(|pod| !pod.metadata.labels.is_empty())
        .count()
}

fn labelled_lazy(pods: &[Arc<LazyObject<Pod>>]) -> usize {
    pods.iter()
        .filter(|pod| pod.metadata.labels.as_ref().is_some_and(|l| !l.is_empty()))
        .count()
}

/// The reconcile case's side of the update handler: the controller's queue of Pod keys.
struct ReconcileQueue {
    queue: Queue<ObjectKey>,
    /// The changes the driver makes; the queue shuts down once the handler saw them all,
    /// so the worker stops when it has reconciled the last key.
    expected: usize,
    /// Changes seen so far.
    events: AtomicUsize,
    /// When the handler saw the first.
    first: OnceLock<Instant>,
}

impl ReconcileQueue {
    fn new(expected: usize) -> Self {
        Self {
            queue: Queue::new(),
            expected,
            events: AtomicUsize::new(0),
            first: OnceLock::new(),
        }
    }

    /// Queues the key of `new` if the update changed its `bench-reconcile` label, as a
    /// controller's handler filters the updates it acts on.
    fn on_update<K: Resource>(&self, old: &K, new: &K) {
        fn label<K: Resource>(o: &K) -> Option<&String> {
            o.meta().labels.as_ref()?.get(RECONCILE_LABEL)
        }
        if label(new).is_none() || label(old) == label(new) {
            return;
        }
        let Ok(key) = ObjectKey::from_object(new) else {
            return;
        };
        self.first.get_or_init(Instant::now);
        self.queue.add(key);
        if self.events.fetch_add(1, Ordering::Relaxed) + 1 == self.expected {
            self.queue.shutdown();
        }
    }

    /// Runs the worker: reconciles each key until the queue is shut down and empty, then
    /// returns the line to print.
    ///
    /// # Errors
    ///
    /// When a key's Pod is not in the cache, has no group, or its group's list is not whole.
    async fn work<K: Resource>(
        &self,
        lister: &Lister<K>,
        pods: usize,
    ) -> anyhow::Result<ReconcileLine> {
        let before = lister.store().working_set();
        let mut read_ns = Vec::with_capacity(self.expected);
        let mut last_end = Instant::now();
        while let Some(key) = self.queue.get().await {
            let started = Instant::now();
            let read = reconcile_reads(lister, &key);
            last_end = Instant::now();
            read_ns.push((last_end - started).as_nanos() as f64);
            self.queue.done(&key);
            let (group, len) = read?;
            benches::check_group("kube-informer", pods, &group, len)?;
        }
        let first = *self
            .first
            .get()
            .context("the queue shut down before any event")?;
        let mut line = ReconcileLine::now(
            "kube-informer",
            self.events.load(Ordering::Relaxed),
            read_ns,
            last_end - first,
        );
        let after = lister.store().working_set();
        line.working_set_hits = Some(after.hits - before.hits);
        line.working_set_misses = Some(after.misses - before.misses);
        Ok(line)
    }
}

/// A ReplicaSet-style reconcile's reads of the cache: the Pod under `key`, then every Pod
/// of its group by label selector. Returns the group and how many Pods the list returned.
fn reconcile_reads<K: Resource>(
    lister: &Lister<K>,
    key: &ObjectKey,
) -> anyhow::Result<(String, usize)> {
    let pod = lister
        .store()
        .get_by_key(key)
        .with_context(|| format!("kube-informer: {key} is not in the cache"))?;
    let group = pod
        .meta()
        .labels
        .as_ref()
        .and_then(|l| l.get(GROUP_LABEL))
        .with_context(|| format!("kube-informer: {key} has no {GROUP_LABEL} label"))?;
    let selector: Selector = format!("{GROUP_LABEL}={group}").parse()?;
    Ok((group.clone(), lister.list_selector(&selector).len()))
}

/// The controller case (`--controller`): a [`Controller`] on the running informer whose
/// reconcile records the update each Pod carries.
struct ControllerCase {
    /// The `bench-update` values the Pods carried when the subject synced, left there by
    /// earlier runs: the first reconciles, one per cached Pod, see them, and they are not
    /// this run's. Unset until then, when no update of this run can have come yet.
    earlier_updates: Arc<OnceLock<HashSet<String>>>,
    cancel: CancellationToken,
    run: tokio::task::JoinHandle<Result<(), kube_informer::Error>>,
}

impl ControllerCase {
    /// Starts the controller; its reconcile is the client-go tutorials' sync, which reads
    /// the Pod from the cache by key, and tells `recorder` of the update it carries.
    fn start<K>(informer: &RunningInformer<K>, recorder: Arc<Recorder>) -> Self
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Send
            + Sync
            + 'static,
    {
        let earlier_updates: Arc<OnceLock<HashSet<String>>> = Arc::default();
        let store = informer.store();
        let earlier = earlier_updates.clone();
        let sync = move |key: ObjectKey, _: Arc<()>| {
            if let (Some(earlier), Some(pod)) = (earlier.get(), store.get_by_key(&key)) {
                let labels = pod.meta().labels.as_ref();
                if labels
                    .and_then(|l| l.get(UPDATE_LABEL))
                    .is_some_and(|update| !earlier.contains(update))
                {
                    recorder.saw(labels);
                }
            }
            std::future::ready(Ok::<(), std::convert::Infallible>(()))
        };
        let cancel = CancellationToken::new();
        let run = Controller::new("informer-bench", informer.handle()).run(
            (sync_by_key(sync), retry_up_to(5), Arc::new(())),
            cancel.clone(),
        );
        Self {
            earlier_updates,
            cancel,
            run: tokio::spawn(run),
        }
    }

    /// The subject synced `store`: from now on an update value it does not hold is this
    /// run's.
    fn synced<K: Resource>(&self, store: &Store<K>) {
        let earlier = store
            .list()
            .iter()
            .filter_map(|pod| pod.meta().labels.as_ref()?.get(UPDATE_LABEL).cloned())
            .collect();
        let _ = self.earlier_updates.set(earlier);
    }

    /// Stops the controller and waits for it.
    ///
    /// # Errors
    ///
    /// When the controller failed or its task panicked.
    async fn stop(self) -> anyhow::Result<()> {
        self.cancel.cancel();
        Ok(self.run.await??)
    }
}

/// Which API client the informer lists and watches through.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ClientKind {
    /// The one the library recommends: `kube_informer::client`, HTTP/2 with keep-alive pings.
    Informer,
    /// kube-client's default, `Client::try_from(config)`: HTTP/1.1, a connection per watch.
    Kube,
}

/// Whether the library's spans are exported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Tracing {
    /// No subscriber: the spans, if the build has them, are disabled.
    Off,
    /// [`OtlpTracing`](kube_informer::telemetry::OtlpTracing) exporting over OTLP/HTTP to a
    /// local port where nothing listens, its layer in the subscriber at `INFO` (the
    /// library's spans; a deployment does not turn its dependencies' per-frame `TRACE`
    /// spans into exported ones): tracing turned on while the collector is down. Needs a
    /// build with the `opentelemetry` feature.
    OtlpUnreachable,
}

/// The subject's command line: the common one plus the informer's options.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    common: SubjectArgs,
    /// Sync by paged lists instead of a streaming list (`sendInitialEvents`, the default).
    #[arg(long)]
    paged_list: bool,
    /// How the cache keeps objects.
    #[arg(long, value_enum, default_value_t = Cache::Wire)]
    cache: Cache,
    /// List and watch in JSON instead of protobuf.
    #[arg(long)]
    json: bool,
    /// The API client.
    #[arg(long, value_enum, default_value_t = ClientKind::Informer)]
    client: ClientKind,
    /// What the informer caches.
    #[arg(long, value_enum, default_value_t = Object::Pod)]
    object: Object,
    /// The compact cache's working set budget in MiB (0: none); the library's default
    /// when absent.
    #[arg(long)]
    working_set_mib: Option<usize>,
    /// Record each update when a [`Controller`]'s reconcile reads its Pod, instead of in
    /// the update handler.
    #[arg(long)]
    controller: bool,
    /// Whether the library's spans are exported.
    #[arg(long, value_enum, default_value_t = Tracing::Off)]
    tracing: Tracing,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    let args = Args::parse();
    // Installed before the client is built, so its requests are spans too; kept until the
    // subject ends (dropping it flushes to the absent collector).
    let _tracing = match args.tracing {
        Tracing::Off => None,
        Tracing::OtlpUnreachable => Some(otlp_to_nowhere()?),
    };
    let client = match args.client {
        ClientKind::Informer => benches::informer_client(&args.common.kubeconfig).await?,
        ClientKind::Kube => benches::client(&args.common.kubeconfig).await?,
    };
    match args.object {
        Object::Pod => run::<Pod>(started, args, client).await,
        Object::Lazy => run::<LazyObject<Pod>>(started, args, client).await,
    }
}

/// Installs [`OtlpTracing`](kube_informer::telemetry::OtlpTracing) exporting to a local port
/// that was free a moment ago and is closed now, so every export is refused as by a
/// collector that is down, with its layer as the process's subscriber.
///
/// # Errors
///
/// When the exporter cannot be built or a subscriber is already installed.
#[cfg(feature = "opentelemetry")]
fn otlp_to_nowhere() -> anyhow::Result<kube_informer::telemetry::OtlpTracing> {
    use tracing_subscriber::layer::SubscriberExt;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let endpoint = format!("http://127.0.0.1:{port}/v1/traces");
    let tracing = kube_informer::telemetry::OtlpTracing::new("subject-kube-informer", &endpoint)?;
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(tracing.layer()))?;
    Ok(tracing)
}

/// Without the library's `opentelemetry` feature there are no spans to export.
#[cfg(not(feature = "opentelemetry"))]
fn otlp_to_nowhere() -> anyhow::Result<std::convert::Infallible> {
    anyhow::bail!("--tracing otlp-unreachable needs a build with the `opentelemetry` feature")
}

async fn run<K>(started: Instant, args: Args, client: Client) -> anyhow::Result<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Cached
        + Clone
        + std::fmt::Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let Args {
        common: args,
        paged_list,
        cache,
        json,
        working_set_mib,
        controller,
        ..
    } = args;
    let wire_format = if json {
        WireFormat::Json
    } else {
        WireFormat::Protobuf
    };
    let mut builder = SharedInformer::builder(
        ApiListWatch::new(Api::<K>::namespaced(client, &args.namespace)).wire_format(wire_format),
    )
    .index_fn(GROUP_LABEL, label_index(GROUP_LABEL));
    if paged_list {
        builder = builder.paged_list();
    }
    builder = match cache {
        Cache::Wire => builder.compact(),
        Cache::Decoded => builder.decoded(),
        Cache::JsonCodec => builder.codec(Arc::new(JsonCodec)),
    };
    if let Some(mib) = working_set_mib {
        builder = builder.working_set(WorkingSet::budget(mib << 20));
    }
    let informer = builder.build();
    let recorder = Arc::new(Recorder::new("kube-informer", args.updates));
    let adds = Arc::new(AtomicUsize::new(0));
    let updates = Arc::new(AtomicUsize::new(0));
    let deletes = Arc::new(AtomicUsize::new(0));
    let relisted = Arc::new(tokio::sync::Notify::new());
    let reconcile = (args.reconciles > 0).then(|| Arc::new(ReconcileQueue::new(args.reconciles)));
    informer
        .add_handler({
            let (adds, updates, deletes, recorder, relisted, reconcile) = (
                adds.clone(),
                updates.clone(),
                deletes.clone(),
                recorder.clone(),
                relisted.clone(),
                reconcile.clone(),
            );
            let marker = args.relist.clone();
            handler_fn()
                .on_add(move |_pod: &Arc<K>, _initial| {
                    adds.fetch_add(1, Ordering::Relaxed);
                })
                .on_update(move |old, new: &Arc<K>, _delivery| {
                    if let Some(reconcile) = &reconcile {
                        reconcile.on_update(&**old, &**new);
                    }
                    let labels = new.meta().labels.as_ref();
                    if !controller {
                        recorder.saw(labels);
                    }
                    if marker.is_some()
                        && labels.and_then(|l| l.get(RELIST_LABEL)) == marker.as_ref()
                    {
                        relisted.notify_one();
                    }
                    updates.fetch_add(1, Ordering::Relaxed);
                })
                .on_delete(move |_| {
                    deletes.fetch_add(1, Ordering::Relaxed);
                })
        })
        .expect("an informer that has not run has not stopped");
    let informer = informer.spawn(CancellationToken::new());
    let controller = controller.then(|| ControllerCase::start(&informer, recorder.clone()));
    informer.wait_synced_or_fatal().await?;
    while informer.store().len() < args.expect {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    if let Some(controller) = &controller {
        controller.synced(&informer.store());
    }
    recorder.print_synced(
        started,
        informer.store().len(),
        adds.load(Ordering::Relaxed),
    );
    recorder.wait_for_updates().await;
    if args.reads > 0 {
        benches::wait_for_go_ahead().await?;
        let store = informer.store();
        let namespace = &args.namespace;
        let read_all = |objects: Vec<Arc<K>>| objects.iter().filter(|o| o.read_whole()).count();
        let by_index = |group: &str| store.by_index(GROUP_LABEL, group).map_or(0, read_all);
        let labels = LabelsReads {
            get: &|key: &String| K::labels_get(&store, key),
            list: &|| K::labels_list(&store),
            by_index: &|group: &str| K::labels_by_index(&store, group),
        };
        benches::time_reads(
            "kube-informer",
            args.expect,
            args.reads,
            |name| format!("{namespace}/{name}"),
            |key| store.get_by_key(key).is_some_and(|o| o.read_whole()),
            Some(&labels),
            || read_all(store.list()),
            Some(&by_index),
        )?
        .print();
    }
    if let Some(reconcile) = &reconcile {
        benches::wait_for_go_ahead().await?;
        // The peak from here on is the reconciles'.
        benches::reset_peak(std::process::id())?;
        reconcile
            .work(&Lister::new(informer.store()), args.expect)
            .await?
            .print();
    }
    if args.relist.is_some() {
        // The first list counts too: a second one means the change came by a relist.
        relisted.notified().await;
        RelistLine::print(
            "kube-informer",
            informer.reflector_stats().lists >= 2,
            informer.store().len(),
        );
    }
    benches::wait_for_stdin().await;
    if let Some(controller) = controller {
        controller.stop().await?;
    }
    informer.stop().await;
    Ok(())
}
