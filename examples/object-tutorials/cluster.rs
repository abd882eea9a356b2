//! Which cluster the example talks to: the one configured the usual way, or,
//! for the demo on a machine with none, a local control plane it starts.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context;
use kube_client::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};
use kube_testenv::TestEnv;

use crate::Args;

/// A way to build clients for the chosen cluster; cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    /// Kept alive for as long as the example runs; dropping it stops the
    /// local control plane.
    _local: Option<Arc<TestEnv>>,
}

impl Cluster {
    /// Uses `--kubeconfig`/`--context` or the usual discovery; with `--demo`
    /// and no cluster configured at all, starts a local control plane with a
    /// controller-manager, so the Deployment gets its Pods.
    pub async fn connect(args: &Args) -> anyhow::Result<Self> {
        if args.demo && args.kubeconfig.is_none() && !cluster_configured() {
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
                kubeconfig: Some(env.kubeconfig_path().to_owned()),
                context: None,
                _local: Some(Arc::new(env)),
            });
        }
        Ok(Self {
            kubeconfig: args.kubeconfig.clone(),
            context: args.context.clone(),
            _local: None,
        })
    }

    /// A new client for the cluster.
    pub async fn client(&self) -> anyhow::Result<Client> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                Config::from_custom_kubeconfig(kubeconfig, &options).await?
            }
            None if self.context.is_some() => Config::from_kubeconfig(&options).await?,
            None => Config::infer().await.context(
                "no cluster configured: pass --kubeconfig, set KUBECONFIG, or run with --demo to start a local control plane",
            )?,
        };
        // HTTP/2 with pings, as client-go talks: a stalled connection is found in seconds.
        Ok(kube_informer::client(config)?)
    }
}

/// Whether the usual discovery would find a cluster: `$KUBECONFIG`,
/// `~/.kube/config`, or a Pod's service account.
fn cluster_configured() -> bool {
    let home_config = std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".kube/config"));
    std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty())
        || home_config.is_some_and(|path| path.is_file())
        || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
}
