//! Kubernetes protobuf read into `DynamicObject`s, as an informer of `DynamicObject`s
//! with `WireFormat::Protobuf` reads built-in kinds.
//!
//! Input: one byte (bits 0-6 pick the resource, bit 7 set for a watch event's object, which
//! carries its type), then the object's message without envelope.
//!
//! Checked, beyond not panicking: the object equals what serde_json makes of the JSON the
//! protobuf reads as; its type is the resource's exactly when the object came with one; it
//! writes to JSON and reads back equal; a compact store's decoder agrees; a Pod's metadata
//! is the same read dynamically or typed; what decoding holds at once is proportional to
//! the message.

#![no_main]

use k8s_openapi::api::core::v1::Pod;
use kube_core::{DynamicObject, TypeMeta};
use kube_informer::fuzzing::{
    FieldSetCache, ProtobufKind, decode_protobuf, decode_protobuf_sharing,
};
use kube_informer_fuzz::{assert_bounded, peak_allocation};
use libfuzzer_sys::fuzz_target;

/// The resources a byte picks from: core and grouped, namespaced and cluster-wide.
const RESOURCES: [(&str, &str, &str); 8] = [
    ("", "v1", "pods"),
    ("", "v1", "configmaps"),
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "secrets"),
    ("", "v1", "nodes"),
    ("events.k8s.io", "v1", "events"),
    ("coordination.k8s.io", "v1", "leases"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, message)) = data.split_first() else {
        return;
    };
    let typed = selector & 0x80 != 0;
    let (group, version, plural) = RESOURCES[usize::from(selector & 0x7f) % RESOURCES.len()];
    let kind = ProtobufKind::find(group, version, plural).expect("the table has the kind");

    let (decoded, peak) =
        peak_allocation(|| decode_protobuf::<DynamicObject>(kind, typed, message));
    assert_bounded("decoding", peak, message.len(), 2048);

    if let Ok(json) = decode_protobuf::<serde_json::Value>(kind, typed, message) {
        let via_json = serde_json::from_value::<DynamicObject>(json.clone());
        match (&decoded, &via_json) {
            (Ok(object), Ok(again)) => assert_eq!(object, again, "protobuf and its JSON"),
            (Err(_), Err(_)) => {}
            (object, again) => {
                panic!("protobuf gave {object:?}, the JSON it reads as {again:?}; JSON: {json}")
            }
        }
    }

    let Ok(object) = &decoded else {
        return;
    };
    let expected = typed.then(|| TypeMeta {
        api_version: kind.api_version(),
        kind: kind.kind().to_owned(),
    });
    assert_eq!(object.types, expected, "the object's type");

    let json = serde_json::to_vec(object).expect("a decoded object writes as JSON");
    let again: DynamicObject = serde_json::from_slice(&json).expect("its JSON reads back");
    assert_eq!(&again, object, "written as JSON and read back");

    let cache = FieldSetCache::default();
    for sighting in 1..=3 {
        let shared = decode_protobuf_sharing::<DynamicObject>(kind, typed, message, &cache)
            .expect("the memo reads what decodes");
        assert_eq!(&shared, object, "sighting {sighting}");
    }

    if plural == "pods"
        && let Ok(pod) = decode_protobuf::<Pod>(kind, typed, message)
    {
        assert_eq!(
            pod.metadata, object.metadata,
            "a Pod's metadata, typed or not"
        );
    }
});
