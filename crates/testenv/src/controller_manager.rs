//! The kube-controller-manager process, for tests that need Deployments to
//! become ReplicaSets and Pods.

use std::path::Path;

use crate::{Result, certs::Credentials, process::Supervised};

/// The controllers the local control plane runs: enough for workloads,
/// namespaces and owner-based deletion, nothing that needs nodes or a cloud.
const CONTROLLERS: &[&str] = &[
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
];

pub(crate) fn start(
    binary: &Path,
    dir: &Path,
    kubeconfig: &Path,
    creds: &Credentials,
) -> Result<Supervised> {
    let args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--authentication-kubeconfig={}", kubeconfig.display()),
        format!("--authorization-kubeconfig={}", kubeconfig.display()),
        "--leader-elect=false".to_owned(),
        format!("--controllers={}", CONTROLLERS.join(",")),
        format!("--root-ca-file={}", creds.ca_cert.display()),
        format!(
            "--service-account-private-key-file={}",
            creds.service_account_key.display()
        ),
        "--bind-address=127.0.0.1".to_owned(),
        "--secure-port=0".to_owned(),
    ];
    Supervised::start(
        "kube-controller-manager",
        binary,
        &args,
        &dir.join("kube-controller-manager.log"),
    )
}
