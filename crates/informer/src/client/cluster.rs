//! Where a binary finds its cluster: the `--kubeconfig` and `--context` flags every
//! controller binary has, then kube-client's usual discovery.

use std::path::PathBuf;

use kube_client::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::error::Error;

/// A binary's choice of cluster: a kubeconfig file and a context in it, each optional
/// (the flags `--kubeconfig` and `--context` usually fill them). What is not given is
/// found the way `kubectl` finds it: `$KUBECONFIG`, `~/.kube/config`, then the service
/// account of the Pod the binary runs in.
///
/// ```no_run
/// use kube_informer::ClusterSource;
///
/// # async fn doc() -> Result<(), kube_informer::Error> {
/// let client = ClusterSource::default().context("staging").client().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterSource {
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
}

impl ClusterSource {
    /// Reads the kubeconfig at `path` (default: `$KUBECONFIG`, `~/.kube/config`, or
    /// in-cluster).
    #[must_use]
    pub fn kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig = Some(path.into());
        self
    }

    /// Uses the context `name` (default: the kubeconfig's current context).
    #[must_use]
    pub fn context(mut self, name: impl Into<String>) -> Self {
        self.context = Some(name.into());
        self
    }

    /// Whether a cluster is configured at all: a kubeconfig given, `$KUBECONFIG` set,
    /// `~/.kube/config` present, or a Pod's service account. A binary can start a local
    /// cluster of its own when there is none.
    pub fn is_configured(&self) -> bool {
        let home_config =
            std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".kube/config"));
        self.kubeconfig.is_some()
            || std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty())
            || home_config.is_some_and(|path| path.is_file())
            || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
    }

    /// The client configuration for the chosen cluster.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the kubeconfig cannot be read or lacks the context, or no
    /// cluster is configured.
    pub async fn config(&self) -> Result<Config, Error> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                    Error::Config(format!("reading kubeconfig {}: {e}", path.display()).into())
                })?;
                Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| Error::Config(e.into()))?
            }
            None if self.context.is_some() => Config::from_kubeconfig(&options)
                .await
                .map_err(|e| Error::Config(e.into()))?,
            None => Config::infer().await.map_err(|e| {
                Error::Config(
                    format!("{e}; pass --kubeconfig or set KUBECONFIG to name a cluster").into(),
                )
            })?,
        };
        Ok(config)
    }

    /// A client for the chosen cluster: [`client`](fn@crate::client), on HTTP/2 with pings.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] as for [`config`](Self::config); [`Error::Client`] when the
    /// client cannot be built from it.
    pub async fn client(&self) -> Result<Client, Error> {
        super::client(self.config().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = r#"
apiVersion: v1
kind: Config
clusters:
- name: one
  cluster: { server: "https://127.0.0.1:6443" }
- name: two
  cluster: { server: "https://127.0.0.2:7443" }
contexts:
- name: first
  context: { cluster: one, user: someone, namespace: apps }
- name: second
  context: { cluster: two, user: someone }
current-context: first
users:
- name: someone
  user: { token: abc }
"#;

    fn written() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, KUBECONFIG).unwrap();
        (dir, path)
    }

    #[tokio::test]
    async fn a_given_kubeconfig_uses_its_current_context_or_the_one_named() {
        let (_dir, path) = written();
        let current = ClusterSource::default().kubeconfig(&path);
        let config = current.config().await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(config.default_namespace, "apps");
        assert!(current.is_configured());

        let second = ClusterSource::default().kubeconfig(path).context("second");
        let config = second.config().await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.2:7443/");
    }

    #[tokio::test]
    async fn a_missing_file_or_context_is_a_config_error_naming_it() {
        let missing = ClusterSource::default().kubeconfig("/nonexistent/kubeconfig");
        let error = missing.config().await.unwrap_err();
        assert!(matches!(error, Error::Config(_)), "{error}");
        assert!(
            error.to_string().contains("/nonexistent/kubeconfig"),
            "{error}"
        );

        let (_dir, path) = written();
        let no_such_context = ClusterSource::default().kubeconfig(path).context("third");
        let error = no_such_context.config().await.unwrap_err();
        assert!(matches!(error, Error::Config(_)), "{error}");
        assert!(error.to_string().contains("third"), "{error}");
    }
}
