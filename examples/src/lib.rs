//! Pieces shared by the examples: logging set-up, namespaces, and
//! applying YAML manifests the way `kubectl apply` does.

pub mod config_reloader;

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use kube_client::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
};
use tracing_subscriber::EnvFilter;

/// What a `crd` subcommand does with its generated manifest: prints it, or the error.
pub fn print_manifest(manifest: Result<String, impl std::fmt::Display>) -> std::process::ExitCode {
    match manifest {
        Ok(yaml) => {
            print!("{yaml}");
            std::process::ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs to stdout at `info` (override with `RUST_LOG`), with colours only on
/// a terminal.
///
/// kube-client's own log of every failed request is muted by default: the
/// library reports each failure itself, with the resource it concerns, and
/// a starting control plane answers readiness probes with errors by design.
pub fn init_tracing() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,kube_client::client::builder=off")),
        )
        .with_ansi(std::io::stdout().is_terminal())
        .init();
}

/// Creates `name` unless it exists.
///
/// # Errors
///
/// When the API server refuses for any reason but "already exists".
pub async fn ensure_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name } }))?;
    match api.create(&PostParams::default(), &namespace).await {
        Ok(_) => Ok(()),
        Err(kube_client::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(err) => Err(err).with_context(|| format!("creating namespace {name}")),
    }
}

/// Server-side applies every document of a multi-document YAML manifest,
/// as `field_manager`. With `namespace`, namespaced objects go there
/// whatever their manifest says. Returns `kind/name` of each object.
///
/// # Errors
///
/// On YAML that does not parse, a document without `apiVersion`, `kind` or
/// `metadata.name`, or an object the API server refuses.
pub async fn apply_yaml(
    client: &Client,
    yaml: &str,
    namespace: Option<&str>,
    field_manager: &str,
) -> anyhow::Result<Vec<String>> {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(yaml).context("parsing the manifest")?;
    let mut applied = Vec::new();
    for document in documents.into_iter().filter(|d| !d.is_null()) {
        let mut object: DynamicObject = serde_json::from_value(document)
            .context("a manifest document is not a Kubernetes object")?;
        let types = object
            .types
            .clone()
            .context("a manifest document lacks apiVersion or kind")?;
        let (group, version) = match types.api_version.split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", types.api_version.as_str()),
        };
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &types.kind));
        let name = object
            .metadata
            .name
            .clone()
            .context("a manifest document lacks metadata.name")?;
        if let Some(namespace) = namespace.filter(|_| object.metadata.namespace.is_some()) {
            object.metadata.namespace = Some(namespace.to_owned());
        }
        let api: Api<DynamicObject> = match &object.metadata.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        api.patch(
            &name,
            &PatchParams::apply(field_manager).force(),
            &Patch::Apply(&object),
        )
        .await
        .with_context(|| format!("applying {}/{name}", types.kind))?;
        applied.push(format!("{}/{name}", types.kind));
    }
    Ok(applied)
}
