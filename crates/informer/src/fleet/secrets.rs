//! [`KubeconfigSecrets`]: a cluster per labelled Secret of a hub cluster.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube_client::{Api, Client};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    ClusterEvents, ClusterName, ClusterProvider, FleetError, channel_stream, kubeconfig::Announced,
};
use crate::{
    error::Error,
    informer::{SharedInformer, handler_fn},
    list_watch::ApiListWatch,
};

/// The label a Secret carries to be one of the fleet's clusters (value `"true"`), unless
/// the provider is given another selector.
pub const KUBECONFIG_SECRET_LABEL: &str = "fleet.kube-informer.dev/kubeconfig";

/// The Secret's data key that holds the kubeconfig, unless the provider is given another.
pub const KUBECONFIG_SECRET_KEY: &str = "kubeconfig";

/// The clusters whose kubeconfigs are kept in Secrets of one namespace of a hub cluster,
/// one cluster per Secret, named after it: the Secrets carrying
/// [`KUBECONFIG_SECRET_LABEL`]`=true` (or another label selector), their kubeconfig under
/// the data key [`KUBECONFIG_SECRET_KEY`] (or another). An informer follows them, so a
/// Secret created, changed (a rotated credential) or deleted is announced at once.
///
/// Needs `list` and `watch` on Secrets in that namespace; without them each failure is
/// reported as [`ClusterEvent::Refused`](super::ClusterEvent::Refused) while the informer
/// retries.
///
/// ```no_run
/// use kube_informer::{CancellationToken, fleet::{ClusterProvider, KubeconfigSecrets}};
///
/// # fn doc(hub: kube_client::Client) {
/// let clusters = KubeconfigSecrets::new(hub, "fleet-system").events(CancellationToken::new());
/// # }
/// ```
#[derive(Clone)]
pub struct KubeconfigSecrets {
    client: Client,
    namespace: String,
    selector: String,
    key: String,
}

impl KubeconfigSecrets {
    /// The labelled Secrets of `namespace` in the hub cluster `client` reaches.
    pub fn new(client: Client, namespace: impl Into<String>) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            selector: format!("{KUBECONFIG_SECRET_LABEL}=true"),
            key: KUBECONFIG_SECRET_KEY.to_owned(),
        }
    }

    /// Selects the Secrets by this label selector instead.
    #[must_use]
    pub fn label_selector(mut self, selector: impl Into<String>) -> Self {
        self.selector = selector.into();
        self
    }

    /// Reads the kubeconfig from this data key instead.
    #[must_use]
    pub fn data_key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }
}

/// What the informer's handler saw, for the task that builds clients (which is async).
enum Seen {
    Secret(Arc<Secret>),
    Deleted(ClusterName),
    Failed(String),
}

impl ClusterProvider for KubeconfigSecrets {
    fn events(self, cancel: CancellationToken) -> ClusterEvents {
        let (tx, rx) = mpsc::unbounded_channel();
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let what = format!(
            "Secrets in {} selected by {:?}",
            self.namespace, self.selector
        );
        let list_watch = ApiListWatch::new(Api::<Secret>::namespaced(self.client, &self.namespace))
            .labels(&self.selector);
        let errors = seen_tx.clone();
        let informer = SharedInformer::builder(list_watch)
            .on_watch_error(move |error: &Error| {
                let _ = errors.send(Seen::Failed(error.to_string()));
            })
            .build();
        let (added, updated, deleted) = (seen_tx.clone(), seen_tx.clone(), seen_tx);
        let handler = handler_fn::<Secret>()
            .on_add(move |secret, _| {
                let _ = added.send(Seen::Secret(secret.clone()));
            })
            .on_update(move |_, secret, _| {
                let _ = updated.send(Seen::Secret(secret.clone()));
            })
            .on_delete(move |deleted_secret| {
                let name = deleted_secret.object().metadata.name.as_deref();
                let _ = deleted.send(Seen::Deleted(ClusterName::from(name.unwrap_or(""))));
            });
        informer
            .add_handler(handler)
            .expect("a handler is added to an informer not yet started");
        let running = informer.spawn(cancel.child_token());
        let namespace = self.namespace;
        let key = self.key;
        tokio::spawn(async move {
            let mut announced = Announced::new(tx);
            loop {
                let next = tokio::select! {
                    () = cancel.cancelled() => None,
                    next = seen.recv() => next,
                };
                let Some(next) = next else { break };
                match next {
                    Seen::Secret(secret) => {
                        let name = secret.metadata.name.as_deref().unwrap_or("");
                        let origin = format!("Secret {namespace}/{name}");
                        let name = ClusterName::from(name);
                        match secret.data.as_ref().and_then(|data| data.get(&key)) {
                            Some(kubeconfig) => {
                                announced.kubeconfig(name, &kubeconfig.0, &origin).await;
                            }
                            None => {
                                announced.unreadable(name, &origin, &format!("no data key {key:?}"))
                            }
                        }
                    }
                    Seen::Deleted(name) => announced.removed(&name),
                    Seen::Failed(reason) => announced.source_failed(FleetError::Source {
                        what: what.clone(),
                        reason,
                    }),
                }
                if announced.is_closed() {
                    break;
                }
            }
            running.stop().await;
        });
        channel_stream(rx)
    }
}
