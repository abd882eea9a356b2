//! The store's objects as it keeps them, handed out and taken back without decoding: a warm
//! restart's snapshot saves the bytes a compact store holds and fills the next store with
//! them, so neither end pays for decoding every object.

use std::sync::Arc;

use kube_core::Resource;

use super::{
    State, Store, WriterState, labels,
    slot::{self, Compact, Decoder, Keeping, Slot, WireDecoder},
    writer::Writer,
};
use crate::{codec::Codec, key::ObjectKey, list_watch::RawFormat};

impl<K: Resource> Store<K> {
    /// Every object as the store keeps it, at one instant, for a snapshot, without
    /// decoding any: a caller holding a lock decodes nothing under it.
    pub(crate) fn kept(&self) -> KeptObjects<K> {
        self.read()
            .objects
            .iter()
            .map(|(key, slot)| {
                let kept = match slot {
                    Slot::Decoded(object) => Kept::Object(object.clone()),
                    Slot::Encoded(encoded) => match &encoded.body.decoder {
                        Decoder::Wire(format, _) => Kept::Wire {
                            format: *format,
                            bytes: encoded.body.bytes.clone(),
                            version: encoded.version.clone(),
                            labels: KeptLabels(encoded.labels.clone()),
                        },
                        Decoder::Codec(codec) => {
                            Kept::Encoded(codec.clone(), encoded.body.bytes.clone())
                        }
                    },
                };
                (key.clone(), kept)
            })
            .collect()
    }

    /// The key and resourceVersion of every object, at one instant, without decoding any.
    pub(crate) fn key_versions(&self) -> Vec<(ObjectKey, String)> {
        self.read()
            .objects
            .iter()
            .map(|(key, slot)| (key.clone(), slot.version().unwrap_or_default().to_owned()))
            .collect()
    }
}

/// Every object of a store as it keeps it, by key (see [`Store::kept`]).
pub(crate) type KeptObjects<K> = Vec<(ObjectKey, Kept<K>)>;

/// An object as its bytes, with what a compact store reads without decoding it: how a
/// warm restart's snapshot hands its objects over (see [`Writer::insert_encoded`]).
pub(crate) struct EncodedObject {
    pub(crate) key: ObjectKey,
    pub(crate) format: RawFormat,
    /// In an allocation of their own, as the store keeps them.
    pub(crate) bytes: Arc<[u8]>,
    pub(crate) version: Option<Arc<str>>,
    pub(crate) labels: LabelRun,
}

/// The labels of the objects of a part of a warm restart, every key and value in one text:
/// reading them back costs no allocation per object, and neither does dropping them
/// (which the store's thread does, not the reader's).
#[derive(Debug, Default)]
pub(crate) struct LabelText {
    text: String,
    /// Where each key ends in `text`, and its value.
    ends: Vec<(usize, usize)>,
}

impl LabelText {
    /// Adds label `key` with `value`.
    pub(crate) fn push(&mut self, key: &str, value: &str) {
        self.text.push_str(key);
        let key_end = self.text.len();
        self.text.push_str(value);
        self.ends.push((key_end, self.text.len()));
    }

    /// How many labels it holds.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }
}

/// One object's labels: a run of a [`LabelText`] shared by a part's objects.
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelRun {
    text: Arc<LabelText>,
    labels: std::ops::Range<usize>,
}

impl LabelRun {
    /// Labels `labels` of `text`.
    pub(crate) fn new(text: Arc<LabelText>, labels: std::ops::Range<usize>) -> Self {
        Self { text, labels }
    }

    /// The `key=value` pairs, in the order they were added.
    pub(crate) fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        let text = &*self.text;
        self.labels.clone().map(move |at| {
            let start = match at {
                0 => 0,
                _ => text.ends[at - 1].1,
            };
            let (key_end, value_end) = text.ends[at];
            (&text.text[start..key_end], &text.text[key_end..value_end])
        })
    }
}

impl<'a> FromIterator<(&'a str, &'a str)> for LabelRun {
    fn from_iter<I: IntoIterator<Item = (&'a str, &'a str)>>(pairs: I) -> Self {
        let mut text = LabelText::default();
        for (key, value) in pairs {
            text.push(key, value);
        }
        let labels = 0..text.len();
        Self::new(Arc::new(text), labels)
    }
}

/// One object as a store keeps it (see [`Store::kept`]).
pub(crate) enum Kept<K> {
    /// The bytes the server sent, in their format, with the object's resourceVersion and
    /// labels as the store read them.
    Wire {
        format: RawFormat,
        bytes: Arc<[u8]>,
        version: Option<Arc<str>>,
        labels: KeptLabels,
    },
    /// The bytes of the store's own codec.
    Encoded(Arc<dyn Codec<K>>, Arc<[u8]>),
    /// The object.
    Object(Arc<K>),
}

/// The labels of an object kept as bytes (see [`Kept::Wire`]).
pub(crate) struct KeptLabels(labels::Labels);

impl KeptLabels {
    /// The `key=value` pairs, sorted by key.
    pub(crate) fn pairs(&self) -> impl ExactSizeIterator<Item = (&str, &str)> {
        self.0.pairs()
    }
}

impl<K: Resource> Writer<K> {
    /// Whether [`insert_encoded`](Self::insert_encoded) can store objects: this store keeps
    /// the server's bytes and has no index of its own.
    pub(crate) fn takes_encoded(&self) -> bool {
        self.encoded_decoder(&self.writer()).is_some()
    }

    /// The decoder of the server's bytes, if this store keeps them and has no index but the
    /// built-in namespace one (always the first), whose values the keys hold.
    fn encoded_decoder(&self, writer: &WriterState<K>) -> Option<WireDecoder<K>> {
        match &self.shared.keeping {
            Keeping::Compact(Compact {
                wire: Some(decode), ..
            }) if writer.index_fns.len() <= 1 => Some(*decode),
            _ => None,
        }
    }

    /// Stores `objects` as their bytes, without decoding them, when this store can: one
    /// that keeps the server's bytes and has no index but the built-in namespace one
    /// (whose values the keys hold). Returns those it did not store (all of them when it
    /// cannot; any whose key it holds already), to be decoded and stored as any other.
    pub(crate) fn insert_encoded(&self, objects: Vec<EncodedObject>) -> Vec<EncodedObject> {
        let mut writer = self.writer();
        let Some(decode) = self.encoded_decoder(&writer) else {
            return objects;
        };
        let mut st = self.write();
        let mut left = Vec::new();
        st.objects.reserve(objects.len());
        let State {
            objects: stored,
            indexes,
            labels: interner,
        } = &mut *st;
        for object in objects {
            if stored.contains_key(&object.key) {
                left.push(object);
                continue;
            }
            writer.generation += 1;
            let EncodedObject {
                key,
                format,
                bytes,
                version,
                labels,
            } = object;
            if let Some(namespace) = key.namespace() {
                indexes[0].add_one(&key, namespace);
            }
            let slot = Slot::Encoded(slot::Encoded {
                body: slot::Body {
                    bytes,
                    decoder: Decoder::Wire(format, decode),
                },
                version,
                labels: interner.intern_pairs(labels.pairs()),
                generation: writer.generation,
            });
            stored.insert(key, slot);
        }
        left
    }
}
