//! Which cluster the example talks to: the one configured the usual way, or,
//! for the demo on a machine with none, a local control plane it starts.

use std::sync::Arc;

use anyhow::Context;
use kube_client::Client;
use kube_informer::ClusterSource;
use kube_testenv::TestEnv;

use crate::Args;

/// A way to build clients for the chosen cluster; cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    source: ClusterSource,
    /// Kept alive for as long as the example runs; dropping it stops the
    /// local control plane.
    _local: Option<Arc<TestEnv>>,
}

impl Cluster {
    /// Uses `--kubeconfig`/`--context` or the usual discovery; with `--demo`
    /// and no cluster configured at all, starts a local control plane with a
    /// controller-manager, so the Deployment gets its Pods.
    pub async fn connect(args: &Args) -> anyhow::Result<Self> {
        let mut source = ClusterSource::default();
        if let Some(path) = &args.kubeconfig {
            source = source.kubeconfig(path);
        }
        if let Some(context) = &args.context {
            source = source.context(context);
        }
        if args.demo && !source.is_configured() {
            tracing::info!(
                "no cluster configured: starting a local control plane (etcd, kube-apiserver, kube-controller-manager)"
            );
            let env = TestEnv::builder()
                .controller_manager(true)
                .start()
                .await
                .context("starting the local control plane")?;
            tracing::info!(kubeconfig = %env.kubeconfig_path().display(), "local control plane ready; kubectl --kubeconfig works with this file while the demo runs");
            return Ok(Self {
                source: ClusterSource::default().kubeconfig(env.kubeconfig_path()),
                _local: Some(Arc::new(env)),
            });
        }
        Ok(Self {
            source,
            _local: None,
        })
    }

    /// A new client for the cluster, on HTTP/2 with pings, as client-go talks: a stalled
    /// connection is found in seconds.
    pub async fn client(&self) -> anyhow::Result<Client> {
        // The library's error names --kubeconfig and KUBECONFIG; the demo is this example's.
        let hint = "no cluster to talk to (--demo starts a local control plane)";
        self.source.client().await.context(hint)
    }
}
