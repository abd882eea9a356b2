//! Many clusters that come and go: where a fleet's clusters come from.
//!
//! A [`ClusterProvider`] says which clusters exist, and when one appears, changes (new
//! credentials, a new endpoint) or goes, as a stream of [`ClusterEvent`]s. Each
//! [`Cluster`] carries a ready client (the library's [`client`](fn@crate::client), on
//! HTTP/2 with pings) and, where the cluster is one namespace of a larger one, that
//! namespace.
//!
//! Three providers come with the library, and a user can write their own by implementing
//! the trait:
//!
//! - [`KubeconfigDirectory`]: one kubeconfig file per cluster in a directory, read again
//!   as files are added, changed and removed;
//! - [`KubeconfigSecrets`]: one kubeconfig per Secret carrying a label, in a namespace of
//!   a hub cluster, followed with an informer;
//! - [`NamespaceClusters`]: the namespaces of one cluster, each presented as a cluster:
//!   the way to test and measure a large fleet on one API server.
//!
//! A kubeconfig that cannot be read is refused with a clear error
//! ([`ClusterEvent::Refused`]) and never ends the stream; a cluster already announced
//! keeps its last good credentials until a readable kubeconfig replaces them or the
//! cluster goes.
//!
//! ```no_run
//! use futures::StreamExt;
//! use kube_informer::{CancellationToken, fleet::{ClusterEvent, ClusterProvider, KubeconfigDirectory}};
//!
//! # async fn doc() {
//! let mut clusters = KubeconfigDirectory::new("/etc/fleet").events(CancellationToken::new());
//! while let Some(event) = clusters.next().await {
//!     match event {
//!         ClusterEvent::Appeared(cluster) => println!("{} is here", cluster.name()),
//!         ClusterEvent::Changed(cluster) => println!("{} has new credentials", cluster.name()),
//!         ClusterEvent::Gone(name) => println!("{name} went"),
//!         ClusterEvent::Refused { cluster, error } => println!("{cluster:?}: {error}"),
//!         _ => {}
//!     }
//! }
//! # }
//! ```

mod directory;
mod kubeconfig;
#[cfg(feature = "prometheus")]
mod metrics;
mod namespaces;
mod run;
mod secrets;

use std::{fmt, sync::Arc};

use futures::stream::BoxStream;
use kube_client::Client;
use tokio_util::sync::CancellationToken;

pub use directory::KubeconfigDirectory;
pub use namespaces::NamespaceClusters;
pub use run::{
    ClusterPhase, ClusterStatus, Engaged, FLEET_WORKING_SET_BYTES, Fleet, FleetView, Reachability,
};
pub use secrets::{KUBECONFIG_SECRET_KEY, KUBECONFIG_SECRET_LABEL, KubeconfigSecrets};

/// A cluster's name in a fleet: the file, Secret or namespace it comes from. Cheap to
/// clone (a shared string).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterName(Arc<str>);

impl ClusterName {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The slot, of a [ring](crate::sharding::ShardRing) of `slots`, this cluster falls
    /// in when a fleet is [spread over](Fleet::spread_over) the ring: it runs on the
    /// replica dealt that slot ([`dealt_slots`](crate::sharding::dealt_slots)).
    ///
    /// ```
    /// use kube_informer::fleet::ClusterName;
    ///
    /// let slot = ClusterName::from("edge-1").slot(16);
    /// assert!(slot < 16);
    /// ```
    pub fn slot(&self, slots: u16) -> u16 {
        run::cluster_slot(self, slots)
    }
}

impl From<&str> for ClusterName {
    fn from(name: &str) -> Self {
        Self(name.into())
    }
}

impl From<String> for ClusterName {
    fn from(name: String) -> Self {
        Self(name.into())
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// One cluster of a fleet: its name, a client for it and, for a cluster that is one
/// namespace of a larger one ([`NamespaceClusters`]), that namespace.
#[derive(Clone)]
pub struct Cluster {
    name: ClusterName,
    client: Client,
    namespace: Option<String>,
}

impl Cluster {
    /// A cluster reached through `client`, every namespace of it.
    pub fn new(name: impl Into<ClusterName>, client: Client) -> Self {
        Self {
            name: name.into(),
            client,
            namespace: None,
        }
    }

    /// Only `namespace` of it: what runs against this cluster lists, watches and writes
    /// namespaced objects there alone.
    #[must_use]
    pub fn in_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Its name in the fleet.
    pub fn name(&self) -> &ClusterName {
        &self.name
    }

    /// A client for it (a clone shares the connections).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The one namespace it is, if it is one namespace of a larger cluster.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// What a [`ClusterProvider`] saw.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClusterEvent {
    /// A cluster to engage: first seen, or seen again after it went.
    Appeared(Cluster),
    /// A cluster already announced has new credentials or a new endpoint: what runs
    /// against it should start again with this client.
    Changed(Cluster),
    /// A cluster is gone: stop what runs against it and free its memory.
    Gone(ClusterName),
    /// The provider could not read a cluster (`cluster` names it) or its own source
    /// (`cluster` is `None`: the directory, the hub's Secrets). Nothing changes: a cluster
    /// already announced keeps its last good client.
    Refused {
        /// The cluster whose kubeconfig was refused, if the error is about one.
        cluster: Option<ClusterName>,
        /// Why.
        error: FleetError,
    },
}

/// Why a provider refused a cluster or could not read its source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    /// A kubeconfig that cannot be used: not UTF-8, not YAML, no current context, bad
    /// credentials, or too large.
    #[error("kubeconfig from {origin}: {reason}")]
    Kubeconfig {
        /// Where it came from: a file's path, `Secret <namespace>/<name>`.
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two sources give the same cluster name (`a.yaml` and `a.kubeconfig`): the first in
    /// name order is kept.
    #[error("cluster name {name:?} is given by both {kept} and {refused}; {refused} is ignored")]
    DuplicateName {
        /// The name both give.
        name: String,
        /// The source kept.
        kept: String,
        /// The source ignored.
        refused: String,
    },
    /// A kubeconfig directory that cannot be read.
    #[error("reading directory {path}: {source}")]
    Directory {
        /// The directory.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The source in a cluster could not be listed or watched (no RBAC to list Secrets,
    /// the hub unreachable): reported at each failure while its informer retries.
    #[error("following {what}: {reason}")]
    Source {
        /// What was followed, e.g. `Secrets in fleet-system labelled ...`.
        what: String,
        /// The list or watch error, as the informer reported it.
        reason: String,
    },
}

/// A stream of what a provider sees; it ends once the provider's token is cancelled.
pub type ClusterEvents = BoxStream<'static, ClusterEvent>;

/// Says which clusters a fleet has, and when each appears, changes or goes.
///
/// The stream starts with an [`Appeared`](ClusterEvent::Appeared) for each cluster present
/// when the provider starts, then follows changes until `cancel` is cancelled, when it
/// ends. A name is announced at most once until it is [`Gone`](ClusterEvent::Gone);
/// [`Changed`](ClusterEvent::Changed) follows only an `Appeared`.
///
/// Write your own from any source of clusters (a Cluster API inventory, a service
/// registry) by turning it into such a stream.
pub trait ClusterProvider: Send + 'static {
    /// Starts following the clusters; the stream ends once `cancel` is cancelled.
    fn events(self, cancel: CancellationToken) -> ClusterEvents;
}

/// The events a provider sends through a channel, as a stream that ends when the sender
/// side is dropped.
fn channel_stream(mut rx: tokio::sync::mpsc::UnboundedReceiver<ClusterEvent>) -> ClusterEvents {
    Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}
