//! Kubernetes' protobuf envelope: the magic `k8s\0`, then a `runtime.Unknown` holding the
//! type (`apiVersion`, `kind`) and the encoded object.

use super::{
    deserializer::TypeMeta,
    error::ProtobufError,
    wire::{Raw, Reader, utf8},
};

/// The four bytes every Kubernetes protobuf object starts with.
pub(crate) const MAGIC: &[u8; 4] = b"k8s\0";

/// The media type of Kubernetes protobuf.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// What a client that reads both asks for: protobuf where the server has it (built-in
/// kinds), JSON otherwise (custom resources).
pub(crate) const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

/// Whether a response's `Content-Type` is Kubernetes protobuf (plain or watch-framed).
pub(crate) fn is_protobuf(content_type: Option<&http::HeaderValue>) -> bool {
    content_type
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with(MEDIA_TYPE))
}

/// `runtime.Unknown`'s field numbers.
pub(crate) mod unknown {
    pub(crate) const TYPE_META: u32 = 1;
    pub(crate) const RAW: u32 = 2;
}

/// An opened envelope.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Envelope<'de> {
    pub(crate) type_meta: TypeMeta<'de>,
    /// The object, without envelope.
    pub(crate) raw: &'de [u8],
}

impl<'de> Envelope<'de> {
    /// Opens a whole envelope.
    ///
    /// # Errors
    /// [`ProtobufError::Envelope`] without the magic, or a wire error.
    pub(crate) fn open(bytes: &'de [u8]) -> Result<Self, ProtobufError> {
        let body = bytes.strip_prefix(MAGIC).ok_or(ProtobufError::Envelope)?;
        let mut reader = Reader::new(body);
        let mut type_meta = TypeMeta {
            api_version: "",
            kind: "",
        };
        let mut raw = &[][..];
        while !reader.is_empty() {
            let (number, wire) = reader.tag()?;
            match (number, reader.value(wire)?) {
                (unknown::TYPE_META, Raw::Len(bytes)) => type_meta = parse_type_meta(bytes)?,
                (unknown::RAW, Raw::Len(bytes)) => raw = bytes,
                _ => {}
            }
        }
        Ok(Self { type_meta, raw })
    }
}

/// `runtime.TypeMeta` `{apiVersion = 1, kind = 2}`.
pub(crate) fn parse_type_meta(bytes: &[u8]) -> Result<TypeMeta<'_>, ProtobufError> {
    let mut reader = Reader::new(bytes);
    let mut meta = TypeMeta {
        api_version: "",
        kind: "",
    };
    while !reader.is_empty() {
        let (number, wire) = reader.tag()?;
        let value = reader.value(wire)?;
        let text = |field| match value {
            Raw::Len(b) => utf8(b, field),
            _ => Err(ProtobufError::Malformed("type meta")),
        };
        match number {
            1 => meta.api_version = text("apiVersion")?,
            2 => meta.kind = text("kind")?,
            _ => {}
        }
    }
    Ok(meta)
}
