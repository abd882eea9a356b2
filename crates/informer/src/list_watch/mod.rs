//! The source of objects: a paged list plus a watch, as the API server serves them.
//! The full documentation is on [`ListWatch`].
//!
//! An informer takes any [`ListWatch`]: a kube-client `Api<K>` (typed resources,
//! `DynamicObject`, metadata-only objects), an [`ApiListWatch`] (an `Api` with selectors and
//! a wire format), or your own source. This module holds what an implementation of the
//! trait speaks: the options of a list and a watch, the pages and events it yields, and the
//! bytes an object arrived in.

mod api;
mod batch;
mod json_list;
mod lazy;
mod list_body;
mod protobuf;
mod raw;
mod shard;
mod watch_body;
mod wire_format;

use std::{future::Future, time::Duration};

use futures::{StreamExt, stream::BoxStream};

use kube_core::{Resource, Status};

use serde::Deserialize;

use crate::{error::Error, key::ObjectKey};

pub use api::ApiListWatch;
pub use kube_client::api::VersionMatch;
pub use lazy::LazyObject;
pub(crate) use protobuf::field_sets::FieldSetMemo;
pub(crate) use protobuf::schema::Resource as ProtobufResource;
#[cfg(test)]
pub(crate) use protobuf::test_encoder;
pub use protobuf::{KUBERNETES_API_VERSION, ProtobufError};
pub(crate) use raw::RawFormat;
pub use raw::RawObject;
pub use shard::{HashRange, Shard, ShardField, ShardMode, fnv1a_64};
pub use wire_format::WireFormat;
#[cfg(feature = "fuzzing")]
pub(crate) use {
    api::{error_status, list_request_at, watch_request_at},
    json_list::ListDecoder,
    list_body::{BodySplitter, decode_list_body},
    protobuf::{envelope::Envelope, list_decoder::ProtobufListDecoder, watch_decoder::MAX_FRAME},
    watch_body::{WatchFraming, decode_watch_body},
    wire_format::Encoding,
};

/// The newtype name under which a [`LazyObject`] asks a deserializer for the object's own
/// bytes. The protobuf deserializer answers with the message's bytes; any other
/// deserializer wraps the object itself, which serde_json then hands over as its text.
pub(crate) const LAZY_OBJECT_TOKEN: &str = "$kube_informer::LazyObject";

/// Options of one list call (one page).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListOptions {
    /// Page size (`limit`); `None` asks for everything at once. With resourceVersion `"0"` the
    /// API server serves from its watch cache and may ignore the limit.
    pub limit: Option<u32>,
    /// The `continue` token of the previous page. When set, `resource_version` and
    /// `version_match` must be `None`: the token carries the list's snapshot.
    pub continue_token: Option<String>,
    /// `resourceVersion`: `None`/`""` for a consistent (quorum) read, `"0"` for any cached
    /// state, or a version seen before.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`: how `resource_version` is interpreted (`NotOlderThan`, `Exact`).
    pub version_match: Option<VersionMatch>,
    /// `shardSelector`: only the shard's objects (a server with the `ShardedListAndWatch`
    /// gate selects them and echoes the selector in [`ListItem::End`]; one without sends
    /// everything).
    pub shard: Option<Shard>,
}

/// One page of a list.
#[derive(Clone, Debug)]
pub struct ListPage<K> {
    /// The objects of this page.
    pub items: Vec<K>,
    /// The list's resourceVersion (the same on every page of one paged list).
    pub resource_version: String,
    /// Token for the next page; `None` on the last page.
    pub continue_token: Option<String>,
    /// `metadata.shardInfo.selector`: the shard selector the server applied, if any.
    pub shard_selector: Option<String>,
}

/// One item of a list page read as a stream ([`ListWatch::list_stream`]).
#[derive(Clone, Debug)]
pub enum ListItem<K> {
    /// The next object of the page.
    Object(K),
    /// The next object of the page, with the bytes it was decoded from (what
    /// [`ApiListWatch`] sends): a compact store keeps them instead of encoding the object.
    Decoded {
        /// The object.
        object: K,
        /// Its bytes, as the server sent them.
        raw: RawObject,
    },
    /// The next object of the page, which does not decode as `K`; its key was read from its
    /// metadata alone. The reflector keeps the object's last good state and reports it.
    Undecodable(Undecodable),
    /// The page is complete; always the last item.
    End {
        /// The list's resourceVersion (the same on every page of one paged list).
        resource_version: String,
        /// Token for the next page; `None` on the last page.
        continue_token: Option<String>,
        /// `metadata.shardInfo.selector`: the shard selector the server applied, if it
        /// applied one.
        shard_selector: Option<String>,
    },
}

impl<K> ListItem<K> {
    /// The object of an [`Object`](Self::Object) or [`Decoded`](Self::Decoded) item.
    pub fn object(&self) -> Option<&K> {
        match self {
            ListItem::Object(object) | ListItem::Decoded { object, .. } => Some(object),
            ListItem::Undecodable(_) | ListItem::End { .. } => None,
        }
    }
}

/// An object that arrived but does not decode as the informer's type: a field of the wrong
/// type, one the type requires but the object lacks, a value the decoder refuses. Its key
/// decoded, from its metadata alone, so one bad object does not stop the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undecodable {
    /// The object's key.
    pub key: ObjectKey,
    /// The object's resourceVersion, when it could be read.
    pub resource_version: Option<String>,
    /// Why it does not decode.
    pub reason: String,
}

/// Which change a watch event reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// `ADDED`.
    Added,
    /// `MODIFIED`.
    Modified,
    /// `DELETED`.
    Deleted,
}

/// A list page as a stream: objects as they are decoded, then [`ListItem::End`]. An error
/// ends it.
pub type ListStream<K> = BoxStream<'static, Result<ListItem<K>, Error>>;

/// What the envelope of a list says about the list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ListEnd {
    /// `metadata.resourceVersion`.
    pub(crate) resource_version: String,
    /// `metadata.continue`, if not empty.
    pub(crate) continue_token: Option<String>,
    /// `metadata.shardInfo.selector`.
    pub(crate) shard_selector: Option<String>,
}

/// An object's key and resourceVersion: what a divergence check compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectVersion {
    /// The object's key.
    pub key: ObjectKey,
    /// Its `metadata.resourceVersion`.
    pub resource_version: String,
}

impl ObjectVersion {
    /// The key and version of `object`; `None` without a name.
    pub fn of<K: Resource>(object: &K) -> Option<Self> {
        Some(Self {
            key: ObjectKey::from_object(object).ok()?,
            resource_version: object.meta().resource_version.clone().unwrap_or_default(),
        })
    }
}

/// One page of keys and resourceVersions ([`ListWatch::list_versions`]).
#[derive(Clone, Debug)]
pub struct VersionPage {
    /// The objects of this page.
    pub items: Vec<ObjectVersion>,
    /// The list's resourceVersion.
    pub resource_version: String,
    /// Token for the next page; `None` on the last page.
    pub continue_token: Option<String>,
}

/// Options of a watch call.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchOptions {
    /// Start after this resourceVersion.
    pub resource_version: String,
    /// Server-side timeout (`timeoutSeconds`): the server ends the watch normally after it.
    pub timeout: Option<Duration>,
    /// `allowWatchBookmarks`: ask for `BOOKMARK` events carrying a fresh resourceVersion.
    pub allow_bookmarks: bool,
    /// `sendInitialEvents` (a *streaming list*, Kubernetes 1.27+): the watch first sends the
    /// current state as `ADDED` events, then a bookmark marked
    /// [`initial_events_end`](WatchEvent::Bookmark::initial_events_end), then changes.
    /// `resource_version` is then read as "not older than" (`""`: a consistent read), and
    /// `allow_bookmarks` must be set.
    pub send_initial_events: bool,
    /// `shardSelector`: only the shard's objects, where the server applies it.
    pub shard: Option<Shard>,
}

/// One event of a watch stream.
#[derive(Clone, Debug)]
pub enum WatchEvent<K> {
    /// An object was created (or first seen by this watch).
    Added(K),
    /// An object changed.
    Modified(K),
    /// An object was deleted; this is its last state.
    Deleted(K),
    /// Nothing changed, but the collection reached this resourceVersion.
    Bookmark {
        /// The collection's resourceVersion.
        resource_version: String,
        /// True on the bookmark that ends the initial events of a streaming list
        /// (annotation `k8s.io/initial-events-end: "true"`).
        initial_events_end: bool,
    },
    /// An `ERROR` event: the server ends the watch with this status (410 when the start
    /// resourceVersion was compacted away).
    Error(Box<Status>),
    /// An object was added or changed ([`Change::Added`] or [`Change::Modified`]), with the
    /// bytes it was decoded from (what [`ApiListWatch`] sends): a compact store keeps them
    /// instead of encoding the object.
    Decoded {
        /// Which change.
        change: Change,
        /// The object.
        object: K,
        /// Its bytes, as the server sent them.
        raw: RawObject,
    },
    /// A change to an object that does not decode as `K` (see [`Undecodable`]).
    Undecodable {
        /// Which change.
        change: Change,
        /// The object's key, and why it does not decode.
        object: Undecodable,
    },
}

impl<K> WatchEvent<K> {
    /// The object of an added, modified, deleted or decoded event.
    pub fn object(&self) -> Option<&K> {
        match self {
            WatchEvent::Added(object)
            | WatchEvent::Modified(object)
            | WatchEvent::Deleted(object)
            | WatchEvent::Decoded { object, .. } => Some(object),
            WatchEvent::Bookmark { .. } | WatchEvent::Error(_) | WatchEvent::Undecodable { .. } => {
                None
            }
        }
    }
}

/// A watch stream: events, or errors (transport, undecodable event) after which the stream
/// should be dropped.
pub type WatchStream<K> = BoxStream<'static, Result<WatchEvent<K>, Error>>;

/// A source that can list and watch one kind of object (client-go's `ListerWatcher`).
///
///.
///
/// # Example
///
/// ```
/// use kube_informer::{list_watch::{ListOptions, ListWatch}, testing::FakeListWatch};
/// use k8s_openapi::api::core::v1::ConfigMap;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let fake = FakeListWatch::<ConfigMap>::new("configmaps");
/// fake.add(FakeListWatch::<ConfigMap>::object(Some("ns"), "a"));
/// let page = fake.list(&ListOptions::default()).await.unwrap();
/// assert_eq!(page.items.len(), 1);
/// assert!(page.continue_token.is_none());
/// # }
/// ```
///
/// The source of objects: a paged list plus a watch, as the API server serves them.
///
/// [`ListWatch`] is what a [`Reflector`](crate::reflector::Reflector) consumes. It is implemented for
/// [`kube_client::Api<K>`] (typed k8s-openapi resources, [`DynamicObject`] with an
/// [`ApiResource`] for CRDs without Rust types, and metadata-only
/// [`PartialObjectMeta<K>`], which `kube-client` lists and watches through the metadata API),
/// for [`ApiListWatch`] (an `Api` plus label/field selectors), and for the in-memory
/// `FakeListWatch` of the `testing` module (feature `testing`) used in tests.
///
/// Built-in kinds are listed and watched in protobuf, as client-go does, and read into the
/// same serde types as JSON (a serde `Deserializer` over the protobuf bytes, steered by a
/// table read from the Go types); large protobuf lists are decoded on all cores.
///
/// # Why `impl Future + Send` and not boxed futures
///
/// The trait uses native async-in-trait (`fn list(..) -> impl Future<..> + Send`): one list
/// page or watch call costs no allocation and implementors write plain `async fn`s. The trait
/// is therefore not object safe, and need not be: the reflector is generic over it, and
/// [`SharedInformer`](crate::SharedInformer) erases it once, at construction, into a single
/// boxed run future, so `SharedInformer<K>` carries no `ListWatch` type parameter. Only the
/// watch *stream* is boxed ([`WatchStream`]): `kube-client`'s stream type cannot be named,
/// and one allocation per watch connection is nothing.
///
/// [`DynamicObject`]: kube_core::DynamicObject
/// [`ApiResource`]: kube_core::ApiResource
/// [`PartialObjectMeta<K>`]: kube_core::PartialObjectMeta
pub trait ListWatch<K>: Send + Sync + 'static {
    /// The watched resource for logs and errors, as RBAC names it: `plural[.group]`.
    fn resource(&self) -> String;

    /// The namespace this source is restricted to, `None` for all namespaces or a
    /// cluster-scoped kind.
    fn namespace(&self) -> Option<String> {
        None
    }

    /// The label and field selectors this source lists with, in one line (empty when it
    /// has none). With the resource, the namespace and the shard, it tells one selection
    /// from another: a [warm restart](crate::reflector::WarmRestart)'s snapshot is used only
    /// by an informer of the selection it was taken of.
    fn selectors(&self) -> String {
        String::new()
    }

    /// Lists one page.
    ///
    /// # Errors
    ///
    /// [`Error::Gone`] when the resourceVersion or continue token expired, [`Error::Forbidden`],
    /// [`Error::Decode`] when the page does not decode, [`Error::Api`], [`Error::Transport`].
    fn list(
        &self,
        options: &ListOptions,
    ) -> impl Future<Output = Result<ListPage<K>, Error>> + Send;

    /// Lists one page as a stream of objects, so that they can be stored while the rest of
    /// the page is still arriving; the reflector lists through this. The default calls
    /// [`list`](Self::list) and streams its items.
    ///
    /// # Errors
    ///
    /// As for [`list`](Self::list), for the response; errors while reading the page (a
    /// torn connection, an object that does not decode) arrive as items of the stream.
    fn list_stream(
        &self,
        options: &ListOptions,
    ) -> impl Future<Output = Result<ListStream<K>, Error>> + Send
    where
        K: Send + 'static,
    {
        let page = self.list(options);
        async move {
            let page = page.await?;
            let end = ListItem::End {
                resource_version: page.resource_version,
                continue_token: page.continue_token,
                shard_selector: page.shard_selector,
            };
            let items = page.items.into_iter().map(ListItem::Object);
            Ok(futures::stream::iter(items.chain([end]).map(Ok)).boxed())
        }
    }

    /// Lists one page of keys and resourceVersions only, for a divergence check. The
    /// default lists whole objects through [`list`](Self::list); the `Api` implementations
    /// ask for metadata only, which is far lighter on the server and the wire.
    ///
    /// # Errors
    ///
    /// As for [`list`](Self::list).
    fn list_versions(
        &self,
        options: &ListOptions,
    ) -> impl Future<Output = Result<VersionPage, Error>> + Send
    where
        K: Resource,
    {
        let page = self.list(options);
        async move {
            let page = page.await?;
            Ok(VersionPage {
                items: page.items.iter().filter_map(ObjectVersion::of).collect(),
                resource_version: page.resource_version,
                continue_token: page.continue_token,
            })
        }
    }

    /// The resourceVersion of the state the server would list now from its cache (a list
    /// at resourceVersion `"0"`, the freshness of an informer's first list), read without
    /// listing the objects. A [warm restart](crate::reflector::WarmRestart)'s watch has
    /// caught up once it has seen this version. The default lists one object
    /// consistently (its version is the storage's, newer still); the `Api`
    /// implementations ask the cache for a list that selects no object.
    ///
    /// # Errors
    ///
    /// As for [`list`](Self::list).
    fn cached_version(&self) -> impl Future<Output = Result<String, Error>> + Send {
        let options = ListOptions {
            limit: Some(1),
            ..ListOptions::default()
        };
        async move { Ok(self.list(&options).await?.resource_version) }
    }

    /// Starts a watch.
    ///
    /// # Errors
    ///
    /// As for [`list`](Self::list), for the initial response; errors while streaming arrive
    /// as items of the stream.
    fn watch(
        &self,
        options: &WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<K>, Error>> + Send;
}

/// The annotation on the bookmark that ends a streaming list's initial events.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

impl<K> From<kube_core::WatchEvent<K>> for WatchEvent<K> {
    /// kube-core's watch event as ours.
    fn from(event: kube_core::WatchEvent<K>) -> Self {
        match event {
            kube_core::WatchEvent::Added(o) => WatchEvent::Added(o),
            kube_core::WatchEvent::Modified(o) => WatchEvent::Modified(o),
            kube_core::WatchEvent::Deleted(o) => WatchEvent::Deleted(o),
            kube_core::WatchEvent::Bookmark(b) => WatchEvent::Bookmark {
                initial_events_end: b
                    .metadata
                    .annotations
                    .get(INITIAL_EVENTS_END)
                    .is_some_and(|v| v == "true"),
                resource_version: b.metadata.resource_version,
            },
            kube_core::WatchEvent::Error(status) => WatchEvent::Error(status),
        }
    }
}

/// An object's key and nothing else: what can still be read of an object that does not
/// decode as its type (any format serde reads, including this crate's protobuf).
#[derive(Deserialize)]
pub(crate) struct KeyOnly {
    metadata: KeyMeta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
}

impl KeyOnly {
    /// The key, when the object has a name.
    pub(crate) fn key(&self) -> Option<ObjectKey> {
        let name = self.metadata.name.as_deref()?;
        Some(ObjectKey::new(self.metadata.namespace.as_deref(), name))
    }

    /// What an undecodable object still tells: its key, its version, and why.
    pub(crate) fn undecodable(self, reason: String) -> Option<Undecodable> {
        Some(Undecodable {
            key: self.key()?,
            resource_version: self.metadata.resource_version,
            reason,
        })
    }
}
