//! Which encoding lists and watches are read in.

use std::any::TypeId;

use kube_core::{DynamicObject, Resource};

use super::protobuf::envelope::is_protobuf;
use crate::error::quoted_short;

/// The encoding an [`ApiListWatch`](crate::list_watch::ApiListWatch) asks the API server for.
///
/// ```no_run
/// use k8s_openapi::api::core::v1::Pod;
/// use kube_client::{Api, Client};
/// use kube_informer::list_watch::{ApiListWatch, WireFormat};
///
/// # async fn f(client: Client) {
/// // JSON even for a typed built-in kind.
/// let lw = ApiListWatch::new(Api::<Pod>::all(client)).wire_format(WireFormat::Json);
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireFormat {
    /// Protobuf for typed built-in kinds (k8s-openapi types the protobuf table knows, those
    /// of [`KUBERNETES_API_VERSION`](crate::list_watch::KUBERNETES_API_VERSION)), as client-go does, and
    /// JSON for everything else: custom resources, metadata-only lists, and
    /// `DynamicObject`s, which keep every field the server sends, including fields newer
    /// than the table that protobuf would drop. The API server encodes protobuf much
    /// faster than JSON, and encoding is most of the time a large initial list takes.
    #[default]
    Auto,
    /// Protobuf wherever the table knows the kind, `DynamicObject`s of built-in kinds too
    /// (fields newer than the table are dropped).
    Protobuf,
    /// JSON always.
    Json,
}

impl WireFormat {
    /// Whether to ask for protobuf for objects of type `K`, when the table has the kind.
    pub(crate) fn wants_protobuf<K: Resource + 'static>(self) -> bool {
        let dynamic = TypeId::of::<K>() == TypeId::of::<DynamicObject>();
        match self {
            _ if K::metadata_api() => false,
            WireFormat::Auto => !dynamic,
            WireFormat::Protobuf => true,
            WireFormat::Json => false,
        }
    }
}

/// The encoding of one request's or response's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// `application/json` (for watches: one event per line).
    Json,
    /// Kubernetes protobuf (for watches: length-prefixed frames).
    Protobuf,
}

impl Encoding {
    /// The encoding a response's `Content-Type` names; anything but protobuf is read as JSON.
    pub(crate) fn of_response(content_type: Option<&http::HeaderValue>) -> Self {
        if is_protobuf(content_type) {
            Encoding::Protobuf
        } else {
            Encoding::Json
        }
    }

    /// The encoding of a successful response's body, or why it is none this crate reads: a
    /// body of another type (a proxy's or a login page's HTML, sent with 200), or a
    /// compressed one, which no request asks for (a client that decompresses takes the
    /// `Content-Encoding` away). Said before a byte of the body is read, so the error
    /// names what was sent rather than where a decoder choked on it.
    pub(crate) fn of_body(headers: &http::HeaderMap) -> Result<Self, String> {
        if let Some(coding) = headers.get(http::header::CONTENT_ENCODING) {
            let coding = String::from_utf8_lossy(coding.as_bytes());
            if !coding.trim().eq_ignore_ascii_case("identity") {
                return Err(format!(
                    "the body is compressed (Content-Encoding {}), which was not asked for",
                    quoted_short(&coding)
                ));
            }
        }
        let content_type = headers.get(http::header::CONTENT_TYPE);
        if is_protobuf(content_type) {
            return Ok(Encoding::Protobuf);
        }
        let Some(content_type) = content_type else {
            return Ok(Encoding::Json);
        };
        let text = String::from_utf8_lossy(content_type.as_bytes());
        let essence = text.split(';').next().unwrap_or_default().trim();
        let essence = essence.to_ascii_lowercase();
        if essence == "application/json" || essence.ends_with("+json") {
            Ok(Encoding::Json)
        } else {
            Err(format!(
                "the body is {} (Content-Type), neither JSON nor protobuf",
                quoted_short(&text)
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use kube_core::PartialObjectMeta;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| {
                (
                    http::HeaderName::from_static(name),
                    http::HeaderValue::from_static(value),
                )
            })
            .collect()
    }

    #[test]
    fn a_body_is_read_only_as_json_or_protobuf_and_never_compressed() {
        for (pairs, expected) in [
            (&[][..], Encoding::Json),
            (&[("content-type", "application/json")], Encoding::Json),
            (
                &[("content-type", "application/json;stream=watch")],
                Encoding::Json,
            ),
            (
                &[("content-type", "Application/JSON; charset=utf-8")],
                Encoding::Json,
            ),
            (
                &[
                    ("content-type", "application/vnd.kubernetes.protobuf"),
                    ("content-encoding", "identity"),
                ],
                Encoding::Protobuf,
            ),
        ] {
            assert_eq!(
                Encoding::of_body(&headers(pairs)),
                Ok(expected),
                "{pairs:?}"
            );
        }
        for (pairs, says) in [
            (
                &[("content-type", "text/html; charset=utf-8")][..],
                "text/html",
            ),
            (
                &[("content-type", "text/plain")],
                "neither JSON nor protobuf",
            ),
            (
                &[
                    ("content-type", "application/json"),
                    ("content-encoding", "gzip"),
                ],
                "Content-Encoding \"gzip\"",
            ),
        ] {
            let error = Encoding::of_body(&headers(pairs)).unwrap_err();
            assert!(error.contains(says), "{pairs:?}: {error}");
        }
    }

    #[test]
    fn dynamic_objects_and_metadata_default_to_json() {
        assert!(WireFormat::Auto.wants_protobuf::<Pod>());
        assert!(!WireFormat::Auto.wants_protobuf::<DynamicObject>());
        assert!(!WireFormat::Auto.wants_protobuf::<PartialObjectMeta<Pod>>());
        assert!(WireFormat::Protobuf.wants_protobuf::<DynamicObject>());
        assert!(!WireFormat::Protobuf.wants_protobuf::<PartialObjectMeta<Pod>>());
        assert!(!WireFormat::Json.wants_protobuf::<Pod>());
    }
}
