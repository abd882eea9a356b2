//! The kube-informer subject of the informer benchmark: a [`SharedInformer`] on the Pods
//! of one namespace that counts events and keeps the cache. See `benches::SubjectArgs`
//! for the protocol. With no flag it runs the library's defaults (a streaming list, a
//! compact cache of the bytes the server sent) through the client the README recommends
//! (`kube_informer::client`, HTTP/2); `--client kube` uses kube-client's default (HTTP/1.1)
//! instead, `--paged-list` turns on the informer option of that name, `--cache decoded`
//! keeps decoded objects and `--cache json-codec` compact JSON encoded by the store (the
//! compact cache before it kept the server's bytes); `--json` reads JSON instead of
//! protobuf; `--object lazy` caches `LazyObject<Pod>`s, whose metadata alone is decoded
//! on arrival (its full reads decode the whole Pod, so they compare with the others'). Every
//! configuration indexes the Pods by their `bench-group` label.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

use benches::{
    GROUP_LABEL, LabelsReads, PodLabels, RELIST_LABEL, Recorder, RelistLine, SubjectArgs,
};
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kube_client::{Api, Client, Resource};
use kube_informer::{
    JsonCodec, LazyObject, SharedInformer, Store, handler_fn, label_index,
    list_watch::{ApiListWatch, WireFormat},
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

/// Which API client the informer lists and watches through.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ClientKind {
    /// The one the library recommends: `kube_informer::client`, HTTP/2 with keep-alive pings.
    Informer,
    /// kube-client's default, `Client::try_from(config)`: HTTP/1.1, a connection per watch.
    Kube,
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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    let args = Args::parse();
    let client = match args.client {
        ClientKind::Informer => benches::informer_client(&args.common.kubeconfig).await?,
        ClientKind::Kube => benches::client(&args.common.kubeconfig).await?,
    };
    match args.object {
        Object::Pod => run::<Pod>(started, args, client).await,
        Object::Lazy => run::<LazyObject<Pod>>(started, args, client).await,
    }
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
    let informer = builder.build();
    let recorder = Arc::new(Recorder::new("kube-informer", args.updates));
    let adds = Arc::new(AtomicUsize::new(0));
    let updates = Arc::new(AtomicUsize::new(0));
    let deletes = Arc::new(AtomicUsize::new(0));
    let relisted = Arc::new(tokio::sync::Notify::new());
    informer
        .add_handler({
            let (adds, updates, deletes, recorder, relisted) = (
                adds.clone(),
                updates.clone(),
                deletes.clone(),
                recorder.clone(),
                relisted.clone(),
            );
            let marker = args.relist.clone();
            handler_fn()
                .on_add(move |_pod: &Arc<K>, _initial| {
                    adds.fetch_add(1, Ordering::Relaxed);
                })
                .on_update(move |_old, new: &Arc<K>, _delivery| {
                    let labels = new.meta().labels.as_ref();
                    recorder.saw(labels);
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
    informer.wait_synced_or_fatal().await?;
    while informer.store().len() < args.expect {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
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
    if args.relist.is_some() {
        // The first list counts too: a second one means the change came by a relist.
        relisted.notified().await;
        RelistLine::print(
            "kube-informer",
            informer.reflector_stats().lists() >= 2,
            informer.store().len(),
        );
    }
    benches::wait_for_stdin().await;
    informer.stop().await;
    Ok(())
}
