//! Entry points to the code that reads bytes from outside the process (the API server's
//! responses, a warm restart's snapshot on disk), for the fuzz targets in the repository's
//! `fuzz/` directory.
//!
//! Built only with the feature `fuzzing`, hidden from the documentation, and no part of the
//! crate's API: it may change with any release. Each function hands its arguments to the
//! crate-private code it names and nothing more, so that what is fuzzed is what runs.

use std::{
    fmt,
    path::Path,
    task::{Context, Poll, Waker},
};

use futures::{Stream, StreamExt};
use kube_core::{Resource, Status};
use serde::de::DeserializeOwned;

use crate::{
    Error,
    error::BoxError,
    list_watch::{
        self, BodySplitter, Encoding, Envelope, FieldSetMemo, ListDecoder, ListItem, ListOptions,
        ProtobufError, ProtobufListDecoder, ProtobufResource, RawFormat, RawObject, WatchEvent,
        WatchFraming, WatchOptions,
    },
    reflector::{RestoredObject, read_snapshot},
};

/// A built-in resource of the protobuf table.
#[derive(Clone, Copy)]
pub struct ProtobufKind(&'static ProtobufResource);

impl ProtobufKind {
    /// The resource `group`, `version` and `plural` name (`""` for the core group), if the
    /// table has it.
    pub fn find(group: &str, version: &str, plural: &str) -> Option<Self> {
        ProtobufResource::find(group, version, plural).map(Self)
    }

    /// The kind of its objects (`Pod`).
    pub fn kind(self) -> &'static str {
        self.0.kind
    }

    /// The objects' `apiVersion` (`v1`, `apps/v1`).
    pub fn api_version(self) -> String {
        self.0.api_version().into_owned()
    }

    /// `group/version/plural`, as a snapshot names the resource of its protobuf records.
    pub fn name(self) -> String {
        format!("{}/{}/{}", self.0.group, self.0.version, self.0.plural)
    }
}

impl PartialEq for ProtobufKind {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl Eq for ProtobufKind {}

impl fmt::Debug for ProtobufKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The parsed field sets a compact store's readers share (see
/// [`decode_protobuf_sharing`]).
#[derive(Default)]
pub struct FieldSetCache(FieldSetMemo);

/// One object's protobuf message (no envelope) decoded as `K`, as a list item is
/// (`typed` false) or a watch event's object (`typed` true, with the kind's `apiVersion`
/// and `kind`).
///
/// # Errors
///
/// The decoder's.
pub fn decode_protobuf<K: DeserializeOwned>(
    kind: ProtobufKind,
    typed: bool,
    bytes: &[u8],
) -> Result<K, BoxError> {
    RawFormat::Protobuf {
        resource: kind.0,
        typed,
    }
    .decode(bytes)
}

/// [`decode_protobuf`], the field sets of `managedFields` parsed through `cache`, as a
/// compact store decodes the bytes it keeps.
///
/// # Errors
///
/// The decoder's.
pub fn decode_protobuf_sharing<K: Resource + DeserializeOwned>(
    kind: ProtobufKind,
    typed: bool,
    bytes: &[u8],
    cache: &FieldSetCache,
) -> Result<K, BoxError> {
    RawFormat::Protobuf {
        resource: kind.0,
        typed,
    }
    .decode_sharing(bytes, &cache.0)
}

/// The format of a [`RawObject`]'s bytes: `None` for JSON, else the protobuf resource and
/// whether it decodes with its type.
pub fn raw_format(raw: &RawObject) -> Option<(ProtobufKind, bool)> {
    match raw.format() {
        RawFormat::Json => None,
        RawFormat::Protobuf { resource, typed } => Some((ProtobufKind(resource), typed)),
    }
}

/// A [`RawObject`]'s bytes decoded again, as a compact store decodes them.
///
/// # Errors
///
/// The decoder's.
pub fn decode_raw<K: DeserializeOwned>(raw: &RawObject) -> Result<K, BoxError> {
    raw.format().decode(raw.as_bytes())
}

/// A protobuf envelope (`k8s\0`, then `runtime.Unknown`) opened: its `apiVersion`, its
/// `kind` and the message inside.
///
/// # Errors
///
/// [`ProtobufError`] without the magic, or when the envelope is not protobuf.
pub fn open_envelope(bytes: &[u8]) -> Result<(&str, &str, &[u8]), ProtobufError> {
    let envelope = Envelope::open(bytes)?;
    Ok((
        envelope.type_meta.api_version,
        envelope.type_meta.kind,
        envelope.raw,
    ))
}

/// The largest protobuf watch frame a watch reads.
pub const MAX_WATCH_FRAME: usize = list_watch::MAX_FRAME;

/// The items of a watch body arriving as `chunks`: length-prefixed protobuf frames of
/// `protobuf`'s events, or JSON lines when it is `None`.
pub fn watch_body<K: DeserializeOwned + Send + 'static>(
    chunks: Vec<Vec<u8>>,
    protobuf: Option<ProtobufKind>,
) -> Vec<Result<WatchEvent<K>, Error>> {
    let framing = match protobuf {
        Some(kind) => WatchFraming::Protobuf(kind.0),
        None => WatchFraming::JsonLines,
    };
    drain(list_watch::decode_watch_body(
        body(chunks),
        framing,
        "fuzzed".to_owned(),
    ))
}

/// The items of a list body arriving as `chunks`: a protobuf list of `protobuf`, or JSON
/// when it is `None`.
pub fn list_body<K: DeserializeOwned + Send + 'static>(
    chunks: Vec<Vec<u8>>,
    protobuf: Option<ProtobufKind>,
) -> Vec<Result<ListItem<K>, Error>> {
    let splitter = match protobuf {
        Some(kind) => BodySplitter::Protobuf(ProtobufListDecoder::new(kind.0)),
        None => BodySplitter::Json(ListDecoder::default()),
    };
    drain(list_watch::decode_list_body(
        body(chunks),
        splitter,
        "fuzzed".to_owned(),
    ))
}

fn body(chunks: Vec<Vec<u8>>) -> impl Stream<Item = Result<Vec<u8>, std::io::Error>> {
    futures::stream::iter(chunks.into_iter().map(Ok))
}

/// Every item of `stream`, polled on this thread. Outside a tokio runtime the bodies
/// decode inline, and a body of chunks already there never waits: a stream that does is
/// a bug, reported by a panic the fuzzer catches.
fn drain<T>(mut stream: futures::stream::BoxStream<'static, T>) -> Vec<T> {
    let mut context = Context::from_waker(Waker::noop());
    let mut items = Vec::new();
    loop {
        match stream.poll_next_unpin(&mut context) {
            Poll::Ready(Some(item)) => items.push(item),
            Poll::Ready(None) => return items,
            Poll::Pending => panic!("a body that is all there left its stream waiting"),
        }
    }
}

/// The `Status` an error response's body holds (see `api::error_status`), read as
/// protobuf or JSON, with the response's HTTP `code`.
pub fn error_status(bytes: &[u8], protobuf: bool, code: u16) -> Status {
    let encoding = match protobuf {
        true => Encoding::Protobuf,
        false => Encoding::Json,
    };
    list_watch::error_status(bytes, encoding, code)
}

/// The URI of the list request for the collection at `url` (`metadata`: metadata only).
///
/// # Errors
///
/// When the request cannot be built.
pub fn list_request_uri(
    url: &str,
    metadata: bool,
    labels: Option<&str>,
    fields: Option<&str>,
    options: &ListOptions,
) -> Result<String, Error> {
    list_watch::list_request_at(url, None, metadata, labels, fields, options)
        .map(|request| request.uri().to_string())
}

/// The URI of the watch request for the collection at `url` (`metadata`: metadata only).
///
/// # Errors
///
/// When the request cannot be built.
pub fn watch_request_uri(
    url: &str,
    metadata: bool,
    labels: Option<&str>,
    fields: Option<&str>,
    options: &WatchOptions,
) -> Result<String, Error> {
    list_watch::watch_request_at(url, None, metadata, labels, fields, options)
        .map(|request| request.uri().to_string())
}

/// Why a snapshot was refused, one case per reason a reader tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotRefusal {
    /// There is no file.
    Missing,
    /// The file could not be read.
    Io,
    /// It is not a snapshot.
    Foreign,
    /// It is of another format version.
    FormatVersion,
    /// It is of another selection.
    OtherSelection,
    /// Its checksum does not match.
    Checksum,
    /// It ends early.
    Truncated,
    /// The record at this index (or a text field, at 0) does not decode.
    Undecodable(usize),
}

/// What a snapshot read delivered, and how it ended.
pub struct SnapshotRead<K> {
    /// The objects handed on, in order.
    pub objects: Vec<RestoredObject<K>>,
    /// The resourceVersion read, or why the snapshot was refused and what was said.
    pub result: Result<String, (SnapshotRefusal, String)>,
}

/// Reads the snapshot at `path` as an informer of `selection` does, every object taken
/// (decoded as it is read when `decode`).
pub fn read_snapshot_at<K: Resource + DeserializeOwned + Send + Sync>(
    path: &Path,
    selection: &str,
    decode: bool,
) -> SnapshotRead<K> {
    let mut objects = Vec::new();
    let result = read_snapshot::<K>(path, selection, decode, &mut |part| {
        objects.extend(part);
        true
    })
    .map_err(|error| (SnapshotRefusal::from(&error), error.to_string()));
    SnapshotRead { objects, result }
}

/// One object of a snapshot, as it was read.
#[derive(Debug)]
pub struct RestoredRecord<'a, K> {
    /// Its key.
    pub key: &'a str,
    /// Its resourceVersion, if the record has one.
    pub version: Option<&'a str>,
    /// Its labels, in the record's order.
    pub labels: Vec<(&'a str, &'a str)>,
    /// Its bytes' format: `None` for JSON, else the protobuf resource and whether it
    /// decodes with its type.
    pub format: Option<(ProtobufKind, bool)>,
    /// Its bytes.
    pub bytes: &'a [u8],
    /// The object, when it was decoded as it was read.
    pub object: Option<&'a K>,
}

/// What `restored` holds.
pub fn restored_record<K>(restored: &RestoredObject<K>) -> RestoredRecord<'_, K> {
    let encoded = &restored.encoded;
    RestoredRecord {
        key: encoded.key.as_str(),
        version: encoded.version.as_deref(),
        labels: encoded.labels.pairs().collect(),
        format: match encoded.format {
            RawFormat::Json => None,
            RawFormat::Protobuf { resource, typed } => Some((ProtobufKind(resource), typed)),
        },
        bytes: &encoded.bytes,
        object: restored.object.as_deref(),
    }
}

/// The object `restored` holds, decoded now as [`RestoredObject::into_decoded`] decodes
/// one read without decoding, leaving `restored` as it is.
///
/// # Errors
///
/// The decoder's, when the bytes do not decode as `K`.
pub fn decode_restored<K>(restored: &RestoredObject<K>) -> Result<K, BoxError> {
    let encoded = &restored.encoded;
    (restored.decode)(encoded.format, &encoded.bytes, &FieldSetMemo::default())
}
