//! A list response's body, JSON or protobuf, read into a list stream as it arrives.
//!
//! Input: one byte (bit 0 set for a protobuf list of Pods, else JSON; bits 1-6 the size of
//! the chunks the body arrives in, 0 for all at once; bit 7 reads a JSON list into
//! `DynamicObject`s instead of Pods), then the body.
//!
//! Checked, beyond not panicking: the items do not depend on how the body was cut; the
//! stream is objects, then one end or one error, nothing after; the bytes kept with each
//! object decode to it. For JSON, against serde_json reading the whole body: a list the
//! reader accepts is JSON, its items and metadata are the ones serde_json reads, and a
//! well-formed list (an object with an array of objects as `items` and a string
//! `resourceVersion`) is accepted. What reading holds at once is proportional to the body.

#![no_main]

use std::{collections::BTreeMap, fmt::Debug};

use k8s_openapi::api::core::v1::Pod;
use kube_core::DynamicObject;
use kube_informer::{
    fuzzing::{ProtobufKind, decode_raw, list_body},
    list_watch::ListItem,
};
use kube_informer_fuzz::{assert_bounded, chunks, json, peak_allocation};
use libfuzzer_sys::fuzz_target;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let size = usize::from((selector >> 1) & 0x3f);
    if selector & 1 == 1 {
        let pods = ProtobufKind::find("", "v1", "pods").expect("the table has Pods");
        check::<Pod>(body, size, Some(pods));
    } else if selector & 0x80 == 0 {
        check::<Pod>(body, size, None);
        against_serde_json(body, size);
    } else {
        check::<DynamicObject>(body, size, None);
    }
});

fn describe<K: Serialize>(item: &Result<ListItem<K>, kube_informer::Error>) -> String {
    match item {
        Ok(ListItem::Object(object)) => format!("object {}", json(object)),
        Ok(ListItem::Decoded { object, raw }) => {
            format!("decoded {} from {:?}", json(object), raw.as_bytes())
        }
        Ok(ListItem::Undecodable(undecodable)) => format!("undecodable {undecodable:?}"),
        Ok(ListItem::End {
            resource_version,
            continue_token,
            shard_selector,
        }) => format!("end {resource_version:?} {continue_token:?} {shard_selector:?}"),
        Err(error) => format!("failed: {error}"),
    }
}

fn check<K>(body: &[u8], size: usize, protobuf: Option<ProtobufKind>) -> Vec<String>
where
    K: DeserializeOwned + Serialize + PartialEq + Debug + Send + 'static,
{
    let (items, peak) = peak_allocation(|| list_body::<K>(chunks(body, size), protobuf));
    assert_bounded("reading", peak, body.len(), 2048);
    let described: Vec<String> = items.iter().map(describe).collect();
    let whole: Vec<String> = list_body::<K>(chunks(body, 0), protobuf)
        .iter()
        .map(describe)
        .collect();
    assert_eq!(described, whole, "chunks of {size} against the whole body");

    let last = items.len().saturating_sub(1);
    for (at, item) in items.iter().enumerate() {
        match item {
            Ok(ListItem::Decoded { object, raw }) => {
                let again: K = decode_raw(raw).expect("the bytes kept decode");
                assert_eq!(&again, object, "the bytes kept decode to the object");
            }
            Ok(ListItem::End { .. }) | Err(_) => assert_eq!(at, last, "nothing after the end"),
            Ok(ListItem::Undecodable(_)) => {}
            Ok(ListItem::Object(_)) => panic!("a body's objects come with their bytes"),
        }
    }
    if !body.is_empty() {
        assert!(
            matches!(items.last(), Some(Ok(ListItem::End { .. }) | Err(_))),
            "a list ends with its end or an error"
        );
    }
    described
}

/// What a list's envelope must be for the reader: its metadata, if any, an object of
/// these, each absent, null or of its type.
#[derive(Deserialize)]
#[allow(dead_code)]
struct Envelope {
    #[serde(default)]
    metadata: Meta,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct Meta {
    resource_version: Option<String>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    shard_info: Option<ShardInfo>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct ShardInfo {
    #[serde(default)]
    selector: String,
}

fn against_serde_json(body: &[u8], size: usize) {
    let items = list_body::<Value>(chunks(body, size), None);
    let accepted = matches!(items.last(), Some(Ok(ListItem::End { .. })));
    let parsed = serde_json::from_slice::<Value>(body);
    if accepted {
        // The syntax, as serde_json checks it where it skips what it does not keep (it
        // takes strings that are not UTF-8, as the reader takes an object it cannot decode
        // if its key reads).
        let syntax = serde_json::from_slice::<serde::de::IgnoredAny>(body);
        let recursion = |e: &serde_json::Error| e.to_string().contains("recursion limit");
        // serde_json refuses more than 128 levels of nesting, which the reader takes.
        if syntax.as_ref().is_err_and(recursion) || parsed.as_ref().is_err_and(recursion) {
            return;
        }
        assert!(
            syntax.is_ok(),
            "accepted a list that is not JSON: {syntax:?}"
        );
        assert_eq!(
            body.iter().find(|b| !b.is_ascii_whitespace()),
            Some(&b'{'),
            "accepted a list that is no JSON object"
        );
        let undecodable = items
            .iter()
            .any(|item| matches!(item, Ok(ListItem::Undecodable(_))));
        let Ok(Value::Object(list)) = &parsed else {
            return;
        };
        if undecodable || top_level_keys_repeat(body) {
            return;
        }
        let objects: Vec<&Value> = items
            .iter()
            .filter_map(|item| match item {
                Ok(ListItem::Decoded { object, .. }) => Some(object),
                _ => None,
            })
            .collect();
        let expected: Vec<&Value> = match list.get("items") {
            Some(Value::Array(items)) => items.iter().collect(),
            _ => Vec::new(),
        };
        assert_eq!(objects, expected, "the items serde_json reads");
        let Some(Ok(ListItem::End {
            resource_version,
            continue_token,
            ..
        })) = items.last()
        else {
            unreachable!("accepted");
        };
        let metadata = list.get("metadata");
        let text = |key: &str| metadata.and_then(|m| m.get(key)).and_then(Value::as_str);
        assert_eq!(resource_version, text("resourceVersion").unwrap_or(""));
        assert_eq!(
            continue_token.as_deref(),
            text("continue").filter(|c| !c.is_empty())
        );
    } else if let Ok(Value::Object(list)) = &parsed {
        let well_formed = !top_level_keys_repeat(body)
            && matches!(list.get("items"), Some(Value::Array(items)) if items.iter().all(Value::is_object))
            && serde_json::from_slice::<Envelope>(body).is_ok();
        assert!(!well_formed, "refused a well-formed list: {items:?}");
    }
}

/// Whether the top-level object of `body` (valid JSON) names a key twice, which serde_json
/// reads as the last and a streaming reader as each in turn.
fn top_level_keys_repeat(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    #[serde(transparent)]
    struct Keys(BTreeMap<String, serde::de::IgnoredAny>);
    match (
        serde_json::from_slice::<Keys>(body),
        serde_json::from_slice::<CountKeys>(body),
    ) {
        (Ok(Keys(keys)), Ok(CountKeys(pairs))) => pairs != keys.len(),
        _ => false,
    }
}

/// How many keys the top-level object has, repeats included.
struct CountKeys(usize);

impl<'de> Deserialize<'de> for CountKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = CountKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<CountKeys, A::Error> {
                let mut count = 0;
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {
                    count += 1;
                }
                Ok(CountKeys(count))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}
