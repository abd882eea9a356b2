//! Client-go's informer machinery for Rust, on the kube-rs client.
//!
//! The pieces, named as in client-go so a reader who knows it finds them at once:
//!
//! - [`ListWatch`]: paged list plus watch from a resourceVersion, implemented for
//!   [`kube_client::Api`] (typed resources, `DynamicObject`, metadata-only objects);
//! - [`Reflector`]: the list-then-watch loop with client-go's semantics (pages of 500,
//!   bookmarks, resume without relist, relist on 410, jittered backoff, idle detection);
//! - [`Store`]: the indexed cache, objects shared as `Arc<K>`, with a [`Lister`] on top;
//! - [`SharedInformer`]: reflector + store + any number of [`EventHandler`]s, each with its
//!   own buffer and task;
//! - [`workqueue`]: deduplicating, delaying and rate-limited queues with metrics;
//! - [`controller`]: the worker loop that ties an informer to a workqueue of keys;
//! - [`meta`]: metadata access that works the same for every resource type;
//! - [`protobuf`]: built-in kinds read in protobuf, as client-go reads them, into the same
//!   serde types that read JSON.
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_client::{Api, Client};
//! use kube_informer::{ApiListWatch, SharedInformer, handler_fn};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::try_default().await?;
//! let informer = SharedInformer::new(ApiListWatch::new(Api::<ConfigMap>::all(client)));
//! informer.add_handler(
//!     handler_fn()
//!         .on_add(|cm: &std::sync::Arc<ConfigMap>, _initial| println!("added {:?}", cm.metadata.name))
//!         .on_update(|_old, new| println!("updated {:?}", new.metadata.name)),
//! );
//! let stop = CancellationToken::new();
//! tokio::spawn(informer.run(stop.clone()));
//! informer.wait_synced().await;
//! println!("{} config maps cached", informer.store().len());
//! # Ok(())
//! # }
//! ```

pub mod backoff;
pub mod codec;
pub mod controller;
pub mod error;
pub mod handler;
pub mod index;
pub mod informer;
pub mod key;
pub mod leader_election;
mod list_body;
mod list_decoder;
pub mod list_watch;
pub mod lister;
pub mod meta;
pub mod protobuf;
pub mod reflector;
pub mod selector;
pub mod store;
pub mod testing;
mod watch_body;
mod wire_format;
pub mod workqueue;

pub use backoff::{Backoff, BackoffConfig};
pub use codec::{Codec, JsonCodec};
pub use error::{Error, Verb};
pub use handler::{
    DeletedFinalStateUnknown, DeletedObject, EventHandler, HandlerFn, HandlerRegistration,
    HasSynced, KeyHandler, handler_fn, key_handler,
};
pub use index::{IndexFn, NAMESPACE_INDEX};
pub use informer::{InformerBuilder, SharedInformer, wait_for_cache_sync};
pub use key::ObjectKey;
pub use kube_client::api::VersionMatch;
pub use list_watch::{
    ApiListWatch, ListItem, ListOptions, ListPage, ListStream, ListWatch, WatchEvent, WatchOptions,
    WatchStream,
};
pub use lister::Lister;
pub use protobuf::ProtobufError;
pub use reflector::{
    ErrorHook, ListMode, Reflector, ReflectorConfig, ReflectorStore, SyncedVersion,
};
pub use selector::{Operator, Requirement, Selector, SelectorError};
pub use store::{Store, TransformFn, strip_managed_fields};
pub use wire_format::WireFormat;
