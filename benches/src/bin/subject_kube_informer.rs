//! The kube-informer subject of the informer benchmark: a [`SharedInformer`] on the Pods
//! of one namespace that counts events and keeps the cache. See `benches::SubjectArgs`
//! for the protocol. With no flag it runs the library's defaults (a streaming list, a
//! compact cache of the bytes the server sent) through the client the README recommends
//! (`kube_informer::client`, HTTP/2); `--client kube` uses kube-client's default (HTTP/1.1)
//! instead, `--paged-list` turns on the informer option of that name, `--cache decoded`
//! keeps decoded objects and `--cache json-codec` compact JSON encoded by the store (the
//! compact cache before it kept the server's bytes); `--json` reads JSON instead of
//! protobuf. Every configuration indexes the Pods by their `bench-group` label.

use std::{
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
use kube_client::Api;
use kube_informer::{ApiListWatch, JsonCodec, SharedInformer, WireFormat, handler_fn, label_index};
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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    let Args {
        common: args,
        paged_list,
        cache,
        json,
        client,
    } = Args::parse();
    let client = match client {
        ClientKind::Informer => benches::informer_client(&args.kubeconfig).await?,
        ClientKind::Kube => benches::client(&args.kubeconfig).await?,
    };
    let wire_format = if json {
        WireFormat::Json
    } else {
        WireFormat::Protobuf
    };
    let mut builder = SharedInformer::builder(
        ApiListWatch::new(Api::<Pod>::namespaced(client, &args.namespace)).wire_format(wire_format),
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
    informer.add_handler({
        let (adds, updates, deletes, recorder, relisted) = (
            adds.clone(),
            updates.clone(),
            deletes.clone(),
            recorder.clone(),
            relisted.clone(),
        );
        let marker = args.relist.clone();
        handler_fn()
            .on_add(move |_pod: &Arc<Pod>, _initial| {
                adds.fetch_add(1, Ordering::Relaxed);
            })
            .on_update(move |_old, new| {
                recorder.saw(new.metadata.labels.as_ref());
                let labels = new.metadata.labels.as_ref();
                if marker.is_some() && labels.and_then(|l| l.get(RELIST_LABEL)) == marker.as_ref() {
                    relisted.notify_one();
                }
                updates.fetch_add(1, Ordering::Relaxed);
            })
            .on_delete(move |_| {
                deletes.fetch_add(1, Ordering::Relaxed);
            })
    });
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
        let by_index = |group: &str| {
            store
                .by_index(GROUP_LABEL, group)
                .map_or(0, |objects| objects.len())
        };
        let labelled = |pods: Vec<PodLabels>| {
            pods.iter()
                .filter(|pod| !pod.metadata.labels.is_empty())
                .count()
        };
        let labels = LabelsReads {
            get: &|key: &String| {
                Ok(store
                    .get_as::<PodLabels>(key)?
                    .map_or(0, |pod| pod.metadata.labels.len()))
            },
            list: &|| Ok(labelled(store.list_as::<PodLabels>()?)),
            by_index: &|group: &str| {
                Ok(labelled(
                    store.by_index_as::<PodLabels>(GROUP_LABEL, group)?,
                ))
            },
        };
        benches::time_reads(
            "kube-informer",
            args.expect,
            args.reads,
            |name| format!("{namespace}/{name}"),
            |key| store.get_by_key(key).is_some(),
            Some(&labels),
            || store.list().len(),
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
