//! The kube-apiserver process, restartable on the same port and data.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{Error, Result, certs::Credentials, process::Supervised};

/// The service CIDR; the serving certificate carries its first address.
pub(crate) const SERVICE_CLUSTER_IP_RANGE: &str = "10.0.0.0/24";

/// How to run kube-apiserver; kept so it can be restarted identically.
#[derive(Debug, Clone)]
pub(crate) struct ApiServerSpec {
    pub(crate) binary: PathBuf,
    pub(crate) port: u16,
    pub(crate) args: Vec<String>,
    pub(crate) log: PathBuf,
}

impl ApiServerSpec {
    pub(crate) fn new(
        binary: PathBuf,
        dir: &Path,
        port: u16,
        etcd_url: &str,
        creds: &Credentials,
        extra_args: &[String],
    ) -> Self {
        let mut args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", creds.serving_cert.display()),
            format!("--tls-private-key-file={}", creds.serving_key.display()),
            format!("--client-ca-file={}", creds.ca_cert.display()),
            format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!(
                "--service-account-key-file={}",
                creds.service_account_pub.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                creds.service_account_key.display()
            ),
            "--authorization-mode=RBAC".to_owned(),
            // No node runs here, so no endpoint for the `kubernetes` Service can be
            // reconciled, and no Pod could mount a service-account token anyway.
            "--endpoint-reconciler-type=none".to_owned(),
            "--disable-admission-plugins=ServiceAccount".to_owned(),
            "--allow-privileged=true".to_owned(),
        ];
        args.extend_from_slice(extra_args);
        Self {
            binary,
            port,
            args,
            log: dir.join("kube-apiserver.log"),
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub(crate) fn start(&self) -> Result<Supervised> {
        Supervised::start("kube-apiserver", &self.binary, &self.args, &self.log)
    }
}

/// Polls `/readyz` until it answers `ok`, failing early if the process exits.
pub(crate) async fn wait_ready(
    process: &mut Supervised,
    client: &kube_client::Client,
    timeout: Duration,
) -> Result<()> {
    let started = Instant::now();
    let mut last_problem = String::from("no probe yet");
    while started.elapsed() < timeout {
        process.check_running()?;
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .expect("static request");
        match tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await {
            Ok(Ok(body)) if body.trim() == "ok" => {
                tracing::debug!(
                    elapsed_ms = started.elapsed().as_millis(),
                    "kube-apiserver ready"
                );
                return Ok(());
            }
            Ok(Ok(body)) => last_problem = format!("/readyz answered {body}"),
            Ok(Err(err)) => last_problem = err.to_string(),
            Err(_) => last_problem = "/readyz did not answer within 5s".to_owned(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(Error::NotReady {
        component: "kube-apiserver",
        waited: timeout,
        last_problem,
        log: process.log().to_owned(),
    })
}
