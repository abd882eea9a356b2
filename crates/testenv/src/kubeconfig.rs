//! The admin kubeconfig of a local control plane.

use std::path::Path;

use base64::{Engine, engine::general_purpose::STANDARD};

use crate::{Error, Result, certs::Credentials};

/// The context name written into generated kubeconfigs.
pub const CONTEXT: &str = "kube-testenv";

/// Writes a kubeconfig for the admin credential (group `system:masters`)
/// with every certificate inlined, so the file works when copied elsewhere.
pub(crate) fn write_admin(path: &Path, server: &str, creds: &Credentials) -> Result<()> {
    let text =
        serde_json::to_string_pretty(&admin(server, creds)?).expect("a JSON value serialises");
    std::fs::write(path, text).map_err(Error::io("writing the kubeconfig", path))
}

/// The admin kubeconfig for `server`, as JSON.
fn admin(server: &str, creds: &Credentials) -> Result<serde_json::Value> {
    let read = |p: &Path| std::fs::read(p).map_err(Error::io("reading", p));
    Ok(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": CONTEXT,
            "cluster": {
                "server": server,
                "certificate-authority-data": STANDARD.encode(read(&creds.ca_cert)?),
            },
        }],
        "users": [{
            "name": "kube-testenv-admin",
            "user": {
                "client-certificate-data": STANDARD.encode(read(&creds.admin_cert)?),
                "client-key-data": STANDARD.encode(read(&creds.admin_key)?),
            },
        }],
        "contexts": [{
            "name": CONTEXT,
            "context": { "cluster": CONTEXT, "user": "kube-testenv-admin" },
        }],
        "current-context": CONTEXT,
    }))
}

/// Builds a client from a kubeconfig file, impersonating `user` if given.
pub(crate) async fn client_from(path: &Path, user: Option<&str>) -> Result<kube_client::Client> {
    use kube_client::config::Kubeconfig;
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Client(e.to_string()))?;
    let mut config = config_from(kubeconfig).await?;
    config.auth_info.impersonate = user.map(str::to_owned);
    kube_client::Client::try_from(config).map_err(|e| Error::Client(e.to_string()))
}

/// The admin client configuration for `server`, built without a file.
pub(crate) async fn admin_config(server: &str, creds: &Credentials) -> Result<kube_client::Config> {
    let kubeconfig =
        serde_json::from_value(admin(server, creds)?).map_err(|e| Error::Client(e.to_string()))?;
    config_from(kubeconfig).await
}

async fn config_from(kubeconfig: kube_client::config::Kubeconfig) -> Result<kube_client::Config> {
    use kube_client::config::{Config, KubeConfigOptions};
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Client(e.to_string()))
}
