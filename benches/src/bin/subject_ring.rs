//! The subject of the handover benchmark: one replica of a sharded controller of the Pods
//! of one namespace, on a shard ring with the library's defaults (a 15 s lease unless told
//! otherwise). Each finished reconcile is appended to `--reconcile-log` as a JSON line (the
//! key and when it ended), unbuffered, so a replica killed mid-run loses none it finished.
//! It runs until stdin closes.

use std::{
    fs::File,
    io::Write,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kube_informer::lease::LeaseConfig;
use kube_informer::{
    Action, CancellationToken, Manager, ReconcileRequest, Scope, retry_with_backoff,
    sharding::RingConfig,
};

/// One replica of a sharded controller of Pods.
#[derive(Debug, Parser)]
#[command(name = "subject-ring")]
struct Args {
    /// The kubeconfig file of the control plane.
    #[arg(long)]
    kubeconfig: std::path::PathBuf,
    /// The namespace of the Pods (the ring's Leases go there too).
    #[arg(long)]
    namespace: String,
    /// The ring's name.
    #[arg(long)]
    ring: String,
    /// This replica's identity in the ring.
    #[arg(long)]
    identity: String,
    /// Seconds the ring's Leases last (the renew deadline is two thirds of it, the retry
    /// period two fifteenths: 10 s and 2 s for the default 15 s).
    #[arg(long, default_value_t = 15.0)]
    lease_seconds: f64,
    /// Where each finished reconcile is appended.
    #[arg(long)]
    reconcile_log: std::path::PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    benches::init_tracing("warn,kube_informer::sharding=info");
    let args = Args::parse();
    let client = benches::informer_client(&args.kubeconfig).await?;
    let lease = Duration::from_secs_f64(args.lease_seconds);
    let config = RingConfig::new(
        LeaseConfig::new(&args.ring)
            .in_namespace(&args.namespace)
            .with_identity(&args.identity)
            .lease_duration(lease)
            .renew_deadline(lease * 2 / 3)
            .retry_period(lease * 2 / 15),
    );
    let log = Arc::new(Mutex::new(
        File::options()
            .create(true)
            .append(true)
            .open(&args.reconcile_log)
            .with_context(|| format!("opening {}", args.reconcile_log.display()))?,
    ));
    let mut manager = Manager::new(client)
        .probe_address(None)
        .metrics_address(None);
    let ring = manager.shard_ring(config)?;
    let controller =
        manager.sharded_controller::<Pod>("pods", Scope::namespace(&args.namespace), &ring);
    let reconcile = move |request: ReconcileRequest<Pod>, log: Arc<Mutex<File>>| {
        let line = format!(
            "{{\"key\":\"{}\",\"ended_ns\":{}}}\n",
            request.key(),
            benches::unix_nanos()
        );
        let written = log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .write_all(line.as_bytes());
        std::future::ready(written.map(|()| Action::done()))
    };
    manager.add_controller(controller, (reconcile, retry_with_backoff(), log));
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        benches::wait_for_stdin().await;
        stop.cancel();
    });
    manager.bind().await?.run(cancel).await?;
    Ok(())
}
