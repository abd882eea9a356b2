//! One replica of a fleet spread over a shard ring, as a process of its own, for the fleet
//! tests that SIGKILL a replica: it runs each namespace-cluster labelled `<label>=member`
//! whose slot the ring deals it, and prints one JSON line to stdout as each run starts and
//! as it ends (`{"replica", "cluster", "event": "start"|"end", "at_ns"}`, wall-clock
//! nanoseconds, so the records of several processes compare).

use std::{
    io::Write,
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::Context;
use clap::Parser;
use kube_informer::{
    ClusterSource,
    fleet::{Engaged, Fleet, NamespaceClusters},
    lease::LeaseConfig,
    sharding::{RingConfig, ShardRing},
};

/// A fleet replica over namespace-clusters, spread over a shard ring.
#[derive(Parser, Debug)]
struct Args {
    /// The kubeconfig of the cluster holding the namespaces and the ring's Leases.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The namespace of the ring's Leases.
    #[arg(long)]
    ring_namespace: String,
    /// Namespaces labelled `<label>=member` are the clusters.
    #[arg(long)]
    label: String,
    /// This replica's identity in the ring.
    #[arg(long)]
    identity: String,
    /// The ring's Lease duration, in milliseconds (renewals are due by two thirds of it).
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
}

fn record(replica: &str, cluster: &str, event: &str) {
    let at_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let line = serde_json::json!({ "replica": replica, "cluster": cluster, "event": event, "at_ns": at_ns.to_string() });
    let mut out = std::io::stdout().lock();
    // A reader that went away ends the test anyway; nothing to do about it here.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = ClusterSource::default()
        .kubeconfig(&args.kubeconfig)
        .client()
        .await
        .context("a client from --kubeconfig")?;
    let lease = Duration::from_millis(args.lease_ms);
    let config = RingConfig::new(
        LeaseConfig::new("fleet-ring")
            .in_namespace(&args.ring_namespace)
            .with_identity(&args.identity)
            .lease_duration(lease)
            .renew_deadline(lease * 2 / 3)
            .retry_period(Duration::from_millis(300)),
    )
    .slots(16);
    let ring = Arc::new(ShardRing::new(client.clone(), config).context("the ring")?);
    let fleet =
        Fleet::new(NamespaceClusters::new(client).label_selector(format!("{}=member", args.label)))
            .spread_over(ring.clone());
    let cancel = kube_informer::cancel_on_signals();
    let ring_task = tokio::spawn({
        let (ring, cancel) = (ring.clone(), cancel.clone());
        async move { ring.run(cancel).await }
    });
    let identity = args.identity.clone();
    fleet
        .run(
            move |cluster: Engaged| {
                let identity = identity.clone();
                async move {
                    let name = cluster.cluster().name().to_string();
                    record(&identity, &name, "start");
                    cluster.cancel().cancelled().await;
                    record(&identity, &name, "end");
                    Ok(())
                }
            },
            cancel,
        )
        .await;
    ring_task
        .await
        .context("the ring's task")?
        .context("the ring")?;
    Ok(())
}
