//! Reading Kubernetes protobuf into serde types.
//!
//! client-go asks the API server for protobuf for built-in kinds, and the server encodes
//! protobuf much faster than JSON (measured in the repository's `BENCHMARKS.md`), so a
//! client that only reads JSON syncs slower whatever it does on its side. `k8s-openapi`'s types only know JSON; this module reads protobuf
//! *as if it were JSON*: a serde `Deserializer` walks the protobuf bytes, steered by a table
//! generated from the Go types (`tools/protobuf-schema`), and presents each message the way
//! its Go type marshals to JSON. Any `Deserialize` type that reads the server's JSON reads
//! its protobuf, with no generated Rust types.
//!
//! The table covers every built-in kind of the Kubernetes version it was read from
//! ([`KUBERNETES_API_VERSION`]). Fields a newer server
//! adds are skipped, as `k8s-openapi` skips unknown JSON fields.

pub(super) mod deserializer;
pub(super) mod envelope;
pub(super) mod error;
pub(super) mod field_sets;
pub(super) mod list_decoder;
mod lookup;
pub(super) mod schema;
#[rustfmt::skip]
#[allow(clippy::all)]
pub(super) mod schema_table;
#[cfg(test)]
pub(crate) mod test_encoder;
pub(super) mod watch_decoder;
mod well_known;
mod wire;

pub use error::ProtobufError;
pub use schema_table::KUBERNETES_API_VERSION;
