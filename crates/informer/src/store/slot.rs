//! How a store keeps one object: decoded and shared, or encoded together with what decodes
//! it. A slot carries its own decoder, so no store can hold bytes it has no way to read.

use std::{fmt, sync::Arc};

use kube_core::Resource;
use serde::de::DeserializeOwned;
use tracing::{error, warn};

use crate::codec::{Codec, JsonCodec};

use super::{
    labels::{LabelInterner, LabelMatcher, Labels},
    selector::Selector,
    working_set::WorkingSet,
};
use crate::{
    error::BoxError,
    key::ObjectKey,
    list_watch::{FieldSetMemo, RawFormat, RawObject},
};

/// How a store keeps the objects written to it; fixed when the store is built.
pub(super) enum Keeping<K> {
    /// As the shared `Arc<K>` each was decoded into.
    Decoded,
    /// As bytes, decoded on read.
    Compact(Compact<K>),
}

/// The encodings a compact store keeps objects in.
pub(super) struct Compact<K> {
    /// Encodes the objects that came without the bytes the server sent (or all of them,
    /// when `wire` is `None`).
    pub(super) codec: Arc<dyn Codec<K>>,
    /// Decodes the bytes the server sent; with it, objects that came with them
    /// ([`RawObject`]) keep those instead of an encoding.
    pub(super) wire: Option<WireDecoder<K>>,
    pub(super) working_set: WorkingSet,
}

/// Decodes bytes kept as they came from the wire, parsing the field sets of their
/// `managedFields` through the store's memo.
pub(crate) type WireDecoder<K> = fn(RawFormat, &[u8], &FieldSetMemo) -> Result<K, BoxError>;

pub(crate) fn decode_wire<K: Resource + DeserializeOwned>(
    format: RawFormat,
    bytes: &[u8],
    field_sets: &FieldSetMemo,
) -> Result<K, BoxError> {
    format.decode_sharing(bytes, field_sets)
}

impl<K: Resource + serde::Serialize + DeserializeOwned + 'static> Compact<K> {
    /// The default compact store's: the server's bytes where an object came with them,
    /// compact JSON otherwise.
    pub(super) fn wire_or_json(working_set: WorkingSet) -> Self {
        Self {
            codec: Arc::new(JsonCodec),
            wire: Some(decode_wire::<K>),
            working_set,
        }
    }
}

/// One stored object.
pub(super) enum Slot<K> {
    /// Shared as decoded: in a store of decoded objects, or in a compact one for an object
    /// whose encoding did not decode back.
    Decoded(Arc<K>),
    Encoded(Encoded<K>),
}

/// An object kept as bytes, with what reading it without decoding needs.
pub(super) struct Encoded<K> {
    pub(super) body: Body<K>,
    /// Its resourceVersion, so that a relist can tell an unchanged object.
    pub(super) version: Option<Arc<str>>,
    /// Its labels, so that a selector can be matched; interned when the slot is stored,
    /// under the store's write lock (see `State::put`).
    pub(super) labels: Labels,
    /// Which write of its key this slot is (a count kept by the store's writer): an entry
    /// of the working set stands for this slot only if it carries the same number.
    pub(super) generation: u64,
}

/// An object's bytes and their decoder: what a reader takes out of the store's lock.
pub(super) struct Body<K> {
    pub(super) bytes: Arc<[u8]>,
    pub(super) decoder: Decoder<K>,
}

pub(super) enum Decoder<K> {
    /// The bytes the server sent, in `format`.
    Wire(RawFormat, WireDecoder<K>),
    /// An encoding by the store's codec.
    Codec(Arc<dyn Codec<K>>),
}

impl<K> Clone for Body<K> {
    fn clone(&self) -> Self {
        Self {
            bytes: self.bytes.clone(),
            decoder: match &self.decoder {
                Decoder::Wire(format, decode) => Decoder::Wire(*format, *decode),
                Decoder::Codec(codec) => Decoder::Codec(codec.clone()),
            },
        }
    }
}

impl<K> Body<K> {
    pub(super) fn decode(&self, field_sets: &FieldSetMemo) -> Result<K, BoxError> {
        match &self.decoder {
            Decoder::Wire(format, decode) => decode(*format, &self.bytes, field_sets),
            Decoder::Codec(codec) => codec.decode(&self.bytes),
        }
    }

    /// The bytes as the server sent them, if they are.
    pub(super) fn wire(&self) -> Option<(RawFormat, &[u8])> {
        match &self.decoder {
            Decoder::Wire(format, _) => Some((*format, &self.bytes)),
            Decoder::Codec(_) => None,
        }
    }

    /// The estimated memory of the decoded object (see [`WorkingSet::estimated_size`]).
    pub(super) fn decoded_size(&self) -> usize {
        WorkingSet::estimated_size(self.bytes.len(), self.wire().map(|(format, _)| format))
    }

    /// The object, decoded; `None` (with an error log) when its bytes do not decode.
    pub(super) fn unpack(
        &self,
        key: &(impl fmt::Display + ?Sized),
        field_sets: &FieldSetMemo,
    ) -> Option<Arc<K>> {
        match self.decode(field_sets) {
            Ok(obj) => Some(Arc::new(obj)),
            Err(err) => {
                error!(%key, %err, "stored object does not decode; the codec does not round-trip");
                None
            }
        }
    }
}

/// What a reader takes of a slot under the store's read lock, to decode after it.
pub(super) enum Taken<K> {
    Decoded(Arc<K>),
    Encoded { body: Body<K>, generation: u64 },
}

impl<K: Resource> Slot<K> {
    /// The stored object's resourceVersion.
    pub(super) fn version(&self) -> Option<&str> {
        match self {
            Slot::Decoded(o) => o.meta().resource_version.as_deref(),
            Slot::Encoded(e) => e.version.as_deref(),
        }
    }

    /// The value of the stored object's label `key`, read without decoding it.
    pub(super) fn label(&self, key: &str) -> Option<&str> {
        match self {
            Slot::Decoded(o) => o.meta().labels.as_ref()?.get(key).map(String::as_str),
            Slot::Encoded(e) => e.labels.get(key),
        }
    }
}

impl<K: Resource> Slot<K> {
    /// Gives an encoded slot the labels of `obj`, the object it holds.
    pub(super) fn intern_labels(&mut self, labels: &mut LabelInterner, obj: &K) {
        if let Slot::Encoded(e) = self {
            e.labels = labels.intern(obj.meta().labels.as_ref());
        }
    }

    /// Whether the stored object's labels match: an encoded slot's through `matcher`
    /// (the selector resolved against the store's interned labels), a decoded one's by
    /// their values.
    pub(super) fn matches(&self, selector: &Selector, matcher: &LabelMatcher<'_>) -> bool {
        match self {
            Slot::Encoded(e) => matcher.matches(&e.labels),
            Slot::Decoded(_) => selector.matches_by(|key| self.label(key)),
        }
    }
}

impl<K> Slot<K> {
    pub(super) fn take(&self) -> Taken<K> {
        match self {
            Slot::Decoded(o) => Taken::Decoded(o.clone()),
            Slot::Encoded(e) => Taken::Encoded {
                body: e.body.clone(),
                generation: e.generation,
            },
        }
    }
}

/// What the writer packs with: the store's keeping and its write count.
pub(super) struct Packer<'a, K> {
    pub(super) keeping: &'a Keeping<K>,
    pub(super) generation: &'a mut u64,
}

impl<K: Resource> Packer<'_, K> {
    /// The slot to keep for `obj`: in a compact store, the bytes it came in if it came with
    /// them (they just decoded), else its encoding, unless that does not decode back.
    /// Checking each encoding once here is what lets every read of a compact store return
    /// what `len` and the indexes count.
    pub(super) fn pack(&mut self, key: &ObjectKey, obj: Arc<K>, raw: Option<RawObject>) -> Slot<K> {
        let Keeping::Compact(compact) = self.keeping else {
            return Slot::Decoded(obj);
        };
        let body = match (compact.wire, raw) {
            (Some(decode), Some(raw)) => Body {
                // Copied out of the buffer it arrived in, which may hold other objects.
                bytes: Arc::from(raw.as_bytes()),
                decoder: Decoder::Wire(raw.format(), decode),
            },
            _ => {
                let bytes = match compact.codec.encode(&obj) {
                    Ok(bytes) => bytes,
                    Err(err) => {
                        warn!(%key, %err, "object does not encode; keeping it decoded");
                        return Slot::Decoded(obj);
                    }
                };
                if let Err(err) = compact.codec.decode(&bytes) {
                    warn!(%key, %err, "object's encoding does not decode; keeping it decoded");
                    return Slot::Decoded(obj);
                }
                Body {
                    bytes: bytes.into(),
                    decoder: Decoder::Codec(compact.codec.clone()),
                }
            }
        };
        *self.generation += 1;
        Slot::Encoded(Encoded {
            body,
            version: obj.meta().resource_version.as_deref().map(Arc::from),
            labels: Labels::default(),
            generation: *self.generation,
        })
    }
}
