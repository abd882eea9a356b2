//! What the fuzz targets share: an allocator that measures what a call holds at its
//! peak, the way a target cuts a body into the chunks it arrives in, and an encoder of
//! warm-restart snapshots written from the format's description, not from the library.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicUsize, Ordering},
};

/// The system allocator, counting the bytes live and the most live at once.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn shrank(by: usize) {
    LIVE.fetch_sub(by, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counters only
// observe the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f`; returns what it returned and the most bytes it held allocated at once beyond
/// what was live when it started (what it returns included).
pub fn peak_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let value = f();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    (value, peak)
}

/// Fails the run when reading `input_len` bytes held more than `per_byte` bytes for each
/// of them, plus a fixed allowance for the decoders' tables and buffers: a decoder that
/// trusts a length or a count it read, instead of what arrived, allocates far more.
pub fn assert_bounded(what: &str, peak: usize, input_len: usize, per_byte: usize) {
    const FIXED: usize = 4 << 20;
    let limit = FIXED + per_byte * input_len;
    assert!(
        peak <= limit,
        "{what}: {peak} bytes allocated at once for {input_len} bytes of input (limit {limit})"
    );
}

/// `body` as it arrives in chunks of `size` bytes (`0`: all at once).
pub fn chunks(body: &[u8], size: usize) -> Vec<Vec<u8>> {
    match size {
        0 => vec![body.to_vec()],
        size => body.chunks(size).map(<[u8]>::to_vec).collect(),
    }
}

/// The first bytes of every warm-restart snapshot.
pub const SNAPSHOT_MAGIC: &[u8; 24] = b"kube-informer snapshot\n\0";

/// The snapshot format the library reads.
pub const SNAPSHOT_FORMAT: u32 = 2;

/// One record of a snapshot: the encoding of its bytes (0 JSON, 1 protobuf, 2 protobuf
/// with its type), the object's key, resourceVersion and labels, and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRecord {
    /// How the bytes decode.
    pub tag: u8,
    /// The object's key.
    pub key: String,
    /// Its resourceVersion; empty when it has none.
    pub version: String,
    /// Its labels, in order.
    pub labels: Vec<(String, String)>,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// The header fields of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotHeader {
    /// The selection it is of.
    pub selection: String,
    /// The resourceVersion its objects are the state at.
    pub resource_version: String,
    /// `group/version/plural` of its protobuf records' resource, or empty.
    pub protobuf: String,
}

fn put_text(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("a field under 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A whole snapshot file of `records`: magic, format, header, records, checksum.
pub fn snapshot_file(header: &SnapshotHeader, records: &[SnapshotRecord]) -> Vec<u8> {
    let mut out = SNAPSHOT_MAGIC.to_vec();
    out.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
    put_text(&mut out, header.selection.as_bytes());
    put_text(&mut out, header.resource_version.as_bytes());
    put_text(&mut out, header.protobuf.as_bytes());
    out.extend_from_slice(&(records.len() as u64).to_le_bytes());
    for record in records {
        out.push(record.tag);
        put_text(&mut out, record.key.as_bytes());
        put_text(&mut out, record.version.as_bytes());
        let count = u32::try_from(record.labels.len()).expect("under 2^32 labels");
        out.extend_from_slice(&count.to_le_bytes());
        for (key, value) in &record.labels {
            put_text(&mut out, key.as_bytes());
            put_text(&mut out, value.as_bytes());
        }
        put_text(&mut out, &record.bytes);
    }
    with_checksum(out)
}

/// `body` followed by its CRC-32, as a snapshot ends.
pub fn with_checksum(mut body: Vec<u8>) -> Vec<u8> {
    let checksum = crc32fast::hash(&body);
    body.extend_from_slice(&checksum.to_le_bytes());
    body
}

/// The header of the snapshot `file`, when it has a whole one, read as the format says.
pub fn snapshot_header(file: &[u8]) -> Option<SnapshotHeader> {
    let rest = file.strip_prefix(SNAPSHOT_MAGIC)?;
    let (format, mut rest) = rest.split_first_chunk::<4>()?;
    if u32::from_le_bytes(*format) != SNAPSHOT_FORMAT {
        return None;
    }
    let mut text = || -> Option<String> {
        let (len, after) = rest.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        let (bytes, after) = (after.get(..len)?, after.get(len..)?);
        rest = after;
        String::from_utf8(bytes.to_vec()).ok()
    };
    Some(SnapshotHeader {
        selection: text()?,
        resource_version: text()?,
        protobuf: text()?,
    })
}

/// A watch stream's item as text, to compare the items of two reads of one body.
pub fn describe_watch_item<K: serde::Serialize>(
    item: &Result<kube_informer::list_watch::WatchEvent<K>, kube_informer::Error>,
) -> String {
    use kube_informer::list_watch::WatchEvent;
    match item {
        Ok(WatchEvent::Added(object)) => format!("added {}", json(object)),
        Ok(WatchEvent::Modified(object)) => format!("modified {}", json(object)),
        Ok(WatchEvent::Deleted(object)) => format!("deleted {}", json(object)),
        Ok(WatchEvent::Bookmark {
            resource_version,
            initial_events_end,
        }) => format!("bookmark {resource_version:?} {initial_events_end}"),
        Ok(WatchEvent::Error(status)) => format!("error {}", json(status)),
        Ok(WatchEvent::Decoded {
            change,
            object,
            raw,
        }) => format!("{change:?} {} from {:?}", json(object), raw.as_bytes()),
        Ok(WatchEvent::Undecodable { change, object }) => {
            format!("{change:?} undecodable {object:?}")
        }
        Err(error) => format!("failed: {error}"),
    }
}

/// `value` as JSON text.
pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("a decoded value writes as JSON")
}
