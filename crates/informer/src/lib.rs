#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
//!
//! # Layout
//!
//! The pieces, named as in client-go so a reader who knows it finds them at once, from the
//! wire up (each layer uses only the ones before it; `ARCHITECTURE.md` in the repository
//! draws the edges):
//!
//! - [`list_watch`]: the [`ListWatch`](list_watch::ListWatch) trait, paged list plus
//!   watch from a resourceVersion, implemented for [`kube_client::Api`] (typed resources,
//!   `DynamicObject`, metadata-only objects) and
//!   [`ApiListWatch`](list_watch::ApiListWatch), with the types an implementation speaks;
//!   built-in kinds are read in protobuf, as client-go reads them, into the same serde
//!   types that read JSON;
//! - [`codec`]: how a compact store keeps objects that came without the server's bytes,
//!   and the [`Codec`](codec::Codec) trait for a format of your own;
//! - [`store`]: the indexed cache ([`Store`]), compact by default (objects kept as the bytes the
//!   server sent, decoded on read) or of shared `Arc<K>`s, read-only to its users, with a
//!   [`Lister`] on top;
//! - [`reflector`]: the list-then-watch loop with client-go's semantics (pages of 500,
//!   bookmarks, resume without relist, relist on 410, jittered backoff, idle detection),
//!   its configuration and its counters;
//! - [`informer`]: [`SharedInformer`], reflector + store + any number of [`EventHandler`]s, each with its
//!   own buffer and task; [`spawn`](SharedInformer::spawn) gives a [`RunningInformer`];
//! - [`workqueue`]: deduplicating, delaying and rate-limited queues with metrics;
//! - [`controller`]: [`Controller`], informers' changes mapped to keys on a rate-limited workqueue, and
//!   the workers that reconcile each key;
//! - [`manager`]: [`Manager`], a factory's informers, controllers, probes, metrics, leader election and
//!   a bounded shutdown (feature `manager`);
//! - [`leader_election`]: a Lease-based leader elector (feature `leader-election`);
//! - [`sharding`]: a shard ring on Leases, for one controller split across replicas;
//! - [`fleet`]: many clusters that come and go, as [`ClusterProvider`](fleet::ClusterProvider)s
//!   announce them (kubeconfig files, a hub's Secrets, namespaces as clusters);
//! - [`client`](mod@client), [`lease`], [`error`](mod@error): the API client informers use, the Lease settings
//!   leader election and the ring share, and the errors.
//!
//! The crate root holds what a controller's author needs; the rest stays in its module
//! (`kube_informer::informer::HandlerStats`, `kube_informer::store::label_index`).

pub mod apply;
#[cfg(feature = "cli")]
#[cfg_attr(docsrs, doc(cfg(feature = "cli")))]
pub mod cli;
pub mod client;
pub mod codec;
pub mod conditions;
pub mod controller;
pub mod error;
pub mod events;
pub mod fleet;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod informer;
mod key;
#[cfg(feature = "leader-election")]
#[cfg_attr(docsrs, doc(cfg(feature = "leader-election")))]
pub mod leader_election;
pub mod lease;
pub mod list_watch;
#[cfg(feature = "manager")]
#[cfg_attr(docsrs, doc(cfg(feature = "manager")))]
pub mod manager;
#[cfg(feature = "manager")]
mod metrics;
pub mod reflector;
mod replica;
pub mod sharding;
mod stats;
pub mod store;
mod task;
#[cfg(feature = "opentelemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
pub mod workqueue;

pub use client::{ClusterSource, client};
pub use controller::{
    Action, ClientError, Controller, ControllerClient, ErrorAction, Failure, FinalizerError,
    FinalizerEvent, Predicate, ReconcileError, ReconcileRequest, Reconciler, finalizer,
    retry_up_to, retry_with_backoff, sync_by_key,
};
pub use error::Error;
pub use informer::{
    DeletedObject, Delivery, EventHandler, FactoryDefaults, FactoryScope, InformerFactory,
    InformerHandle, RunningInformer, Scope, SharedInformer, TypedResource, handler_fn,
    wait_for_cache_sync,
};
pub use key::ObjectKey;
#[cfg(feature = "manager")]
pub use manager::{Manager, ManagerError, cancel_on_signals};
pub use stats::LiveStats;
pub use store::{Lister, Selector, Store, WorkingSet};
/// The token that stops informers, controllers and queues (re-exported from `tokio-util`).
pub use tokio_util::sync::CancellationToken;
