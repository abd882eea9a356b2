//! Reading Kubernetes protobuf into serde types.
//!
//! client-go asks the API server for protobuf for built-in kinds, and the server encodes
//! protobuf several times faster than JSON (a list of 10,000 Pods: about 125 ms against
//! 250 ms on the same server), so a client that only reads JSON syncs slower whatever it
//! does on its side. `k8s-openapi`'s types only know JSON; this module reads protobuf
//! *as if it were JSON*: a serde `Deserializer` walks the protobuf bytes, steered by a table
//! generated from the Go types (`tools/protobuf-schema`), and presents each message the way
//! its Go type marshals to JSON. Any `Deserialize` type that reads the server's JSON reads
//! its protobuf, with no generated Rust types.
//!
//! The table covers every built-in kind of the Kubernetes version it was read from
//! ([`KUBERNETES_API_VERSION`]). Fields a newer server
//! adds are skipped, as `k8s-openapi` skips unknown JSON fields.

mod deserializer;
mod envelope;
mod error;
mod list_decoder;
mod schema;
#[rustfmt::skip]
#[allow(clippy::all)]
mod schema_table;
#[cfg(test)]
pub(crate) mod test_encoder;
mod watch_decoder;
mod well_known;
mod wire;

pub(crate) use deserializer::from_message;
pub(crate) use envelope::{ACCEPT, Envelope, is_protobuf};
pub use error::ProtobufError;
pub(crate) use list_decoder::ProtobufListDecoder;
pub(crate) use schema::{Message, Resource};
pub use schema_table::KUBERNETES_API_VERSION;
pub(crate) use schema_table::STATUS;
pub(crate) use watch_decoder::{WatchFrameDecoder, decode_event};
