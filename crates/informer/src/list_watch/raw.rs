//! The bytes an object arrived in. The full documentation is on [`RawObject`].

use std::fmt;

use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::protobuf::{
    ProtobufError,
    deserializer::{TypeMeta, from_message},
    field_sets::{FieldSetMemo, from_message_sharing_field_sets},
    schema::Resource,
};
use crate::error::BoxError;

/// The bytes one object was decoded from, exactly as the API server sent them.
///
/// [`ApiListWatch`](crate::list_watch::ApiListWatch) hands them over beside each listed or watched
/// object ([`ListItem::Decoded`](crate::list_watch::ListItem::Decoded),
/// [`WatchEvent::Decoded`](crate::list_watch::WatchEvent::Decoded)), so that a compact
/// [`Store`](crate::Store) keeps them as they are: no encoding of its own, and no check
/// that an encoding decodes back, since these bytes just did. Cheap to clone (shared).
#[derive(Clone)]
pub struct RawObject {
    bytes: Bytes,
    format: RawFormat,
}

/// How a [`RawObject`]'s bytes decode.
#[derive(Clone, Copy)]
pub(crate) enum RawFormat {
    /// One object's JSON.
    Json,
    /// One object's protobuf message, without envelope.
    Protobuf {
        resource: &'static Resource,
        /// The object came in an envelope naming its type (a watch event), so it decodes
        /// with `apiVersion` and `kind`, as it did; list items carry no type.
        typed: bool,
    },
}

impl fmt::Debug for RawObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let format = match self.format {
            RawFormat::Json => "json",
            RawFormat::Protobuf { .. } => "protobuf",
        };
        f.debug_struct("RawObject")
            .field("format", &format)
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl RawObject {
    pub(crate) fn new(bytes: Bytes, format: RawFormat) -> Self {
        Self { bytes, format }
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub(crate) fn format(&self) -> RawFormat {
        self.format
    }
}

impl RawFormat {
    /// The object `bytes` (in this format) hold, with the field sets of its
    /// `managedFields` parsed through `memo` (see [`FieldSetMemo`]).
    pub(crate) fn decode_sharing<K: kube_core::Resource + DeserializeOwned>(
        self,
        bytes: &[u8],
        memo: &FieldSetMemo,
    ) -> Result<K, BoxError> {
        self.decode_with(bytes, |resource, meta| {
            from_message_sharing_field_sets(bytes, resource.item, meta, memo)
        })
    }

    /// The object `bytes` (in this format) hold.
    pub(crate) fn decode<K: DeserializeOwned>(self, bytes: &[u8]) -> Result<K, BoxError> {
        self.decode_with(bytes, |resource, meta| {
            from_message(bytes, resource.item, meta)
        })
    }

    /// JSON by serde_json; protobuf by `protobuf`, given the envelope's type when the
    /// object came in one.
    fn decode_with<K: DeserializeOwned>(
        self,
        bytes: &[u8],
        protobuf: impl FnOnce(&'static Resource, Option<TypeMeta<'_>>) -> Result<K, ProtobufError>,
    ) -> Result<K, BoxError> {
        Ok(match self {
            RawFormat::Json => serde_json::from_slice(bytes)?,
            RawFormat::Protobuf {
                resource,
                typed: false,
            } => protobuf(resource, None)?,
            RawFormat::Protobuf {
                resource,
                typed: true,
            } => {
                let api_version = resource.api_version();
                let meta = TypeMeta {
                    api_version: &api_version,
                    kind: resource.kind,
                };
                protobuf(resource, Some(meta))?
            }
        })
    }
}
