//! How a compact [`Store`](crate::Store) keeps objects: serialized, decoded on read.
//! The full documentation is on [`Codec`]; an informer takes one through
//! [`InformerBuilder::codec`](crate::informer::InformerBuilder::codec).

use serde::{Serialize, de::DeserializeOwned};

use crate::error::BoxError;

/// Encodes objects for a compact [`Store`](crate::Store) and decodes them back.
///
/// `decode(encode(x))` must equal `x`; a store cannot return an object whose bytes do not
/// decode (it logs an error naming the key instead).
///
/// How a compact [`Store`](crate::Store) keeps objects: serialized, decoded on read.
///
/// For most Kubernetes types the decoded, in-memory form of an object is much larger than
/// its bytes: `k8s-openapi` structs carry every optional field inline, and `managedFields`
/// decode into trees of `BTreeMap`s. A compact store (an informer's default) keeps bytes
/// instead and decodes on every read, trading some microseconds per read for a fraction of
/// the memory (measured in [BENCHMARKS.md](https://github.com/kube-informer/kube-informer/blob/main/BENCHMARKS.md)).
///
/// The default compact store ([`InformerBuilder::compact`]) keeps the bytes the server sent
/// and needs a codec only for objects that came without them; [`JsonCodec`] (compact JSON)
/// is that codec. [`InformerBuilder::codec`] keeps every object in a codec of your own, for
/// another format or to compress.
///
/// [`InformerBuilder::compact`]: crate::informer::InformerBuilder::compact
/// [`InformerBuilder::codec`]: crate::informer::InformerBuilder::codec
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_informer::{codec::{Codec, JsonCodec}, testing::FakeListWatch};
///
/// let cm = FakeListWatch::<ConfigMap>::object(Some("ns"), "a");
/// let bytes = JsonCodec.encode(&cm).unwrap();
/// let back: ConfigMap = JsonCodec.decode(&bytes).unwrap();
/// assert_eq!(back, cm);
/// ```
pub trait Codec<K>: Send + Sync {
    /// The bytes to keep for `obj`.
    ///
    /// # Errors
    ///
    /// When `obj` cannot be encoded; the store then keeps the object itself.
    fn encode(&self, obj: &K) -> Result<Vec<u8>, BoxError>;

    /// The object back from bytes made by [`encode`](Self::encode).
    ///
    /// # Errors
    ///
    /// When the bytes do not decode.
    fn decode(&self, bytes: &[u8]) -> Result<K, BoxError>;
}

/// Compact JSON through `serde_json`: lossless for every Kubernetes object type (they are
/// JSON types), and decoding it is as fast as decoding the API server's responses.
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonCodec;

impl<K: Serialize + DeserializeOwned> Codec<K> for JsonCodec {
    fn encode(&self, obj: &K) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(obj)?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<K, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}
