//! Checks made before anything starts, so a missing install step (the CRD, RBAC) gives one
//! clear error instead of a controller that never syncs.

use k8s_openapi::{
    NamespaceResourceScope,
    api::core::v1::{Pod, Service},
};
use kube_client::{Api, Client, api::ListParams};
use kube_core::Resource;
use serde::de::DeserializeOwned;

use super::{cli::ControllerKind, crd::TraefikService};

/// What is missing.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// The TraefikService CRD is not installed.
    #[error(
        "the TraefikService CRD is not installed (kubectl apply -f \
         examples/traefik-operator/config/crd/), or leave `traefikservices` out of --controllers"
    )]
    CrdMissing,
    /// RBAC forbids what a controller needs.
    #[error("not allowed to {what} (see examples/traefik-operator/config/rbac/): {source}")]
    Forbidden {
        /// What was attempted.
        what: String,
        /// The API server's answer.
        source: kube_client::Error,
    },
    /// Another API error.
    #[error("{what} failed: {source}")]
    Kube {
        /// What was attempted.
        what: String,
        /// The client's error.
        source: kube_client::Error,
    },
}

/// Checks that the CRD exists and that each of `controllers` may list what it watches in
/// `namespace` (all namespaces for `None`).
///
/// # Errors
///
/// [`PreflightError`] for the first check that fails.
pub async fn check(
    client: &Client,
    namespace: Option<&str>,
    controllers: &[ControllerKind],
) -> Result<(), PreflightError> {
    for kind in controllers {
        let (what, listed) = match kind {
            ControllerKind::Traefikservices => (
                "list traefikservices",
                list_one::<TraefikService>(client, namespace).await,
            ),
            ControllerKind::Services => (
                "list services",
                list_one::<Service>(client, namespace).await,
            ),
            ControllerKind::Pods => ("list pods", list_one::<Pod>(client, namespace).await),
        };
        let what = what.to_owned();
        match listed {
            Ok(()) => {}
            Err(kube_client::Error::Api(s))
                if s.code == 404 && *kind == ControllerKind::Traefikservices =>
            {
                return Err(PreflightError::CrdMissing);
            }
            Err(kube_client::Error::Api(s)) if s.code == 403 => {
                let source = kube_client::Error::Api(s);
                return Err(PreflightError::Forbidden { what, source });
            }
            Err(source) => return Err(PreflightError::Kube { what, source }),
        }
    }
    Ok(())
}

async fn list_one<K>(client: &Client, namespace: Option<&str>) -> Result<(), kube_client::Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    api.list_metadata(&ListParams::default().limit(1))
        .await
        .map(|_| ())
}
