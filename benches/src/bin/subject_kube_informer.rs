//! The kube-informer subject of the informer benchmark: a [`SharedInformer`] on the Pods
//! of one namespace that counts events and keeps the cache. See `benches::SubjectArgs`
//! for the protocol. With no flag it runs the library's defaults (a streaming list, a
//! compact cache of the bytes the server sent); `--paged-list` and `--decoded` turn on the
//! informer options of those names, `--json-codec` keeps the cache as compact JSON encoded
//! by the store (the compact cache before it kept the server's bytes); `--json` reads JSON
//! instead of protobuf.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

use benches::{Recorder, SubjectArgs};
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kube_client::Api;
use kube_informer::{ApiListWatch, JsonCodec, SharedInformer, WireFormat, handler_fn};
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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    let Args {
        common: args,
        paged_list,
        cache,
        json,
    } = Args::parse();
    let client = benches::client(&args.kubeconfig).await?;
    let wire_format = if json {
        WireFormat::Json
    } else {
        WireFormat::Protobuf
    };
    let mut builder = SharedInformer::builder(
        ApiListWatch::new(Api::<Pod>::namespaced(client, &args.namespace)).wire_format(wire_format),
    );
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
    informer.add_handler({
        let (adds, updates, deletes, recorder) = (
            adds.clone(),
            updates.clone(),
            deletes.clone(),
            recorder.clone(),
        );
        handler_fn()
            .on_add(move |_pod: &Arc<Pod>, _initial| {
                adds.fetch_add(1, Ordering::Relaxed);
            })
            .on_update(move |_old, new| {
                recorder.saw(new.metadata.labels.as_ref());
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
    recorder.finish().await;
    informer.stop().await;
    Ok(())
}
