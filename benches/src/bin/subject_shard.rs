//! The subject of the sharding benchmark: one replica's informer on the Pods of one
//! namespace, with the library's defaults, caching one shard of them (or all, without
//! `--shards`). It prints one JSON line once synced (time to sync, objects, who applied
//! the shard), then holds its cache until stdin closes, so the driver can read its memory
//! and the bytes it read.

use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kube_client::Api;
use kube_informer::{
    SharedInformer,
    list_watch::{HashRange, Shard, ShardField},
};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// One replica's informer over a shard of the Pods.
#[derive(Debug, Parser)]
#[command(name = "subject-shard")]
struct Args {
    /// The kubeconfig file of the control plane.
    #[arg(long)]
    kubeconfig: std::path::PathBuf,
    /// The namespace of the Pods.
    #[arg(long)]
    namespace: String,
    /// Equal shards by UID; none caches every Pod.
    #[arg(long)]
    shards: Option<usize>,
    /// Which of them this replica caches.
    #[arg(long, default_value_t = 0)]
    index: usize,
}

/// What the subject prints once synced.
#[derive(Debug, Serialize)]
struct Synced {
    synced_ms: f64,
    objects: usize,
    shard_mode: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    benches::init_tracing("warn");
    let args = Args::parse();
    let client = benches::informer_client(&args.kubeconfig).await?;
    let api: Api<Pod> = Api::namespaced(client, &args.namespace);
    let mut builder = SharedInformer::builder(api);
    if let Some(count) = args.shards {
        let range = HashRange::part(args.index, count).context("--index must be below --shards")?;
        let shard = Shard::new(ShardField::Uid, [range]).context("a shard needs a range")?;
        builder = builder.shard(shard);
    }
    let started = Instant::now();
    let informer = builder.build().spawn(CancellationToken::new());
    informer.wait_synced().await;
    let line = Synced {
        synced_ms: started.elapsed().as_secs_f64() * 1e3,
        objects: informer.store().len(),
        shard_mode: informer
            .reflector_stats()
            .shard_mode
            .map(|m| format!("{m:?}")),
    };
    println!("{}", serde_json::to_string(&line)?);
    benches::wait_for_stdin().await;
    informer.stop().await;
    Ok(())
}
