//! A warm restart's snapshot read back from disk, as an informer of Pods reads it at start.
//!
//! Input: one byte that says how the rest becomes the file (0: as it is; 1: followed by
//! its checksum; 2: a body put between the magic and format version and the checksum,
//! so that the fuzzer spends its time past them), then the bytes.
//!
//! Checked, beyond not panicking: a file that is no snapshot, of another format or
//! selection, or whose checksum fails is refused before any object is handed on; reading
//! with and without decoding agree (the same records, the same refusal, an object that
//! fails to decode being the first whose bytes do not decode); a snapshot read is written
//! again from its records and reads back the same, byte for byte when the header names the
//! same resource; what reading holds at once is proportional to the file.

#![no_main]

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use kube_informer::fuzzing::{
    SnapshotRead, SnapshotRefusal, decode_restored, read_snapshot_at, restored_record,
};
use kube_informer_fuzz::{
    SNAPSHOT_FORMAT, SNAPSHOT_MAGIC, SnapshotHeader, SnapshotRecord, assert_bounded,
    peak_allocation, snapshot_file, snapshot_header, with_checksum,
};
use libfuzzer_sys::fuzz_target;

/// The selection the target's informer lists.
const SELECTION: &str = "fuzz";

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "kube-informer-fuzz-{}-{name}.snapshot",
        std::process::id()
    ))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let file = match mode % 3 {
        0 => rest.to_vec(),
        1 => with_checksum(rest.to_vec()),
        _ => {
            let mut file = SNAPSHOT_MAGIC.to_vec();
            file.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
            file.extend_from_slice(rest);
            with_checksum(file)
        }
    };
    let path = scratch("input");
    std::fs::write(&path, &file).expect("the scratch file is writable");

    let (lazily, peak) = peak_allocation(|| read_snapshot_at::<Pod>(&path, SELECTION, false));
    assert_bounded("reading", peak, file.len(), 64);
    let (decoding, peak) = peak_allocation(|| read_snapshot_at::<Pod>(&path, SELECTION, true));
    // Decoded Pods: the protobuf reader's proportion.
    assert_bounded("reading and decoding", peak, file.len(), 2048);

    for read in [&lazily, &decoding] {
        if let Err((refusal, said)) = &read.result {
            let whole_file = matches!(
                refusal,
                SnapshotRefusal::Foreign
                    | SnapshotRefusal::FormatVersion
                    | SnapshotRefusal::OtherSelection
                    | SnapshotRefusal::Checksum
            );
            assert!(
                !whole_file || read.objects.is_empty(),
                "{said}: objects handed on before the file was checked"
            );
        }
    }

    agree(&lazily, &decoding);

    if let Ok(resource_version) = &lazily.result {
        rewrite(&file, resource_version, &lazily);
    }
});

/// The records of a read, as the format spells them.
fn records(read: &SnapshotRead<Pod>) -> Vec<SnapshotRecord> {
    read.objects
        .iter()
        .map(|object| {
            let record = restored_record(object);
            SnapshotRecord {
                tag: match record.format {
                    None => 0,
                    Some((_, false)) => 1,
                    Some((_, true)) => 2,
                },
                key: record.key.to_owned(),
                version: record.version.unwrap_or_default().to_owned(),
                labels: (record.labels.iter())
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                bytes: record.bytes.to_vec(),
            }
        })
        .collect()
}

/// Reading with decoding and without agree: what decodes is what the records decode to.
fn agree(lazily: &SnapshotRead<Pod>, decoding: &SnapshotRead<Pod>) {
    match (&lazily.result, &decoding.result) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b);
            assert_eq!(records(lazily), records(decoding));
            for (lazy, decoded) in lazily.objects.iter().zip(&decoding.objects) {
                let key = restored_record(lazy).key;
                let object = restored_record(decoded).object.expect("decoded as read");
                assert!(
                    restored_record(lazy).object.is_none(),
                    "{key}: decoded though not asked"
                );
                let again = decode_restored(lazy)
                    .unwrap_or_else(|e| panic!("{key}: decoded as read, not later: {e}"));
                assert_eq!(&again, object, "{key}: decoded as read and later");
            }
        }
        (Ok(_), Err((SnapshotRefusal::Undecodable(index), said))) => {
            let index = *index;
            assert!(index < lazily.objects.len(), "{said}: no record {index}");
            for (at, object) in lazily.objects.iter().enumerate().take(index + 1) {
                let decoded = decode_restored(object);
                assert_eq!(
                    decoded.is_ok(),
                    at < index,
                    "{said}: record {at} of the lazy read decodes: {:?}",
                    decoded.err()
                );
            }
        }
        (Err((a, _)), Err((b, _))) => assert_eq!(a, b, "the same refusal"),
        (a, b) => panic!(
            "without decoding {:?}, decoding {:?}",
            a.as_ref().map_err(|e| &e.1),
            b.as_ref().map_err(|e| &e.1)
        ),
    }
}

/// The snapshot written again from what was read reads back the same.
fn rewrite(file: &[u8], resource_version: &str, read: &SnapshotRead<Pod>) {
    let read_records = records(read);
    let header = SnapshotHeader {
        selection: SELECTION.to_owned(),
        resource_version: resource_version.to_owned(),
        protobuf: read
            .objects
            .iter()
            .find_map(|o| restored_record(o).format)
            .map(|(kind, _)| kind.name())
            .unwrap_or_default(),
    };
    let written = snapshot_file(&header, &read_records);
    if snapshot_header(file).as_ref() == Some(&header) {
        assert_eq!(written, file, "written again from its records");
    }
    let path = scratch("rewritten");
    std::fs::write(&path, &written).expect("the scratch file is writable");
    let again = read_snapshot_at::<Pod>(&path, SELECTION, false);
    assert_eq!(
        again.result.as_ref().map_err(|e| &e.1),
        Ok(&resource_version.to_owned())
    );
    assert_eq!(records(&again), read_records, "read back");
}
