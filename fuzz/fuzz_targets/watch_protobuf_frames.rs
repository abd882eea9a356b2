//! A watch body in length-prefixed protobuf frames, as the API server sends it for
//! built-in kinds, read into a watch stream of Pods.
//!
//! Input: one byte (bits 0-6 the size of the chunks the body arrives in, 0 for all at
//! once; bit 7 reads `DynamicObject`s instead of Pods), then the body.
//!
//! Checked, beyond not panicking: the items do not depend on how the body was cut; there
//! is exactly one item per complete frame, and a frame longer than the limit ends the
//! stream with one error item; the bytes kept with each decoded object (which a compact
//! store decodes again) decode to that object, in the resource's format; an `ERROR`
//! event's status writes to JSON and reads back equal; what reading holds at once is
//! proportional to the body, whatever lengths the frames claim.

#![no_main]

use std::fmt::Debug;

use k8s_openapi::api::core::v1::Pod;
use kube_core::{DynamicObject, Status};
use kube_informer::{
    fuzzing::{MAX_WATCH_FRAME, ProtobufKind, decode_raw, raw_format, watch_body},
    list_watch::WatchEvent,
};
use kube_informer_fuzz::{assert_bounded, chunks, describe_watch_item, peak_allocation};
use libfuzzer_sys::fuzz_target;
use serde::{Serialize, de::DeserializeOwned};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let size = usize::from(selector & 0x7f);
    if selector & 0x80 == 0 {
        check::<Pod>(body, size);
    } else {
        check::<DynamicObject>(body, size);
    }
});

fn check<K>(body: &[u8], size: usize)
where
    K: DeserializeOwned + Serialize + PartialEq + Debug + Send + 'static,
{
    let pods = ProtobufKind::find("", "v1", "pods").expect("the table has Pods");
    let (items, peak) = peak_allocation(|| watch_body::<K>(chunks(body, size), Some(pods)));
    assert_bounded("reading", peak, body.len(), 2048);
    let described: Vec<String> = items.iter().map(describe_watch_item).collect();

    let whole: Vec<String> = watch_body::<K>(chunks(body, 0), Some(pods))
        .iter()
        .map(describe_watch_item)
        .collect();
    assert_eq!(described, whole, "chunks of {size} against the whole body");

    let (frames, too_long) = frames(body);
    assert_eq!(
        items.len(),
        frames + usize::from(too_long),
        "one item per frame"
    );
    if too_long {
        assert!(
            items.last().is_some_and(Result::is_err),
            "ends with an error"
        );
    }

    for item in &items {
        match item {
            Ok(WatchEvent::Decoded { object, raw, .. }) => {
                assert_eq!(
                    raw_format(raw),
                    Some((pods, true)),
                    "kept as typed protobuf"
                );
                let again: K = decode_raw(raw).expect("the bytes kept decode");
                assert_eq!(&again, object, "the bytes kept decode to the object");
            }
            Ok(WatchEvent::Error(status)) => {
                let json = serde_json::to_vec(status).expect("a status writes as JSON");
                let again: Status = serde_json::from_slice(&json).expect("and reads back");
                assert_eq!(&again, &**status, "a status written as JSON and read back");
            }
            Ok(WatchEvent::Undecodable { object, .. }) => {
                assert!(
                    !object.key.name().is_empty(),
                    "an undecodable object has a key"
                );
            }
            Ok(WatchEvent::Added(_) | WatchEvent::Modified(_)) => {
                panic!("a protobuf watch keeps the bytes of what it adds")
            }
            Ok(WatchEvent::Deleted(_) | WatchEvent::Bookmark { .. }) | Err(_) => {}
        }
    }
}

/// The complete frames of `body` up to the first that claims more than the limit, and
/// whether one does.
fn frames(body: &[u8]) -> (usize, bool) {
    let mut count = 0;
    let mut rest = body;
    while let Some((header, after)) = rest.split_first_chunk::<4>() {
        let len = u32::from_be_bytes(*header) as usize;
        if len > MAX_WATCH_FRAME {
            return (count, true);
        }
        let Some(after) = after.get(len..) else {
            break;
        };
        count += 1;
        rest = after;
    }
    (count, false)
}
