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
//! - [`Store`]: the indexed cache, compact by default (objects kept as the bytes the
//!   server sent, decoded on read) or of shared `Arc<K>`s, read-only to its users, with a
//!   [`Lister`] on top;
//! - [`reflector`]: the list-then-watch loop with client-go's semantics (pages of 500,
//!   bookmarks, resume without relist, relist on 410, jittered backoff, idle detection),
//!   its configuration and its counters;
//! - [`SharedInformer`]: reflector + store + any number of [`EventHandler`]s, each with its
//!   own buffer and task; [`spawn`](SharedInformer::spawn) gives a [`RunningInformer`];
//! - [`workqueue`]: deduplicating, delaying and rate-limited queues with metrics;
//! - [`Controller`]: informers' changes mapped to keys on a rate-limited workqueue, and
//!   the workers that reconcile each key;
//! - [`Manager`]: a factory's informers, controllers, probes, metrics, leader election and
//!   a bounded shutdown (feature `manager`);
//! - [`leader_election`]: a Lease-based leader elector (feature `leader-election`);
//! - [`sharding`]: a shard ring on Leases, for one controller split across replicas.

pub mod apply;
#[cfg(feature = "cli")]
#[cfg_attr(docsrs, doc(cfg(feature = "cli")))]
pub mod cli;
mod client;
pub mod codec;
pub mod conditions;
mod controller;
mod error;
pub mod events;
mod informer;
mod key;
#[cfg(feature = "leader-election")]
#[cfg_attr(docsrs, doc(cfg(feature = "leader-election")))]
pub mod leader_election;
pub mod lease;
pub mod list_watch;
#[cfg(feature = "manager")]
#[cfg_attr(docsrs, doc(cfg(feature = "manager")))]
mod manager;
pub mod reflector;
mod replica;
pub mod sharding;
mod store;
mod task;
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
pub mod workqueue;

pub use client::{ClusterSource, KeepAlive, client, client_with};
#[cfg(feature = "prometheus")]
pub use controller::ControllerMetrics;
pub use controller::{
    Action, ClientError, Controller, ControllerClient, ControllerStats, ErrorAction, Failure,
    FinalizerError, FinalizerEvent, OwnWriteStats, OwnWrites, Predicate, ReconcileError,
    ReconcileRequest, Reconciler, SyncFuture, Writable, finalizer, retry_up_to, retry_with_backoff,
    sync_by_key,
};
pub use error::{BoxError, Error, StreamingRefusal, Verb};
pub use informer::{
    DeletedFinalStateUnknown, DeletedObject, Delivery, DivergenceCheck, DivergenceStats, Drift,
    EventHandler, FactoryDefaults, FactoryScope, HANDLER_BACKLOG_WARNING, HANDLER_COALESCE_AFTER,
    HandlerFn, HandlerRegistration, HandlerStats, HasSynced, InformerBuilder, InformerFactory,
    InformerHandle, InformerHealth, InformerStatus, InitialAdds, KeyHandler, MIN_RESYNC_PERIOD,
    OutdatedObject, Repair, RunningInformer, Scope, SharedInformer, TypedResource, handler_fn,
    key_handler, wait_for_cache_sync,
};
pub use key::ObjectKey;
pub use list_watch::LazyObject;
#[cfg(feature = "manager")]
pub use manager::{BoundManager, Manager, ManagerError, cancel_on_signals};
pub use store::{
    IndexFn, Lister, NAMESPACE_INDEX, Operator, Requirement, Selector, SelectorError, Store,
    StoreIter, TransformFn, WorkingSet, WorkingSetStats, label_index, namespace_index,
    owner_uid_index, strip_managed_fields,
};
/// The token that stops informers, controllers and queues (re-exported from `tokio-util`).
pub use tokio_util::sync::CancellationToken;
