//! Objects' bytes gathered into batches that are decoded off the task reading the body, on
//! tokio's blocking pool, so that a large list or a streaming list's initial events decode
//! on every core while the body keeps arriving. Both [list bodies](super::list_body) and
//! [watch bodies](super::watch_body) batch this way.

use std::{future::Future, ops::Range, pin::Pin};

/// Items per batch: enough to amortise a hand-off to the blocking pool over many objects'
/// decoding, few enough that the objects in flight stay small (larger batches raised the
/// decoding threads' peak heap in the benchmarks).
pub(super) const BATCH_ITEMS: usize = 32;

/// A batch this small is decoded inline: the hand-off would cost more than it saves.
const SMALLEST_HANDED_OFF: usize = BATCH_ITEMS / 4;

/// The items of a body decoded inline before any batch is handed off: a small list never
/// reaches the blocking pool. Objects decoded on a pool thread live on in that thread's
/// allocator arena, so a process whose many small lists went there (a fleet's clusters)
/// had each pool thread's arena keep pages alive for a few objects: 0.75 MiB more RSS per
/// cluster over 3 clusters, measured. A large list still decodes on every core after these.
pub(super) const INLINE_FIRST_ITEMS: usize = 256;

/// The most bytes one object (a list item, a JSON watch event) may take before it is
/// refused rather than buffered further. etcd refuses writes over 1.5 MiB by default, and an
/// object read back as JSON grows by its field names, escapes and the base64 of its bytes,
/// a few times over at worst; 64 MiB leaves a margin of ten past that, as protobuf watch
/// frames have. More than this without an object's end is a server that lies or a body
/// that is no list (a file, an endless line), and buffering it would take the process's
/// memory.
pub(super) const MAX_OBJECT_BYTES: usize = 64 << 20;

/// Why a body was refused: more than [`MAX_OBJECT_BYTES`] arrived without completing an
/// object.
pub(super) fn too_large(what: &str) -> String {
    format!(
        "{what} larger than {} MiB ({MAX_OBJECT_BYTES} bytes arrived without its end); \
         refused rather than buffered",
        MAX_OBJECT_BYTES >> 20
    )
}

/// The bytes of consecutive items, back to back.
#[derive(Default)]
pub(super) struct Batch {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Batch {
    pub(super) fn push(&mut self, item: &[u8]) {
        self.bytes.extend_from_slice(item);
        self.ends.push(self.bytes.len());
    }

    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The bytes, and each item's range in them.
    pub(super) fn into_items(self) -> (Vec<u8>, impl Iterator<Item = Range<usize>>) {
        let mut start = 0;
        let ranges = self.ends.into_iter().map(move |end| {
            let range = start..end;
            start = end;
            range
        });
        (self.bytes, ranges)
    }
}

/// A batch being decoded.
pub(super) type Decoding<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// How many batches decode at once: the cores there are, when this runs on a tokio runtime
/// (whose blocking pool decodes them); 1 otherwise, and then every batch decodes inline.
pub(super) fn parallelism() -> usize {
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::available_parallelism().map_or(1, usize::from)
    } else {
        1
    }
}

/// Whether a batch of `items`, after `dispatched` items of its body, decodes on the blocking
/// pool (see [`dispatch`]) rather than on the task reading the body.
pub(super) fn is_handed_off(parallelism: usize, dispatched: usize, items: usize) -> bool {
    parallelism > 1 && dispatched >= INLINE_FIRST_ITEMS && items >= SMALLEST_HANDED_OFF
}

/// Decodes `batch` with `decode`: on the blocking pool when `parallelism` allows, the
/// body has passed its first [`INLINE_FIRST_ITEMS`] (`dispatched` items before this batch)
/// and the batch is worth the hand-off, else now. `lost` is the output for a decoding
/// thread that panicked.
pub(super) fn dispatch<T: Send + 'static>(
    batch: Batch,
    parallelism: usize,
    dispatched: usize,
    decode: impl FnOnce(Batch) -> T + Send + 'static,
    lost: impl FnOnce(String) -> T + Send + 'static,
) -> Decoding<T> {
    if is_handed_off(parallelism, dispatched, batch.len()) {
        let task = tokio::task::spawn_blocking(move || decode(batch));
        Box::pin(async move {
            match task.await {
                Ok(decoded) => decoded,
                Err(error) => lost(error.to_string()),
            }
        })
    } else {
        Box::pin(std::future::ready(decode(batch)))
    }
}
