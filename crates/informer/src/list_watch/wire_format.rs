//! Which encoding lists and watches are read in.

use std::any::TypeId;

use kube_core::{DynamicObject, Resource};

use super::protobuf::envelope::is_protobuf;

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
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use kube_core::PartialObjectMeta;

    use super::*;

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
