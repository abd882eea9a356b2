//! The subject of the warm-restart benchmark: an informer on the Pods of one namespace with
//! the library's defaults, and with `--snapshot` a warm restart kept at that path; with
//! `--handler`, an event handler registered before it starts (as a controller's is), and
//! synced means the handler has had every initial add too. It prints one JSON line once
//! synced (time from the start of `main`, objects, whether it
//! listed), holds its cache until stdin closes, then stops (writing the snapshot) and
//! prints a second line.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};

use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kube_client::Api;
use kube_informer::{
    SharedInformer, handler_fn,
    reflector::{CatchUp, WarmRestart},
};
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
    /// Registers a handler before the informer starts, and waits for it to sync too:
    /// `objects` reads each object's labels, `keys` takes keys where the informer has
    /// not decoded the objects (as a controller's primary source does).
    #[arg(long, value_enum)]
    handler: Option<Handler>,
}

/// The handler `--handler` registers.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Handler {
    Objects,
    Keys,
}

/// What the subject prints once synced.
#[derive(Debug, Serialize)]
struct Synced {
    synced_ms: f64,
    objects: usize,
    /// Full lists it made to sync (0: resumed from the snapshot).
    lists: u64,
    /// Objects the handler was told of, by object (with labels) or by key.
    handled: usize,
    /// How a warm start's watch caught up: `version`, `bookmark`, or `null` for a cold one.
    caught_up_by: Option<&'static str>,
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
    let informer = builder.build();
    let seen = Arc::new(AtomicUsize::new(0));
    let registration = match args.handler {
        Some(handler) => {
            let counted = seen.clone();
            Some(match handler {
                Handler::Keys => informer.add_key_handler(move |_| {
                    counted.fetch_add(1, Ordering::Relaxed);
                })?,
                Handler::Objects => {
                    informer.add_handler(handler_fn::<Pod>().on_add(move |pod, _| {
                        if pod.metadata.labels.is_some() {
                            counted.fetch_add(1, Ordering::Relaxed);
                        }
                    }))?
                }
            })
        }
        None => None,
    };
    let informer = informer.spawn(CancellationToken::new());
    informer.wait_synced().await;
    if let Some(registration) = &registration {
        registration.wait_synced().await;
    }
    let synced = Synced {
        synced_ms: started.elapsed().as_secs_f64() * 1e3,
        objects: informer.store().len(),
        lists: informer.reflector_stats().lists,
        handled: seen.load(Ordering::Relaxed),
        caught_up_by: informer
            .reflector_stats()
            .warm_restart_caught_up
            .map(|by| match by {
                CatchUp::Version => "version",
                CatchUp::Bookmark => "bookmark",
            }),
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
