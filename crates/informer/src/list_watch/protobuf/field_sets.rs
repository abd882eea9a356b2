//! `managedFields`' field sets, parsed once and copied into the objects that carry them.
//!
//! A field set (`FieldsV1`) is JSON inside the protobuf, and `k8s-openapi` holds it as a
//! `serde_json::Value` tree. Parsing those trees is about a third of decoding a Pod, and a
//! deep copy of a parsed tree costs about a third of parsing it (`get-parts` in
//! `benches/benches/get.rs`). Objects made from one template, such as a ReplicaSet's Pods,
//! carry the same field sets byte for byte: a field set names fields, not their values.
//!
//! So a compact store decodes its objects with the field sets deferred
//! ([`FieldSets::Defer`]) and fills them in from a [`FieldSetMemo`]: a small, bounded map
//! from a field set's bytes to its parsed tree, which admits a field set the second time
//! it is met, so objects whose field sets are all different cost one hash each, not a copy.

use std::{collections::VecDeque, hash::BuildHasher, sync::Arc};

use hashbrown::HashMap;
use kube_core::Resource;
use serde::de::DeserializeOwned;
use serde_json::Value as Json;

use super::{
    deserializer::{FieldSets, TypeMeta, from_message_with},
    error::ProtobufError,
    schema::{Message, Value},
    wire::{Raw, Reader},
};

/// The most field sets a memo keeps parsed.
const MAX_KEPT: usize = 64;
/// The most bytes of field sets a memo keeps parsed (their parsed trees are several times
/// this); the largest field sets are the least likely to be shared.
const MAX_KEPT_BYTES: usize = 64 * 1024;
/// How many field sets met once a memo remembers (by hash), waiting for a second sighting.
const MAX_SEEN_ONCE: usize = 4096;

/// Parsed field sets, by their bytes. Shared by the readers of one store.
pub(crate) struct FieldSetMemo {
    hasher: foldhash::fast::RandomState,
    state: parking_lot::Mutex<MemoState>,
}

/// One kept field set: its bytes (to tell a hash collision) and its parsed tree.
struct Kept {
    bytes: Box<[u8]>,
    parsed: Arc<Json>,
}

#[derive(Default)]
struct MemoState {
    /// Parsed field sets, by the hash of their bytes.
    kept: HashMap<u64, Kept, foldhash::fast::RandomState>,
    /// `kept`'s hashes, oldest first: the first to go when the memo is full.
    order: VecDeque<u64>,
    kept_bytes: usize,
    /// Hashes of field sets met once and not kept.
    seen_once: hashbrown::HashSet<u64, foldhash::fast::RandomState>,
}

impl Default for FieldSetMemo {
    fn default() -> Self {
        Self {
            hasher: foldhash::fast::RandomState::default(),
            state: parking_lot::Mutex::new(MemoState::default()),
        }
    }
}

impl FieldSetMemo {
    /// The field set `json` holds, parsed.
    fn parse(&self, json: &[u8]) -> Result<Json, serde_json::Error> {
        let hash = self.hasher.hash_one(json);
        let admit = {
            let mut state = self.state.lock();
            if let Some(kept) = state.kept.get(&hash)
                && *kept.bytes == *json
            {
                let parsed = kept.parsed.clone();
                drop(state);
                return Ok(Json::clone(&parsed));
            }
            state.remember(hash)
        };
        let parsed: Json = serde_json::from_slice(json)?;
        if admit && json.len() <= MAX_KEPT_BYTES {
            self.state.lock().keep(hash, json, Arc::new(parsed.clone()));
        }
        Ok(parsed)
    }

    /// How many field sets the memo keeps parsed.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.state.lock().kept.len()
    }
}

impl MemoState {
    /// Notes a field set met and not kept; whether it had been met before.
    fn remember(&mut self, hash: u64) -> bool {
        if self.seen_once.remove(&hash) {
            return true;
        }
        if self.seen_once.len() >= MAX_SEEN_ONCE {
            self.seen_once.clear();
        }
        self.seen_once.insert(hash);
        false
    }

    fn keep(&mut self, hash: u64, json: &[u8], parsed: Arc<Json>) {
        if self.kept.contains_key(&hash) {
            return;
        }
        while self.kept.len() >= MAX_KEPT || self.kept_bytes + json.len() > MAX_KEPT_BYTES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(kept) = self.kept.remove(&oldest) {
                self.kept_bytes -= kept.bytes.len();
            }
        }
        self.kept_bytes += json.len();
        self.kept.insert(
            hash,
            Kept {
                bytes: json.into(),
                parsed,
            },
        );
        self.order.push_back(hash);
    }
}

/// Deserializes one message's bytes into `K`, its field sets parsed through `memo`.
///
/// Reads as [`from_message`](super::deserializer::from_message) does: if the field sets
/// found in the bytes do not line up with the decoded object's `managedFields` (a type
/// that keeps only some of them), it decodes again, parsing them in place.
pub(crate) fn from_message_sharing_field_sets<K: Resource + DeserializeOwned>(
    bytes: &[u8],
    message: &'static Message,
    type_meta: Option<TypeMeta<'_>>,
    memo: &FieldSetMemo,
) -> Result<K, ProtobufError> {
    let sets = field_set_bytes(bytes, message)?;
    if sets.iter().all(|set| set.is_empty()) {
        return from_message_with(bytes, message, type_meta, FieldSets::Parse);
    }
    let mut object: K = from_message_with(bytes, message, type_meta, FieldSets::Defer)?;
    if fill_in(&mut object, &sets, memo)? {
        Ok(object)
    } else {
        from_message_with(bytes, message, type_meta, FieldSets::Parse)
    }
}

/// Puts the parsed `sets` into `object`'s `managedFields`, one per entry in order; `false`
/// (and `object` half filled) when the entries are not the ones the sets came from.
fn fill_in<K: Resource>(
    object: &mut K,
    sets: &[&[u8]],
    memo: &FieldSetMemo,
) -> Result<bool, ProtobufError> {
    let Some(entries) = object.meta_mut().managed_fields.as_mut() else {
        return Ok(false);
    };
    if entries.len() != sets.len() {
        return Ok(false);
    }
    for (entry, set) in entries.iter_mut().zip(sets) {
        if set.is_empty() {
            continue;
        }
        let Some(deferred) = entry.fields_v1.as_mut() else {
            return Ok(false);
        };
        if !deferred.0.is_null() {
            return Ok(false);
        }
        deferred.0 = memo
            .parse(set)
            .map_err(|e| ProtobufError::Custom(format!("embedded JSON in FieldsV1: {e}")))?;
    }
    Ok(true)
}

/// The bytes of the field set of each `managedFields` entry of a message (empty for an
/// entry without one), in order; none when the message has no `metadata`.
fn field_set_bytes<'a>(
    bytes: &'a [u8],
    message: &'static Message,
) -> Result<Vec<&'a [u8]>, ProtobufError> {
    let mut sets = Vec::new();
    let Some((metadata, meta_message)) = last_message(bytes, message, "metadata")? else {
        return Ok(sets);
    };
    let Some((number, entry_message)) = message_field(meta_message, "managedFields") else {
        return Ok(sets);
    };
    let mut reader = Reader::new(metadata);
    while !reader.is_empty() {
        let (field, wire) = reader.tag()?;
        let raw = reader.value(wire)?;
        if field != number {
            continue;
        }
        let Raw::Len(entry) = raw else {
            return Err(ProtobufError::Malformed("managedFields entry"));
        };
        // `FieldsV1` is a raw-JSON shape: its one field, `raw`, is numbered 1.
        let set = match last_message(entry, entry_message, "fieldsV1")? {
            Some((fields_v1, _)) => last_len(fields_v1, 1)?.unwrap_or_default(),
            None => &[][..],
        };
        sets.push(set);
    }
    Ok(sets)
}

/// The number of `message`'s field named `json` and the message it holds, if it holds one.
fn message_field(message: &'static Message, json: &str) -> Option<(u32, &'static Message)> {
    let field = message.fields.iter().find(|f| f.json == json)?;
    match field.value {
        Value::Message(inner) => Some((field.number, inner)),
        _ => None,
    }
}

/// The bytes of the last occurrence of `message`'s field named `json` in `bytes`, with
/// the message it holds.
fn last_message<'a>(
    bytes: &'a [u8],
    message: &'static Message,
    json: &str,
) -> Result<Option<(&'a [u8], &'static Message)>, ProtobufError> {
    let Some((number, inner)) = message_field(message, json) else {
        return Ok(None);
    };
    Ok(last_len(bytes, number)?.map(|value| (value, inner)))
}

/// The bytes of the last occurrence of the length-delimited field `number` in `bytes`.
fn last_len(bytes: &[u8], number: u32) -> Result<Option<&[u8]>, ProtobufError> {
    let mut found = None;
    let mut reader = Reader::new(bytes);
    while !reader.is_empty() {
        let (field, wire) = reader.tag()?;
        let raw = reader.value(wire)?;
        if field == number {
            match raw {
                Raw::Len(value) => found = Some(value),
                _ => return Err(ProtobufError::Malformed("a message field not delimited")),
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use kube_core::DynamicObject;

    use super::*;
    use crate::list_watch::protobuf::{
        deserializer::from_message,
        test_encoder::{Msg, pods},
    };

    const SPEC: &[u8] = br#"{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{".":{},"f:image":{},"f:name":{}}}}}"#;
    const STATUS: &[u8] = br#"{"f:status":{"f:phase":{}}}"#;

    /// An entry of `managedFields` (ObjectMeta field 17): manager 1, time 4, fieldsV1 7.
    fn entry(manager: &str, seconds: u64, set: Option<&[u8]>) -> Msg {
        let entry = Msg::new()
            .str(1, manager)
            .str(2, "Apply")
            .str(3, "v1")
            .msg(4, &Msg::new().varint(1, seconds))
            .str(6, "FieldsV1");
        match set {
            Some(set) => entry.msg(7, &Msg::new().bytes(1, set)),
            None => entry,
        }
    }

    fn pod(name: &str, entries: &[Msg]) -> Vec<u8> {
        let mut metadata = Msg::new().str(1, name).str(3, "default");
        for e in entries {
            metadata = metadata.msg(17, e);
        }
        let spec = Msg::new().msg(2, &Msg::new().str(1, "web").str(2, "nginx"));
        Msg::new().msg(1, &metadata).msg(2, &spec).0
    }

    #[test]
    fn field_sets_from_the_memo_decode_as_parsing_them_in_place_does() {
        let memo = FieldSetMemo::default();
        let item = pods().item;
        let cases = [
            pod("a", &[entry("kubectl", 10, Some(SPEC))]),
            pod(
                "b",
                &[
                    entry("kubectl", 11, Some(SPEC)),
                    entry("kubelet", 12, Some(STATUS)),
                ],
            ),
            pod(
                "c",
                &[entry("kubectl", 13, None), entry("x", 14, Some(SPEC))],
            ),
            pod(
                "d",
                &[
                    entry("kubectl", 15, Some(b"")),
                    entry("y", 16, Some(STATUS)),
                ],
            ),
            pod("e", &[]),
        ];
        for round in 0..3 {
            for bytes in &cases {
                let parsed: Pod = from_message(bytes, item, None).unwrap();
                let shared: Pod =
                    from_message_sharing_field_sets(bytes, item, None, &memo).unwrap();
                assert_eq!(shared, parsed, "round {round}");
                let parsed: DynamicObject = from_message(bytes, item, None).unwrap();
                let shared: DynamicObject =
                    from_message_sharing_field_sets(bytes, item, None, &memo).unwrap();
                assert_eq!(shared, parsed, "round {round}");
            }
        }
        let parsed: Pod = from_message(&cases[1], item, None).unwrap();
        let sets: Vec<_> = parsed.metadata.managed_fields.unwrap();
        assert!(
            sets.iter()
                .all(|e| e.fields_v1.as_ref().is_some_and(|f| f.0.is_object()))
        );
        assert_eq!(memo.kept(), 2, "the two field sets met more than once");
    }

    #[test]
    fn a_field_set_met_once_is_not_kept_and_a_full_memo_lets_the_oldest_go() {
        let memo = FieldSetMemo::default();
        memo.parse(SPEC).unwrap();
        assert_eq!(memo.kept(), 0);
        memo.parse(SPEC).unwrap();
        assert_eq!(memo.kept(), 1);
        for i in 0..MAX_KEPT + 10 {
            let set = format!(r#"{{"f:metadata":{{"f:labels":{{"f:l{i}":{{}}}}}}}}"#);
            memo.parse(set.as_bytes()).unwrap();
            memo.parse(set.as_bytes()).unwrap();
        }
        assert_eq!(memo.kept(), MAX_KEPT);
        assert_eq!(memo.state.lock().order.len(), MAX_KEPT);
        assert!(memo.state.lock().kept_bytes <= MAX_KEPT_BYTES);
    }

    #[test]
    fn a_field_set_that_is_not_json_is_an_error() {
        let memo = FieldSetMemo::default();
        let bytes = pod("bad", &[entry("kubectl", 1, Some(b"{not json"))]);
        let err =
            from_message_sharing_field_sets::<Pod>(&bytes, pods().item, None, &memo).unwrap_err();
        assert!(err.to_string().contains("FieldsV1"), "{err}");
    }
}
