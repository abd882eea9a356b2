//! Which encoding lists and watches are read in.

use super::protobuf::envelope::is_protobuf;

/// The encoding an [`ApiListWatch`](crate::ApiListWatch) asks the API server for.
///
/// ```no_run
/// use k8s_openapi::api::core::v1::Pod;
/// use kube_client::{Api, Client};
/// use kube_informer::{ApiListWatch, WireFormat};
///
/// # async fn f(client: Client) {
/// // JSON even for a built-in kind, e.g. to keep fields newer than the protobuf table
/// // in an `Api<DynamicObject>`.
/// let lw = ApiListWatch::new(Api::<Pod>::all(client)).wire_format(WireFormat::Json);
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireFormat {
    /// Protobuf for the built-in kinds the protobuf table knows (those of
    /// [`KUBERNETES_API_VERSION`](crate::KUBERNETES_API_VERSION)), as client-go does, and
    /// JSON for everything else (custom resources, metadata-only lists). The API server
    /// encodes protobuf much faster than JSON, and encoding is most of the time a large
    /// initial list takes.
    #[default]
    Protobuf,
    /// JSON always.
    Json,
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
