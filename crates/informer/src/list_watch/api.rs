//! [`ListWatch`] over the API server: [`ApiListWatch`] and the impl for [`Api`], the requests
//! they send and the encoding they ask for.

use std::fmt::Debug;

use bytes::Buf;
use futures::StreamExt;
use http_body_util::BodyExt;
use kube_client::{
    Api,
    api::{ListParams, VersionMatch, WatchParams},
};
use kube_core::{PartialObjectMeta, Resource, Status};
use serde::de::DeserializeOwned;

use super::{
    ListItem, ListOptions, ListPage, ListStream, ListWatch, ObjectVersion, Shard, VersionPage,
    WatchOptions, WatchStream,
    json_list::ListDecoder,
    list_body::{BodySplitter, decode_list_body},
    protobuf::{
        deserializer::from_message,
        envelope::{ACCEPT, Envelope},
        list_decoder::ProtobufListDecoder,
        schema::Resource as ProtobufResource,
        schema_table::STATUS,
    },
    watch_body::{WatchFraming, decode_watch_body},
    wire_format::{Encoding, WireFormat},
};
use crate::error::{Error, Verb};

/// An [`Api`] plus label and field selectors (client-go's `NewFilteredListWatchFromClient`).
///
/// ```no_run
/// use k8s_openapi::api::core::v1::Pod;
/// use kube_client::{Api, Client};
/// use kube_informer::{SharedInformer, list_watch::ApiListWatch};
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

    /// The encoding to ask for: [`WireFormat::Auto`] (the default) reads typed built-in
    /// kinds in protobuf, as client-go does.
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

    fn selectors(&self) -> String {
        format!(
            "labels={} fields={}",
            self.label_selector.as_deref().unwrap_or(""),
            self.field_selector.as_deref().unwrap_or("")
        )
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

    async fn list_versions(&self, options: &ListOptions) -> Result<VersionPage, Error> {
        api_list_versions(
            &self.api,
            self.label_selector.as_deref(),
            self.field_selector.as_deref(),
            options,
        )
        .await
    }

    async fn cached_version(&self) -> Result<String, Error> {
        api_cached_version(&self.api).await
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
/// Typed built-in kinds are read in protobuf, everything else in JSON ([`WireFormat::Auto`]);
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

    async fn list_versions(&self, options: &ListOptions) -> Result<VersionPage, Error> {
        api_list_versions(self, None, None, options).await
    }

    async fn cached_version(&self) -> Result<String, Error> {
        api_cached_version(self).await
    }

    async fn watch(&self, options: &WatchOptions) -> Result<WatchStream<K>, Error> {
        api_watch(self, None, None, WireFormat::default(), options).await
    }
}

/// A name no object is given: the API server checks names against RFC 1123, which has no
/// underscore.
const NO_SUCH_NAME: &str = "kube_informer_version_probe";

/// The version of `api`'s resource in the API server's cache: a list at resourceVersion
/// `"0"` (served from the cache, as it stands) that selects no object, so it costs the wire
/// a few hundred bytes however many objects there are.
async fn api_cached_version<K>(api: &Api<K>) -> Result<String, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let options = ListOptions {
        resource_version: Some("0".to_owned()),
        ..ListOptions::default()
    };
    let selector = format!("metadata.name={NO_SUCH_NAME}");
    let page = api_list_versions(api, None, Some(&selector), &options).await?;
    Ok(page.resource_version)
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
    // Read as a stream in either encoding, so no object larger than the stream's bound is
    // held, however long the body the server sends.
    let resource = describe_url(api.resource_url());
    let stream = api_list_stream(api, labels, fields, wire, options).await?;
    collect_page(stream, resource).await
}

/// One page of keys and versions, read as metadata only (`PartialObjectMetadataList`).
async fn api_list_versions<K>(
    api: &Api<K>,
    labels: Option<&str>,
    fields: Option<&str>,
    options: &ListOptions,
) -> Result<VersionPage, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let resource = describe_url(api.resource_url());
    let req = list_request_at(
        api.resource_url(),
        api.namespace(),
        true,
        labels,
        fields,
        options,
    )?;
    // Streamed, as a list of objects is: a body that never ends its metadata is refused
    // at the stream's bound instead of held whole.
    let (body, encoding) = send(api, req, Encoding::Json, Verb::List).await?;
    if encoding != Encoding::Json {
        return Err(Error::Decode {
            resource,
            verb: Verb::List,
            source: "the server answered a metadata list in protobuf, which was not asked for"
                .into(),
        });
    }
    let stream = decode_list_body::<PartialObjectMeta<K>, _, _, _>(
        body.into_data_stream(),
        BodySplitter::Json(ListDecoder::default()),
        resource.clone(),
    );
    let list = collect_page(stream, resource).await?;
    // Where the server did not apply the shard, keep what it would have selected.
    let server_applied = list.shard_selector.is_some();
    let in_shard = |meta: &&PartialObjectMeta<K>| match &options.shard {
        Some(shard) if !server_applied => shard.contains(*meta),
        _ => true,
    };
    Ok(VersionPage {
        items: list
            .items
            .iter()
            .filter(in_shard)
            .filter_map(ObjectVersion::of)
            .collect(),
        resource_version: list.resource_version,
        continue_token: list.continue_token,
    })
}

/// One page from its stream; a page holds only objects, so an undecodable one fails it.
async fn collect_page<K>(
    mut stream: ListStream<K>,
    resource: String,
) -> Result<ListPage<K>, Error> {
    let mut items = Vec::new();
    while let Some(item) = stream.next().await {
        match item? {
            ListItem::Object(obj) | ListItem::Decoded { object: obj, .. } => items.push(obj),
            ListItem::Undecodable(undecodable) => {
                return Err(Error::UndecodableObject {
                    resource,
                    verb: Verb::List,
                    key: undecodable.key.to_string(),
                    reason: undecodable.reason,
                });
            }
            ListItem::End {
                resource_version,
                continue_token,
                shard_selector,
            } => {
                return Ok(ListPage {
                    items,
                    resource_version,
                    continue_token,
                    shard_selector,
                });
            }
        }
    }
    Ok(ListPage {
        items,
        resource_version: String::new(),
        continue_token: None,
        shard_selector: None,
    })
}

/// The built-in resource `api` lists, when `wire` asks for protobuf and the table has it.
fn protobuf_resource<K: Resource + 'static>(
    api: &Api<K>,
    wire: WireFormat,
) -> Option<&'static ProtobufResource> {
    if !wire.wants_protobuf::<K>() {
        return None;
    }
    ProtobufResource::for_url(api.resource_url())
}

/// Sends `req`, asking for `accept`; an error status becomes an [`Error`]. Returns the
/// response body and the encoding the server chose for it.
async fn send<K: Resource + Clone>(
    api: &Api<K>,
    mut req: http::Request<Vec<u8>>,
    accept: Encoding,
    verb: Verb,
) -> Result<(kube_client::client::Body, Encoding), Error> {
    let resource = describe_url(api.resource_url());
    let fail = |e: kube_client::Error| Error::from_kube(e, verb, &resource, api.namespace());
    if accept == Encoding::Protobuf {
        req.headers_mut()
            .insert(http::header::ACCEPT, http::HeaderValue::from_static(ACCEPT));
    }
    let client: kube_client::Client = api.clone().into();
    let response = client
        .send(req.map(kube_client::client::Body::from))
        .await
        .map_err(fail)?;
    let status = response.status();
    let encoding = Encoding::of_response(response.headers().get(http::header::CONTENT_TYPE));
    let read_as = Encoding::of_body(response.headers());
    let body = response.into_body();
    if !status.is_success() {
        let bytes = error_body(body).await.map_err(fail)?;
        let status = error_status(&bytes, encoding, status.as_u16());
        return Err(Error::from_status(
            Box::new(status),
            verb,
            &resource,
            api.namespace(),
        ));
    }
    let encoding = read_as.map_err(|reason| Error::Decode {
        resource: resource.clone(),
        verb,
        source: format!("answered {status}, but {reason}").into(),
    })?;
    Ok((body, encoding))
}

/// The most of an error response's body that is read: a status is a few hundred bytes and
/// a proxy's error page a few kilobytes, so a body that goes on is cut, not held whole.
const MAX_ERROR_BODY: usize = 64 << 10;

/// An error response's body, its first [`MAX_ERROR_BODY`] bytes at most.
async fn error_body<B>(mut body: B) -> Result<Vec<u8>, B::Error>
where
    B: BodyExt + Unpin,
{
    let mut bytes = Vec::new();
    while bytes.len() < MAX_ERROR_BODY {
        let Some(frame) = body.frame().await else {
            break;
        };
        if let Ok(mut data) = frame?.into_data() {
            while data.has_remaining() && bytes.len() < MAX_ERROR_BODY {
                let chunk = data.chunk();
                let take = chunk.len().min(MAX_ERROR_BODY - bytes.len());
                bytes.extend_from_slice(&chunk[..take]);
                data.advance(take);
            }
        }
    }
    Ok(bytes)
}

/// The `Status` an error response's body holds, in `encoding`; a body that is none (a
/// proxy's page, an empty body) becomes a failure with its text and the HTTP `code`.
pub(crate) fn error_status(bytes: &[u8], encoding: Encoding, code: u16) -> Status {
    let decoded = if encoding == Encoding::Protobuf {
        Envelope::open(bytes)
            .and_then(|e| from_message::<Status>(e.raw, STATUS, None))
            .ok()
    } else {
        serde_json::from_slice::<Status>(bytes).ok()
    };
    decoded
        .filter(|s| s.code != 0 || !s.reason.is_empty())
        .unwrap_or_else(|| {
            Status::failure(String::from_utf8_lossy(bytes).trim(), "").with_code(code)
        })
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
    let accept = match table {
        Some(_) => Encoding::Protobuf,
        None => Encoding::Json,
    };
    let (body, encoding) = send(api, req, accept, Verb::List).await?;
    let splitter = match (table, encoding) {
        (Some(table), Encoding::Protobuf) => {
            BodySplitter::Protobuf(ProtobufListDecoder::new(table))
        }
        (None, Encoding::Protobuf) => {
            return Err(Error::Decode {
                resource,
                verb: Verb::List,
                source: "the server answered in protobuf, which was not asked for".into(),
            });
        }
        (_, Encoding::Json) => BodySplitter::Json(ListDecoder::default()),
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
    list_request_at(
        api.resource_url(),
        api.namespace(),
        K::metadata_api(),
        labels,
        fields,
        options,
    )
}

/// The request for one list page of the collection at `url` (of `namespace`, for errors);
/// `metadata` asks for metadata only.
pub(crate) fn list_request_at(
    url: &str,
    namespace: Option<&str>,
    metadata: bool,
    labels: Option<&str>,
    fields: Option<&str>,
    options: &ListOptions,
) -> Result<http::Request<Vec<u8>>, Error> {
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
    let resource = describe_url(url);
    let fail = |e: kube_client::Error| Error::from_kube(e, Verb::List, &resource, namespace);
    let request = kube_core::Request::new(url);
    let mut req = if metadata {
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
    with_shard(&mut req, options.shard.as_ref(), &resource, Verb::List)?;
    req.extensions_mut()
        .insert(if metadata { "list_metadata" } else { "list" });
    Ok(req)
}

/// Adds `shardSelector` to `req`'s query.
fn with_shard(
    req: &mut http::Request<Vec<u8>>,
    shard: Option<&Shard>,
    resource: &str,
    verb: Verb,
) -> Result<(), Error> {
    let Some(shard) = shard.filter(|s| s.field().server_side()) else {
        return Ok(());
    };
    let uri = req.uri().to_string();
    let separator = if uri.contains('?') { '&' } else { '?' };
    let uri = format!(
        "{uri}{separator}shardSelector={}",
        percent_encode(&shard.selector())
    );
    *req.uri_mut() = uri.parse().map_err(|e| Error::Transport {
        resource: resource.to_owned(),
        verb,
        source: Box::new(e),
    })?;
    Ok(())
}

/// A query value: every byte but RFC 3986's unreserved ones percent-encoded.
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 2);
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
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
    let resource = describe_url(api.resource_url());
    let table = protobuf_resource(api, wire);
    let req = watch_request_at(
        api.resource_url(),
        api.namespace(),
        K::metadata_api(),
        labels,
        fields,
        options,
    )?;
    let accept = match table {
        Some(_) => Encoding::Protobuf,
        None => Encoding::Json,
    };
    // Read here rather than through kube-client's watch, which parses any JSON line as a
    // `Status` and cannot tell which object failed to decode.
    let (body, encoding) = send(api, req, accept, Verb::Watch).await?;
    let framing = match (encoding, table) {
        (Encoding::Protobuf, Some(table)) => WatchFraming::Protobuf(table),
        (Encoding::Protobuf, None) => {
            return Err(Error::Decode {
                resource,
                verb: Verb::Watch,
                source: "the server answered in protobuf, which was not asked for".into(),
            });
        }
        (Encoding::Json, _) => WatchFraming::JsonLines,
    };
    Ok(decode_watch_body(
        body.into_data_stream(),
        framing,
        resource,
    ))
}

/// The request for a watch of the collection at `url` (of `namespace`, for errors);
/// `metadata` asks for metadata only.
pub(crate) fn watch_request_at(
    url: &str,
    namespace: Option<&str>,
    metadata: bool,
    labels: Option<&str>,
    fields: Option<&str>,
    options: &WatchOptions,
) -> Result<http::Request<Vec<u8>>, Error> {
    let wp = WatchParams {
        label_selector: labels.map(str::to_owned),
        field_selector: fields.map(str::to_owned),
        timeout: options
            .timeout
            .map(|t| u32::try_from(t.as_secs()).unwrap_or(u32::MAX)),
        bookmarks: options.allow_bookmarks,
        send_initial_events: options.send_initial_events,
    };
    let resource = describe_url(url);
    let request = kube_core::Request::new(url);
    let rv = &options.resource_version;
    let mut req = if metadata {
        request.watch_metadata(&wp, rv)
    } else {
        request.watch(&wp, rv)
    }
    .map_err(|e| {
        Error::from_kube(
            kube_client::Error::BuildRequest(e),
            Verb::Watch,
            &resource,
            namespace,
        )
    })?;
    with_shard(&mut req, options.shard.as_ref(), &resource, Verb::Watch)?;
    req.extensions_mut().insert("watch");
    Ok(req)
}

/// `plural[.group]` from a resource URL such as `/apis/apps/v1/namespaces/x/deployments`.
fn describe_url(url: &str) -> String {
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

    #[tokio::test]
    async fn an_error_body_is_read_up_to_its_limit() {
        use http_body_util::{Full, StreamBody};
        let status = br#"{"kind":"Status","code":410,"reason":"Expired"}"#;
        let short = error_body(Full::new(bytes::Bytes::from_static(status)))
            .await
            .unwrap();
        assert_eq!(short, status);
        // A body that never ends (a misbehaving proxy) is cut at the limit.
        let endless = futures::stream::repeat(()).then(|()| async {
            let mut piece = Full::new(bytes::Bytes::from(vec![b'x'; 10_000]));
            piece.frame().await.expect("one frame")
        });
        let cut = error_body(StreamBody::new(Box::pin(endless)))
            .await
            .unwrap();
        assert_eq!(cut.len(), MAX_ERROR_BODY);
    }

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
