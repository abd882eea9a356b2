//! The source of objects: a paged list plus a watch, as the API server serves them.
//!
//! [`ListWatch`] is what a [`Reflector`](crate::Reflector) consumes. It is implemented for
//! [`kube_client::Api<K>`] (typed k8s-openapi resources, [`DynamicObject`] with an
//! [`ApiResource`] for CRDs without Rust types, and metadata-only
//! [`PartialObjectMeta<K>`], which `kube-client` lists and watches through the metadata API),
//! for [`ApiListWatch`] (an `Api` plus label/field selectors), and for the in-memory
//! [`FakeListWatch`](crate::testing::FakeListWatch) used in tests.
//!
//! Built-in kinds are listed and watched in protobuf, as client-go does, and read into the
//! same serde types as JSON (see [`protobuf`]); large protobuf lists are decoded on all
//! cores.
//!
//! # Why `impl Future + Send` and not boxed futures
//!
//! The trait uses native async-in-trait (`fn list(..) -> impl Future<..> + Send`): one list
//! page or watch call costs no allocation and implementors write plain `async fn`s. The trait
//! is therefore not object safe, and need not be: the reflector is generic over it, and
//! [`SharedInformer`](crate::SharedInformer) erases it once, at construction, into a single
//! boxed run future, so `SharedInformer<K>` carries no `ListWatch` type parameter. Only the
//! watch *stream* is boxed ([`WatchStream`]): `kube-client`'s stream type cannot be named,
//! and one allocation per watch connection is nothing.
//!
//! [`DynamicObject`]: kube_core::DynamicObject
//! [`ApiResource`]: kube_core::ApiResource
//! [`PartialObjectMeta<K>`]: kube_core::PartialObjectMeta

use std::{fmt::Debug, future::Future, time::Duration};

use futures::{StreamExt, stream::BoxStream};
use http_body_util::BodyExt;
use kube_client::{
    Api,
    api::{ListParams, VersionMatch, WatchParams},
};
use kube_core::{ObjectList, Resource, Status};
use serde::de::DeserializeOwned;

use crate::{
    Error, WireFormat,
    error::Verb,
    list_body::{BodySplitter, decode_list_body},
    list_decoder::ListDecoder,
    protobuf::{self, ProtobufListDecoder},
    watch_body::decode_watch_body,
};

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
}

/// One item of a list page read as a stream ([`ListWatch::list_stream`]).
#[derive(Clone, Debug)]
pub enum ListItem<K> {
    /// The next object of the page.
    Object(K),
    /// The page is complete; always the last item.
    End {
        /// The list's resourceVersion (the same on every page of one paged list).
        resource_version: String,
        /// Token for the next page; `None` on the last page.
        continue_token: Option<String>,
    },
}

/// A list page as a stream: objects as they are decoded, then [`ListItem::End`]. An error
/// ends it.
pub type ListStream<K> = BoxStream<'static, Result<ListItem<K>, Error>>;

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
}

/// A watch stream: events, or errors (transport, undecodable event) after which the stream
/// should be dropped.
pub type WatchStream<K> = BoxStream<'static, Result<WatchEvent<K>, Error>>;

/// A source that can list and watch one kind of object (client-go's `ListerWatcher`).
///
/// See the [module docs](self) for why the methods return `impl Future + Send`.
///
/// # Example
///
/// ```
/// use kube_informer::{ListOptions, ListWatch, testing::FakeListWatch};
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
pub trait ListWatch<K>: Send + Sync + 'static {
    /// The watched resource for logs and errors, as RBAC names it: `plural[.group]`.
    fn resource(&self) -> String;

    /// The namespace this source is restricted to, `None` for all namespaces or a
    /// cluster-scoped kind.
    fn namespace(&self) -> Option<String> {
        None
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
            };
            let items = page.items.into_iter().map(ListItem::Object);
            Ok(futures::stream::iter(items.chain([end]).map(Ok)).boxed())
        }
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

/// An [`Api`] plus label and field selectors (client-go's `NewFilteredListWatchFromClient`).
///
/// ```no_run
/// use k8s_openapi::api::core::v1::Pod;
/// use kube_client::{Api, Client};
/// use kube_informer::{ApiListWatch, SharedInformer};
///
/// # async fn f(client: Client) {
/// let lw = ApiListWatch::new(Api::<Pod>::namespaced(client, "apps"))
///     .labels("app=web")
///     .fields("status.phase=Running");
/// let informer = SharedInformer::new(lw);
/// # }
/// ```
#[derive(Clone)]
pub struct ApiListWatch<K> {
    api: Api<K>,
    label_selector: Option<String>,
    field_selector: Option<String>,
    wire_format: WireFormat,
}

impl<K> ApiListWatch<K> {
    /// Lists and watches everything `api` can see.
    pub fn new(api: Api<K>) -> Self {
        Self {
            api,
            label_selector: None,
            field_selector: None,
            wire_format: WireFormat::default(),
        }
    }

    /// The encoding to ask for: [`WireFormat::Protobuf`] (the default) reads built-in kinds
    /// in protobuf, as client-go does.
    #[must_use]
    pub fn wire_format(mut self, wire_format: WireFormat) -> Self {
        self.wire_format = wire_format;
        self
    }

    /// Restricts to objects matching this label selector (`app=web,tier!=db`).
    #[must_use]
    pub fn labels(mut self, selector: &str) -> Self {
        self.label_selector = Some(selector.to_owned());
        self
    }

    /// Restricts to objects matching this field selector (`metadata.name=x`).
    #[must_use]
    pub fn fields(mut self, selector: &str) -> Self {
        self.field_selector = Some(selector.to_owned());
        self
    }
}

impl<K> ListWatch<K> for ApiListWatch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn resource(&self) -> String {
        describe_url(self.api.resource_url())
    }

    fn namespace(&self) -> Option<String> {
        self.api.namespace().map(str::to_owned)
    }

    async fn list(&self, options: &ListOptions) -> Result<ListPage<K>, Error> {
        api_list(
            &self.api,
            self.label_selector.as_deref(),
            self.field_selector.as_deref(),
            self.wire_format,
            options,
        )
        .await
    }

    async fn list_stream(&self, options: &ListOptions) -> Result<ListStream<K>, Error> {
        api_list_stream(
            &self.api,
            self.label_selector.as_deref(),
            self.field_selector.as_deref(),
            self.wire_format,
            options,
        )
        .await
    }

    async fn watch(&self, options: &WatchOptions) -> Result<WatchStream<K>, Error> {
        api_watch(
            &self.api,
            self.label_selector.as_deref(),
            self.field_selector.as_deref(),
            self.wire_format,
            options,
        )
        .await
    }
}

/// Lists and watches everything the `Api` can see. Works for typed resources,
/// `Api<DynamicObject>` (built with `Api::all_with(client, &api_resource)`) and
/// `Api<PartialObjectMeta<K>>` (metadata only; kube-client sends the metadata `Accept` header).
/// Built-in kinds are read in protobuf, everything else in JSON ([`WireFormat::Protobuf`]);
/// wrap the `Api` in an [`ApiListWatch`] to choose.
///
/// ```no_run
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_client::{Api, Client, core::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta}};
/// use kube_informer::SharedInformer;
///
/// # async fn f(client: Client) {
/// let typed = SharedInformer::new(Api::<ConfigMap>::namespaced(client.clone(), "default"));
///
/// let gvk = GroupVersionKind::gvk("example.com", "v1", "Widget");
/// let ar = ApiResource::from_gvk(&gvk);
/// let dynamic = SharedInformer::new(Api::<DynamicObject>::all_with(client.clone(), &ar));
///
/// let metadata_only = SharedInformer::new(Api::<PartialObjectMeta<ConfigMap>>::all(client));
/// # }
/// ```
impl<K> ListWatch<K> for Api<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn resource(&self) -> String {
        describe_url(self.resource_url())
    }

    fn namespace(&self) -> Option<String> {
        Api::namespace(self).map(str::to_owned)
    }

    async fn list(&self, options: &ListOptions) -> Result<ListPage<K>, Error> {
        api_list(self, None, None, WireFormat::default(), options).await
    }

    async fn list_stream(&self, options: &ListOptions) -> Result<ListStream<K>, Error> {
        api_list_stream(self, None, None, WireFormat::default(), options).await
    }

    async fn watch(&self, options: &WatchOptions) -> Result<WatchStream<K>, Error> {
        api_watch(self, None, None, WireFormat::default(), options).await
    }
}

async fn api_list<K>(
    api: &Api<K>,
    labels: Option<&str>,
    fields: Option<&str>,
    wire: WireFormat,
    options: &ListOptions,
) -> Result<ListPage<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    if protobuf_resource(api, wire).is_some() {
        return collect_page(api_list_stream(api, labels, fields, wire, options).await?).await;
    }
    let resource = describe_url(api.resource_url());
    let fail = |e: kube_client::Error| Error::from_kube(e, Verb::List, &resource, api.namespace());
    let req = list_request(api, labels, fields, options)?;
    let client: kube_client::Client = api.clone().into();
    let list = client.request::<ObjectList<K>>(req).await.map_err(fail)?;
    Ok(ListPage {
        items: list.items,
        resource_version: list.metadata.resource_version.unwrap_or_default(),
        continue_token: list.metadata.continue_.filter(|c| !c.is_empty()),
    })
}

/// One page from its stream.
async fn collect_page<K>(mut stream: ListStream<K>) -> Result<ListPage<K>, Error> {
    let mut items = Vec::new();
    while let Some(item) = stream.next().await {
        match item? {
            ListItem::Object(obj) => items.push(obj),
            ListItem::End {
                resource_version,
                continue_token,
            } => {
                return Ok(ListPage {
                    items,
                    resource_version,
                    continue_token,
                });
            }
        }
    }
    Ok(ListPage {
        items,
        resource_version: String::new(),
        continue_token: None,
    })
}

/// The built-in resource `api` lists, when `wire` asks for protobuf and the table has it.
fn protobuf_resource<K: Resource>(
    api: &Api<K>,
    wire: WireFormat,
) -> Option<&'static protobuf::Resource> {
    if wire != WireFormat::Protobuf || K::metadata_api() {
        return None;
    }
    protobuf::Resource::for_url(api.resource_url())
}

/// Sends `req`, asking for protobuf when `protobuf` is set; an error status becomes an
/// [`Error`]. Returns the response and whether its body is protobuf.
async fn send<K: Resource + Clone>(
    api: &Api<K>,
    mut req: http::Request<Vec<u8>>,
    protobuf: bool,
    verb: Verb,
) -> Result<(kube_client::client::Body, bool), Error> {
    let resource = describe_url(api.resource_url());
    let fail = |e: kube_client::Error| Error::from_kube(e, verb, &resource, api.namespace());
    if protobuf {
        req.headers_mut().insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static(protobuf::ACCEPT),
        );
    }
    let client: kube_client::Client = api.clone().into();
    let response = client
        .send(req.map(kube_client::client::Body::from))
        .await
        .map_err(fail)?;
    let status = response.status();
    let is_protobuf = protobuf::is_protobuf(response.headers().get(http::header::CONTENT_TYPE));
    let body = response.into_body();
    if !status.is_success() {
        let bytes = body.collect_bytes().await.map_err(fail)?;
        let decoded = if is_protobuf {
            protobuf::Envelope::open(&bytes)
                .and_then(|e| protobuf::from_message::<Status>(e.raw, protobuf::STATUS, None))
                .ok()
        } else {
            serde_json::from_slice::<Status>(&bytes).ok()
        };
        let status = decoded
            .filter(|s| s.code != 0 || !s.reason.is_empty())
            .unwrap_or_else(|| {
                Status::failure(String::from_utf8_lossy(&bytes).trim(), "")
                    .with_code(status.as_u16())
            });
        return Err(Error::from_status(
            Box::new(status),
            verb,
            &resource,
            api.namespace(),
        ));
    }
    Ok((body, is_protobuf))
}

/// Lists one page, decoding its objects as the body arrives ([`ListDecoder`], or
/// [`ProtobufListDecoder`] when the server answered in protobuf), in parallel batches
/// ([`decode_list_body`]).
async fn api_list_stream<K>(
    api: &Api<K>,
    labels: Option<&str>,
    fields: Option<&str>,
    wire: WireFormat,
    options: &ListOptions,
) -> Result<ListStream<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Send + 'static,
{
    let resource = describe_url(api.resource_url());
    let table = protobuf_resource(api, wire);
    let req = list_request(api, labels, fields, options)?;
    let (body, is_protobuf) = send(api, req, table.is_some(), Verb::List).await?;
    let splitter = match table.filter(|_| is_protobuf) {
        Some(table) => BodySplitter::Protobuf(ProtobufListDecoder::new(table)),
        None if is_protobuf => {
            return Err(Error::Decode {
                resource,
                verb: Verb::List,
                source: "the server answered in protobuf, which was not asked for".into(),
            });
        }
        None => BodySplitter::Json(ListDecoder::default()),
    };
    Ok(decode_list_body(
        body.into_data_stream(),
        splitter,
        resource,
    ))
}

/// The request for one list page.
fn list_request<K>(
    api: &Api<K>,
    labels: Option<&str>,
    fields: Option<&str>,
    options: &ListOptions,
) -> Result<http::Request<Vec<u8>>, Error>
where
    K: Resource,
{
    let mut lp = ListParams {
        label_selector: labels.map(str::to_owned),
        field_selector: fields.map(str::to_owned),
        limit: options.limit,
        continue_token: options.continue_token.clone(),
        ..ListParams::default()
    };
    let rv = options
        .resource_version
        .as_deref()
        .filter(|rv| !rv.is_empty());
    if let Some(rv) = rv {
        lp.resource_version = Some(rv.to_owned());
        lp.version_match = options.version_match.clone();
    }
    let resource = describe_url(api.resource_url());
    let fail = |e: kube_client::Error| Error::from_kube(e, Verb::List, &resource, api.namespace());
    let request = kube_core::Request::new(api.resource_url());
    let mut req = if K::metadata_api() {
        request.list_metadata(&lp)
    } else {
        request.list(&lp)
    }
    .map_err(|e| fail(kube_client::Error::BuildRequest(e)))?;
    // kube-core leaves out `resourceVersion=0` when a limit is set (it prefers a paged
    // consistent read); the reflector wants client-go's first list, `resourceVersion=0` with
    // `limit`, which the server may serve whole from its cache.
    if rv == Some("0") && options.limit.is_some() && options.continue_token.is_none() {
        let mut uri = format!("{}&resourceVersion=0", req.uri());
        if options.version_match == Some(VersionMatch::NotOlderThan) {
            uri.push_str("&resourceVersionMatch=NotOlderThan");
        }
        *req.uri_mut() = uri.parse().map_err(|e| Error::Transport {
            resource: resource.clone(),
            verb: Verb::List,
            source: Box::new(e),
        })?;
    }
    req.extensions_mut().insert("list");
    Ok(req)
}

async fn api_watch<K>(
    api: &Api<K>,
    labels: Option<&str>,
    fields: Option<&str>,
    wire: WireFormat,
    options: &WatchOptions,
) -> Result<WatchStream<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let wp = WatchParams {
        label_selector: labels.map(str::to_owned),
        field_selector: fields.map(str::to_owned),
        timeout: options
            .timeout
            .map(|t| u32::try_from(t.as_secs()).unwrap_or(u32::MAX)),
        bookmarks: options.allow_bookmarks,
        send_initial_events: options.send_initial_events,
    };
    let resource = describe_url(api.resource_url());
    let namespace = api.namespace().map(str::to_owned);
    if let Some(table) = protobuf_resource(api, wire) {
        return protobuf_watch(api, table, &wp, &options.resource_version).await;
    }
    let stream = api
        .watch(&wp, &options.resource_version)
        .await
        .map_err(|e| Error::from_kube(e, Verb::Watch, &resource, namespace.as_deref()))?;
    Ok(stream
        .map(move |item| match item {
            Ok(event) => Ok(from_kube_event(event)),
            Err(e) => Err(Error::from_kube(
                e,
                Verb::Watch,
                &resource,
                namespace.as_deref(),
            )),
        })
        .boxed())
}

/// kube-core's watch event as ours.
pub(crate) fn from_kube_event<K>(event: kube_core::WatchEvent<K>) -> WatchEvent<K> {
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

/// A watch read in protobuf frames ([`decode_watch_body`]). Should the server answer in
/// JSON after all, its lines are read instead.
async fn protobuf_watch<K>(
    api: &Api<K>,
    table: &'static protobuf::Resource,
    wp: &WatchParams,
    resource_version: &str,
) -> Result<WatchStream<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Send + 'static,
{
    let resource = describe_url(api.resource_url());
    let mut req = kube_core::Request::new(api.resource_url())
        .watch(wp, resource_version)
        .map_err(|e| {
            Error::from_kube(
                kube_client::Error::BuildRequest(e),
                Verb::Watch,
                &resource,
                api.namespace(),
            )
        })?;
    req.extensions_mut().insert("watch");
    let (body, is_protobuf) = send(api, req, true, Verb::Watch).await?;
    Ok(decode_watch_body(
        body.into_data_stream(),
        is_protobuf,
        table,
        resource,
    ))
}

/// The annotation on the bookmark that ends a streaming list's initial events.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// `plural[.group]` from a resource URL such as `/apis/apps/v1/namespaces/x/deployments`.
pub(crate) fn describe_url(url: &str) -> String {
    let segments: Vec<&str> = url.split('/').filter(|s| !s.is_empty()).collect();
    let plural = segments.last().copied().unwrap_or(url);
    match segments.first() {
        Some(&"apis") if segments.len() >= 4 => format!("{plural}.{}", segments[1]),
        _ => plural.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_from_urls() {
        assert_eq!(
            describe_url("/api/v1/namespaces/ns/configmaps"),
            "configmaps"
        );
        assert_eq!(describe_url("/api/v1/nodes"), "nodes");
        assert_eq!(
            describe_url("/apis/apps/v1/deployments"),
            "deployments.apps"
        );
        assert_eq!(
            describe_url("/apis/example.com/v1/namespaces/a/widgets"),
            "widgets.example.com"
        );
    }

    fn assert_list_watch<K, L: ListWatch<K>>() {}

    #[test]
    fn api_kinds_are_list_watch() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube_core::{DynamicObject, PartialObjectMeta};
        assert_list_watch::<ConfigMap, Api<ConfigMap>>();
        assert_list_watch::<DynamicObject, Api<DynamicObject>>();
        assert_list_watch::<PartialObjectMeta<ConfigMap>, Api<PartialObjectMeta<ConfigMap>>>();
        assert_list_watch::<ConfigMap, ApiListWatch<ConfigMap>>();
    }
}
