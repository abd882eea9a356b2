//! Kubernetes protobuf read into k8s-openapi types, as list items (no type) and watch
//! events' objects (with their type) are read.
//!
//! Input: one byte (bits 0-1 the kind: Pod, ConfigMap, Deployment, Service; bit 7 set for
//! a watch event's object), then the object's message without envelope.
//!
//! Checked, beyond not panicking: the object equals what serde_json makes of the JSON the
//! protobuf reads as (the protobuf path means what the JSON path means); it writes to JSON
//! and reads back equal; a compact store's decoder (field sets shared through a memo, met
//! once, twice and thrice) gives the same object or the same refusal; a `LazyObject` of
//! the same bytes has the object's metadata and decodes to the object; what decoding holds
//! at once is proportional to the message.

#![no_main]

use std::fmt::Debug;

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Pod, Service},
};
use kube_core::Resource;
use kube_informer::{
    fuzzing::{FieldSetCache, ProtobufKind, decode_protobuf, decode_protobuf_sharing},
    list_watch::LazyObject,
};
use kube_informer_fuzz::{assert_bounded, peak_allocation};
use libfuzzer_sys::fuzz_target;
use serde::{Serialize, de::DeserializeOwned};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, message)) = data.split_first() else {
        return;
    };
    let typed = selector & 0x80 != 0;
    match selector & 3 {
        0 => check::<Pod>(kind("", "pods"), typed, message),
        1 => check::<ConfigMap>(kind("", "configmaps"), typed, message),
        2 => check::<Deployment>(kind("apps", "deployments"), typed, message),
        _ => check::<Service>(kind("", "services"), typed, message),
    }
});

fn kind(group: &str, plural: &str) -> ProtobufKind {
    ProtobufKind::find(group, "v1", plural).expect("the table has the kind")
}

fn check<K>(kind: ProtobufKind, typed: bool, message: &[u8])
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Serialize + PartialEq + Debug,
{
    let (decoded, peak) = peak_allocation(|| decode_protobuf::<K>(kind, typed, message));
    // An empty embedded message (two bytes) can stand for a struct of a kilobyte.
    assert_bounded("decoding", peak, message.len(), 2048);

    if let Ok(json) = decode_protobuf::<serde_json::Value>(kind, typed, message) {
        if typed {
            assert_eq!(json["apiVersion"], kind.api_version().as_str());
            assert_eq!(json["kind"], kind.kind());
        }
        let via_json = serde_json::from_value::<K>(json.clone());
        match (&decoded, &via_json) {
            (Ok(object), Ok(again)) => assert_eq!(object, again, "protobuf and its JSON"),
            (Err(_), Err(_)) => {}
            (object, again) => {
                panic!("protobuf gave {object:?}, the JSON it reads as {again:?}; JSON: {json}")
            }
        }
    }

    if let Ok(object) = &decoded {
        let json = serde_json::to_vec(object).expect("a decoded object writes as JSON");
        let again: K = serde_json::from_slice(&json).expect("its JSON reads back");
        assert_eq!(&again, object, "written as JSON and read back");
    }

    let cache = FieldSetCache::default();
    for sighting in 1..=3 {
        let shared = decode_protobuf_sharing::<K>(kind, typed, message, &cache);
        match (&decoded, &shared) {
            (Ok(object), Ok(shared)) => assert_eq!(object, shared, "sighting {sighting}"),
            (Err(_), Err(_)) => {}
            (object, shared) => {
                panic!("sighting {sighting}: decoded {object:?}, through the memo {shared:?}")
            }
        }
    }

    let lazy = decode_protobuf::<LazyObject<K>>(kind, typed, message);
    if let Ok(object) = &decoded {
        let lazy = lazy.expect("an object that decodes has metadata that decodes");
        let mut metadata = object.meta().clone();
        metadata.managed_fields = None;
        assert_eq!(lazy.metadata, metadata, "a LazyObject's metadata");
        let whole = lazy
            .decode()
            .expect("a LazyObject of an object that decodes");
        assert_eq!(&whole, object, "a LazyObject decoded");
    }
}
