//! Which encoding lists and watches are read in.

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
    /// Protobuf for the built-in kinds the [`protobuf`](crate::protobuf) table knows, as
    /// client-go does, and JSON for everything else (custom resources, metadata-only
    /// lists). The API server encodes protobuf about twice as fast as JSON, which is most
    /// of the time a large initial list takes.
    #[default]
    Protobuf,
    /// JSON always.
    Json,
}
