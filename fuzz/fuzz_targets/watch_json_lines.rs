//! A watch body in JSON lines, as the API server sends it for custom resources (and for
//! built-in kinds when asked for JSON), read into a watch stream.
//!
//! Input: one byte (bits 0-6 the size of the chunks the body arrives in, 0 for all at
//! once; bit 7 reads `DynamicObject`s instead of Pods), then the body.
//!
//! Checked, beyond not panicking: the items do not depend on how the body was cut; there
//! is exactly one item per complete line that is not blank (an event, or an error item for
//! a line that is none); each event written back as a JSON line reads back as the same
//! event; what reading holds at once is proportional to the body.

#![no_main]

use std::fmt::Debug;

use k8s_openapi::api::core::v1::Pod;
use kube_core::DynamicObject;
use kube_informer::{fuzzing::watch_body, list_watch::WatchEvent};
use kube_informer_fuzz::{assert_bounded, chunks, describe_watch_item, peak_allocation};
use libfuzzer_sys::fuzz_target;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::json;

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

fn check<K: DeserializeOwned + Serialize + Debug + Send + 'static>(body: &[u8], size: usize) {
    let (items, peak) = peak_allocation(|| watch_body::<K>(chunks(body, size), None));
    // A line of `{}`s in a list is a struct each, several hundred bytes for two of input.
    assert_bounded("reading", peak, body.len(), 2048);
    let described: Vec<String> = items.iter().map(describe_watch_item).collect();

    let whole: Vec<String> = watch_body::<K>(chunks(body, 0), None)
        .iter()
        .map(describe_watch_item)
        .collect();
    assert_eq!(described, whole, "chunks of {size} against the whole body");

    let mut lines: Vec<&[u8]> = body.split(|b| *b == b'\n').collect();
    lines.pop();
    let events = lines
        .iter()
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        .count();
    assert_eq!(items.len(), events, "one item per complete line");

    for (item, described) in items.iter().zip(&described) {
        let Some(line) = item.as_ref().ok().and_then(line_of) else {
            continue;
        };
        let again = watch_body::<K>(vec![line.clone()], None);
        let again: Vec<String> = again.iter().map(describe_watch_item).collect();
        assert_eq!(
            again,
            [described.clone()],
            "written back as {}",
            String::from_utf8_lossy(&line)
        );
    }
}

/// The JSON line the API server would send for `event`.
fn line_of<K: Serialize>(event: &WatchEvent<K>) -> Option<Vec<u8>> {
    let value = match event {
        WatchEvent::Added(object) => json!({ "type": "ADDED", "object": object }),
        WatchEvent::Modified(object) => json!({ "type": "MODIFIED", "object": object }),
        WatchEvent::Deleted(object) => json!({ "type": "DELETED", "object": object }),
        WatchEvent::Bookmark {
            resource_version,
            initial_events_end,
        } => {
            let mut metadata = json!({ "resourceVersion": resource_version });
            if *initial_events_end {
                metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
            }
            json!({
                "type": "BOOKMARK",
                "object": { "apiVersion": "v1", "kind": "Pod", "metadata": metadata },
            })
        }
        WatchEvent::Error(status) => json!({ "type": "ERROR", "object": status }),
        // Only its key is known, and protobuf bytes have no JSON line.
        WatchEvent::Undecodable { .. } | WatchEvent::Decoded { .. } => return None,
    };
    let mut line = serde_json::to_vec(&value).expect("an event writes as JSON");
    line.push(b'\n');
    Some(line)
}
