//! Kubeconfigs by cluster name, turned into clients, announced once per change: what the
//! directory and Secret providers share.

use std::collections::HashMap;

use kube_client::{
    Config,
    config::{KubeConfigOptions, Kubeconfig},
};
use tokio::sync::mpsc::UnboundedSender;

use crate::client::{Connections, Window, client_with};

use super::{Cluster, ClusterEvent, ClusterName, FleetError};

/// The largest kubeconfig read: one with a few certificates is a few kilobytes, so
/// anything past this is not a kubeconfig, and is not held.
pub(super) const MAX_KUBECONFIG_BYTES: usize = 1 << 20;

/// A client for the kubeconfig `text` (its current context), from `origin`.
pub(super) async fn cluster_from(
    name: ClusterName,
    text: &[u8],
    origin: &str,
) -> Result<Cluster, FleetError> {
    let refused = |reason: String| FleetError::Kubeconfig {
        origin: origin.to_owned(),
        reason,
    };
    if text.len() > MAX_KUBECONFIG_BYTES {
        return Err(refused(format!(
            "{} bytes, more than the {MAX_KUBECONFIG_BYTES} a kubeconfig may have",
            text.len()
        )));
    }
    let text = std::str::from_utf8(text).map_err(|e| refused(format!("not UTF-8: {e}")))?;
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| refused(e.to_string()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| refused(e.to_string()))?;
    // A connection per cluster: adaptive windows keep what each buffers small.
    let connections = Connections::default().window(Window::Adaptive);
    let client = client_with(config, connections).map_err(|e| refused(e.to_string()))?;
    Ok(Cluster::new(name, client))
}

/// What was last announced for each cluster, so that each change is announced once.
pub(super) struct Announced {
    tx: UnboundedSender<ClusterEvent>,
    /// The bytes of the kubeconfig each announced cluster's client was built from, or of
    /// the last one refused for it (so a refusal is not repeated while nothing changes).
    seen: HashMap<ClusterName, Seen>,
}

struct Seen {
    text: Vec<u8>,
    /// Whether a client was announced under this name (a cluster whose first kubeconfig
    /// was refused never was).
    announced: bool,
}

impl Announced {
    pub(super) fn new(tx: UnboundedSender<ClusterEvent>) -> Self {
        Self {
            tx,
            seen: HashMap::new(),
        }
    }

    /// Whether the receiver is gone (nothing more need be read).
    pub(super) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// The kubeconfig `text` for `name`, from `origin`: an `Appeared` or a `Changed` when
    /// it is new and readable, a `Refused` when it is new and unreadable, nothing when it
    /// is what was seen last.
    pub(super) async fn kubeconfig(&mut self, name: ClusterName, text: &[u8], origin: &str) {
        let announced = match self.seen.get(&name) {
            Some(seen) if seen.text == text => return,
            Some(seen) => seen.announced,
            None => false,
        };
        let event = match cluster_from(name.clone(), text, origin).await {
            Ok(cluster) if announced => ClusterEvent::Changed(cluster),
            Ok(cluster) => ClusterEvent::Appeared(cluster),
            Err(error) => {
                tracing::warn!(cluster = %name, %error, "kubeconfig refused");
                ClusterEvent::Refused {
                    cluster: Some(name.clone()),
                    error,
                }
            }
        };
        let now_announced = announced || matches!(event, ClusterEvent::Appeared(_));
        self.seen.insert(
            name,
            Seen {
                text: text.to_vec(),
                announced: now_announced,
            },
        );
        let _ = self.tx.send(event);
    }

    /// The kubeconfig for `name` could not be read at all: a `Refused`, once until
    /// the reason changes.
    pub(super) fn unreadable(&mut self, name: ClusterName, origin: &str, reason: &str) {
        // Kept where the kubeconfig's bytes would be; a NUL never starts a kubeconfig,
        // so this never equals one.
        let marker = [b"\0", reason.as_bytes()].concat();
        let announced = match self.seen.get(&name) {
            Some(seen) if seen.text == marker => return,
            Some(seen) => seen.announced,
            None => false,
        };
        let error = FleetError::Kubeconfig {
            origin: origin.to_owned(),
            reason: format!("unreadable: {reason}"),
        };
        tracing::warn!(cluster = %name, %error, "kubeconfig refused");
        self.seen.insert(
            name.clone(),
            Seen {
                text: marker,
                announced,
            },
        );
        let _ = self.tx.send(ClusterEvent::Refused {
            cluster: Some(name),
            error,
        });
    }

    /// `name` is gone from the source: a `Gone` if a client was announced for it.
    pub(super) fn removed(&mut self, name: &ClusterName) {
        if let Some(seen) = self.seen.remove(name)
            && seen.announced
        {
            let _ = self.tx.send(ClusterEvent::Gone(name.clone()));
        }
    }

    /// The names seen, announced or refused.
    pub(super) fn names(&self) -> impl Iterator<Item = &ClusterName> {
        self.seen.keys()
    }

    /// Reports a failure to read the source itself.
    pub(super) fn source_failed(&self, error: FleetError) {
        let _ = self.tx.send(ClusterEvent::Refused {
            cluster: None,
            error,
        });
    }
}
