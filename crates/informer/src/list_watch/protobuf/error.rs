//! What can go wrong reading Kubernetes protobuf.

use std::fmt::Display;

/// Kubernetes protobuf that cannot be read into the requested type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtobufError {
    /// The bytes end inside a value.
    #[error("truncated protobuf")]
    Truncated,
    /// A wire type protobuf does not define (3 and 4 are the retired groups).
    #[error("unsupported protobuf wire type {0}")]
    WireType(u8),
    /// The bytes are not protobuf as Kubernetes writes it.
    #[error("malformed protobuf: {0}")]
    Malformed(&'static str),
    /// A field holds a different wire type than its schema says.
    #[error("field `{field}` of {message}: expected {expected} on the wire")]
    Mismatch {
        /// The protobuf message.
        message: &'static str,
        /// The field's JSON name.
        field: &'static str,
        /// What the schema expects.
        expected: &'static str,
    },
    /// A string field is not UTF-8.
    #[error("field `{field}` is not UTF-8")]
    Utf8 {
        /// The field's JSON name.
        field: &'static str,
    },
    /// The response is not wrapped in Kubernetes' protobuf envelope (`k8s\0`).
    #[error("no Kubernetes protobuf envelope")]
    Envelope,
    /// The envelope holds another kind than the one requested.
    #[error("expected {expected_version} {expected}, the server sent {api_version} {kind}")]
    UnexpectedKind {
        /// The kind asked for.
        expected: &'static str,
        /// Its `apiVersion`.
        expected_version: std::borrow::Cow<'static, str>,
        /// The envelope's `apiVersion`.
        api_version: String,
        /// The envelope's `kind`.
        kind: String,
    },
    /// A repeated field is split into several runs, which the API server never writes and
    /// which would otherwise lose all but the last run.
    #[error("field `{field}` of {message} is split into several runs")]
    SplitRun {
        /// The protobuf message.
        message: &'static str,
        /// The field's JSON name.
        field: &'static str,
    },
    /// A length-delimited watch frame claims more than the frame limit.
    #[error("watch frame of {0} bytes is larger than the limit")]
    FrameTooLarge(usize),
    /// The target type rejected the value, or embedded JSON did not parse.
    #[error("{0}")]
    Custom(String),
}

impl serde::de::Error for ProtobufError {
    fn custom<T: Display>(msg: T) -> Self {
        ProtobufError::Custom(msg.to_string())
    }
}
