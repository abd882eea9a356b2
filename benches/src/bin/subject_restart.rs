//! The subject of the warm-restart benchmark: an informer on the Pods of one namespace with
//! the library's defaults, and with `--snapshot` a warm restart kept at that path. It
//! prints one JSON line once synced (time from the start of `main`, objects, whether it
//! listed), holds its cache until stdin closes, then stops (writing the snapshot) and
//! prints a second line.

use std::{path::PathBuf, time::Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kube_client::Api;
use kube_informer::{SharedInformer, reflector::WarmRestart};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// An informer of the Pods, warm-restarted from `--snapshot` when it has one.
#[derive(Debug, Parser)]
#[command(name = "subject-restart")]
struct Args {
    /// The kubeconfig file of the control plane.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The namespace of the Pods.
    #[arg(long)]
    namespace: String,
    /// Where the cache's snapshot is kept; without it, every start lists.
    #[arg(long)]
    snapshot: Option<PathBuf>,
}

/// What the subject prints once synced.
#[derive(Debug, Serialize)]
struct Synced {
    synced_ms: f64,
    objects: usize,
    /// Full lists it made to sync (0: resumed from the snapshot).
    lists: u64,
}

/// What it prints once stopped.
#[derive(Debug, Serialize)]
struct Stopped {
    stop_ms: f64,
    snapshot_bytes: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    benches::init_tracing("warn");
    let args = Args::parse();
    let client = benches::informer_client(&args.kubeconfig).await?;
    let api: Api<Pod> = Api::namespaced(client, &args.namespace);
    let mut builder = SharedInformer::builder(api);
    if let Some(path) = &args.snapshot {
        builder = builder.warm_restart(WarmRestart::at(path));
    }
    let informer = builder.build().spawn(CancellationToken::new());
    informer.wait_synced().await;
    let synced = Synced {
        synced_ms: started.elapsed().as_secs_f64() * 1e3,
        objects: informer.store().len(),
        lists: informer.reflector_stats().lists(),
    };
    println!("{}", serde_json::to_string(&synced)?);
    benches::wait_for_stdin().await;
    let stopping = Instant::now();
    informer.stop().await;
    let stopped = Stopped {
        stop_ms: stopping.elapsed().as_secs_f64() * 1e3,
        snapshot_bytes: args
            .snapshot
            .as_ref()
            .and_then(|path| std::fs::metadata(path).ok())
            .map_or(0, |meta| meta.len()),
    };
    println!("{}", serde_json::to_string(&stopped)?);
    Ok(())
}
