//! [`NamespaceClusters`]: each namespace of one cluster presented as a cluster.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Namespace;
use kube_client::{Api, Client};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    Cluster, ClusterEvent, ClusterEvents, ClusterName, ClusterProvider, FleetError, channel_stream,
};
use crate::{
    error::Error,
    informer::{SharedInformer, handler_fn},
    list_watch::ApiListWatch,
};

/// The namespaces of one cluster, each presented as a cluster of its own
/// ([`Cluster::namespace`] names it, and the client is the one given): a fleet of a
/// hundred clusters on one API server, for tests and benchmarks, or a cluster shared by
/// tenants that a controller treats one by one. An informer follows the namespaces
/// (those matching [`label_selector`](Self::label_selector), if given): a namespace
/// created appears, one deleted goes.
///
/// ```no_run
/// use kube_informer::{CancellationToken, fleet::{ClusterProvider, NamespaceClusters}};
///
/// # fn doc(client: kube_client::Client) {
/// let tenants = NamespaceClusters::new(client)
///     .label_selector("tenant")
///     .events(CancellationToken::new());
/// # }
/// ```
#[derive(Clone)]
pub struct NamespaceClusters {
    client: Client,
    selector: Option<String>,
}

impl NamespaceClusters {
    /// Every namespace of the cluster `client` reaches.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            selector: None,
        }
    }

    /// Only the namespaces this label selector matches.
    #[must_use]
    pub fn label_selector(mut self, selector: impl Into<String>) -> Self {
        self.selector = Some(selector.into());
        self
    }
}

enum Seen {
    Added(ClusterName),
    Deleted(ClusterName),
    Failed(String),
}

impl ClusterProvider for NamespaceClusters {
    fn events(self, cancel: CancellationToken) -> ClusterEvents {
        let (tx, rx) = mpsc::unbounded_channel();
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let mut list_watch = ApiListWatch::new(Api::<Namespace>::all(self.client.clone()));
        if let Some(selector) = &self.selector {
            list_watch = list_watch.labels(selector);
        }
        let what = match &self.selector {
            Some(selector) => format!("Namespaces selected by {selector:?}"),
            None => "Namespaces".to_owned(),
        };
        let errors = seen_tx.clone();
        let informer = SharedInformer::builder(list_watch)
            .on_watch_error(move |error: &Error| {
                let _ = errors.send(Seen::Failed(error.to_string()));
            })
            .build();
        let (added, deleted) = (seen_tx.clone(), seen_tx);
        let name_of = |namespace: &Namespace| {
            ClusterName::from(namespace.metadata.name.as_deref().unwrap_or(""))
        };
        let handler = handler_fn::<Namespace>()
            .on_add(move |namespace, _| {
                let _ = added.send(Seen::Added(name_of(namespace)));
            })
            .on_delete(move |namespace| {
                let _ = deleted.send(Seen::Deleted(name_of(namespace.object())));
            });
        informer
            .add_handler(handler)
            .expect("a handler is added to an informer not yet started");
        let running = informer.spawn(cancel.child_token());
        let client = self.client;
        tokio::spawn(async move {
            let mut announced = HashSet::new();
            loop {
                let next = tokio::select! {
                    () = cancel.cancelled() => None,
                    next = seen.recv() => next,
                };
                let Some(next) = next else { break };
                let event = match next {
                    Seen::Added(name) if announced.insert(name.clone()) => {
                        let namespace = name.to_string();
                        ClusterEvent::Appeared(
                            Cluster::new(name, client.clone()).in_namespace(namespace),
                        )
                    }
                    Seen::Added(_) => continue,
                    Seen::Deleted(name) if announced.remove(&name) => ClusterEvent::Gone(name),
                    Seen::Deleted(_) => continue,
                    Seen::Failed(reason) => ClusterEvent::Refused {
                        cluster: None,
                        error: FleetError::Source {
                            what: what.clone(),
                            reason,
                        },
                    },
                };
                if tx.send(event).is_err() {
                    break;
                }
            }
            running.stop().await;
        });
        channel_stream(rx)
    }
}
