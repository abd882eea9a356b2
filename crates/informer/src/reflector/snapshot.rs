//! Warm restarts: an informer's cache written to a file, and read back at start so that its
//! watch resumes where it stopped instead of listing everything again. The full
//! documentation is on [`WarmRestart`].

use std::{
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use kube_core::Resource;
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    key::ObjectKey,
    list_watch::{FieldSetMemo, ProtobufResource, RawFormat, RawObject},
    store::Kept,
};

/// Where an informer keeps a snapshot of its cache, and how often it writes it
/// ([`InformerBuilder::warm_restart`](crate::InformerBuilder::warm_restart)).
///
/// The snapshot holds the objects as the cache keeps them (the bytes the server sent, where
/// it kept those), the resourceVersion they are the state at, and what they were listed
/// with: the type, the resource, the namespace, the selectors and the shard. It is written
/// when the informer stops, and every [`every`](Self::every) while it runs, to a file
/// beside `path` that then replaces it, so a crash never leaves half a snapshot. The file
/// is readable by its owner only: it holds the objects as the server sent them (a Secret
/// informer's snapshot holds the Secrets), so keep it where the controller's own
/// credentials are kept, not on shared storage.
///
/// At start, the informer reads it back: every object reaches the handlers once, as an
/// add of the initial list, and the watch resumes from the snapshot's resourceVersion. The
/// informer says it has synced only once that watch has caught up with the server: once it
/// has seen the version the API server's cache is at (read when the watch opens, by a list
/// that selects no object: [`ListWatch::cached_version`]), which is the freshness a cold
/// start's first list has; or at the watch's first bookmark, which the server's watch
/// cache sends within about two seconds (the resumed watch asks for a three-second
/// timeout, and the server bookmarks two seconds before it) when that version belongs to
/// objects this informer does not see. Until then, reads see the snapshot plus the changes
/// replayed so far. The objects are decoded on every core a part at a time, and stored as
/// they come.
///
/// [`ListWatch::cached_version`]: crate::list_watch::ListWatch::cached_version
///
/// It lists from scratch instead, replacing the snapshot's objects atomically as any
/// relist does, when the snapshot is missing, unreadable, corrupt (its checksum), of
/// another format version, or of another selection (type, resource, namespace, selectors,
/// shard); and when the resumed watch ends before its bookmark: 410 Gone (the server's
/// history no longer reaches the snapshot's version, after a compaction or a long
/// downtime), an API server without a watch cache (which sends no bookmarks), or any error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmRestart {
    path: PathBuf,
    interval: Option<Duration>,
}

impl WarmRestart {
    /// Snapshots at `path`, written when the informer stops.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            interval: None,
        }
    }

    /// Also written every `interval` while the informer runs and is synced, so that a
    /// crash loses at most that much (the watch replays the rest).
    #[must_use]
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// Where the snapshot is kept.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How often it is written while the informer runs, if at all.
    pub fn interval(&self) -> Option<Duration> {
        self.interval
    }
}

/// The first bytes of every snapshot.
const MAGIC: &[u8; 24] = b"kube-informer snapshot\n\0";

/// The layout this library writes and reads.
const FORMAT_VERSION: u32 = 1;

/// How a record's bytes decode.
const JSON: u8 = 0;
const PROTOBUF: u8 = 1;
const PROTOBUF_TYPED: u8 = 2;

/// Why a snapshot was not used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SnapshotError {
    /// There is none yet.
    #[error("no snapshot at {0}")]
    Missing(PathBuf),
    /// It could not be read.
    #[error("reading the snapshot {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// It is not a snapshot.
    #[error("{0} is not a snapshot of an informer's cache")]
    Foreign(PathBuf),
    /// Another version of the library wrote it.
    #[error("the snapshot is of format {found}; this version reads format {FORMAT_VERSION}")]
    FormatVersion { found: u32 },
    /// It is of other objects.
    #[error("the snapshot is of {found:?}; this informer lists {expected:?}")]
    OtherSelection { found: String, expected: String },
    /// Its checksum does not match.
    #[error("the snapshot is corrupt: its checksum does not match")]
    Checksum,
    /// It ends early.
    #[error("the snapshot is corrupt: it ends early")]
    Truncated,
    /// A record does not decode.
    #[error("the snapshot's object {index} does not decode: {reason}")]
    Undecodable { index: usize, reason: String },
}

/// One object read back: its key, the object, and the bytes it decoded from.
pub(crate) type Restored<K> = (ObjectKey, Arc<K>, Option<RawObject>);

/// Objects decoded per part handed on: a restore holds a few parts decoded at a time, not
/// every object of the snapshot.
const PART: usize = 1024;

/// The selection a snapshot is of: the type, the resource, the namespace, the selectors and
/// the shard, one per line.
pub(crate) fn selection<K>(
    resource: &str,
    namespace: Option<&str>,
    selectors: &str,
    shard: &str,
) -> String {
    format!(
        "type {}\nresource {resource}\nnamespace {}\nselectors {selectors}\nshard {shard}",
        std::any::type_name::<K>(),
        namespace.unwrap_or("")
    )
}

/// A writer that keeps the CRC-32 of what went through it, and its length.
struct Summing<W> {
    inner: W,
    crc: crc32fast::Hasher,
    written: usize,
}

impl<W: Write> Write for Summing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.written += n;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn put_bytes(out: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    let len = u32::try_from(bytes.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "an object of 4 GiB or more"))?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(bytes)
}

/// Writes the snapshot of `objects` at `resource_version` to `path`, through a temporary
/// file renamed over it, streamed (the objects' bytes are not copied into one buffer).
/// Returns the bytes written.
///
/// # Errors
///
/// The file system's; an object kept decoded that does not encode, or kept by the
/// store's codec that does not decode.
pub(crate) fn write<K: Serialize>(
    path: &Path,
    selection: &str,
    resource_version: &str,
    objects: &[(ObjectKey, Kept<K>)],
) -> io::Result<usize> {
    let protobuf_kind = objects.iter().find_map(|(_, kept)| match kept {
        Kept::Wire(RawFormat::Protobuf { resource, .. }, _) => Some(*resource),
        _ => None,
    });
    let temporary = path.with_extension("partial");
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    let file = private_file(&temporary)?;
    let mut out = Summing {
        inner: io::BufWriter::with_capacity(1 << 20, file),
        crc: crc32fast::Hasher::new(),
        written: 0,
    };
    out.write_all(MAGIC)?;
    out.write_all(&FORMAT_VERSION.to_le_bytes())?;
    put_bytes(&mut out, selection.as_bytes())?;
    put_bytes(&mut out, resource_version.as_bytes())?;
    let protobuf_name = protobuf_kind.map_or(String::new(), |r| {
        format!("{}/{}/{}", r.group, r.version, r.plural)
    });
    put_bytes(&mut out, protobuf_name.as_bytes())?;
    out.write_all(&(objects.len() as u64).to_le_bytes())?;
    for (_, kept) in objects {
        match kept {
            Kept::Wire(RawFormat::Protobuf { resource, typed }, bytes) => {
                if protobuf_kind.is_none_or(|first| !std::ptr::eq(first, *resource)) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "objects of two protobuf kinds in one cache",
                    ));
                }
                out.write_all(&[if *typed { PROTOBUF_TYPED } else { PROTOBUF }])?;
                put_bytes(&mut out, bytes)?;
            }
            Kept::Wire(RawFormat::Json, bytes) => {
                out.write_all(&[JSON])?;
                put_bytes(&mut out, bytes)?;
            }
            Kept::Object(object) => {
                out.write_all(&[JSON])?;
                put_bytes(&mut out, &serde_json::to_vec(&**object)?)?;
            }
            Kept::Encoded(codec, bytes) => {
                // An object left out would be missing after the restore, and the resumed
                // watch would never bring it back: no snapshot rather than a wrong one.
                let object = codec.decode(bytes).map_err(io::Error::other)?;
                out.write_all(&[JSON])?;
                put_bytes(&mut out, &serde_json::to_vec(&object)?)?;
            }
        }
    }
    let checksum = out.crc.clone().finalize();
    let mut written = out.written;
    let mut file = out
        .inner
        .into_inner()
        .map_err(io::IntoInnerError::into_error)?;
    file.write_all(&checksum.to_le_bytes())?;
    written += 4;
    file.sync_all()?;
    fs::rename(&temporary, path)?;
    Ok(written)
}

/// One record's object, with its key and the bytes it decoded from.
fn decode_record<K: Resource + DeserializeOwned>(
    index: usize,
    format: RawFormat,
    bytes: Bytes,
    memo: &FieldSetMemo,
) -> Result<Restored<K>, SnapshotError> {
    let undecodable = |reason: String| SnapshotError::Undecodable { index, reason };
    let object: K = format
        .decode_sharing(&bytes, memo)
        .map_err(|error| undecodable(error.to_string()))?;
    let key = ObjectKey::from_object(&object).map_err(|error| undecodable(error.to_string()))?;
    Ok((key, Arc::new(object), Some(RawObject::new(bytes, format))))
}

/// A new file only its owner can read: a snapshot holds the objects as the server sent
/// them, a Secret informer's the Secrets.
fn private_file(path: &Path) -> io::Result<fs::File> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// A reader over a snapshot's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self.at.checked_add(n).ok_or(SnapshotError::Truncated)?;
        let taken = self
            .bytes
            .get(self.at..end)
            .ok_or(SnapshotError::Truncated)?;
        self.at = end;
        Ok(taken)
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn u64(&mut self) -> Result<u64, SnapshotError> {
        let mut word = [0; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }

    fn sized(&mut self) -> Result<&'a [u8], SnapshotError> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    fn text(&mut self) -> Result<String, SnapshotError> {
        Ok(String::from_utf8_lossy(self.sized()?).into_owned())
    }
}

/// Reads the snapshot at `path`, if it is one of `selection` in this format, and hands its
/// objects to `deliver` as they are decoded, a part at a time (until it returns false).
/// Returns the resourceVersion they are the state at. The whole file is checked (format,
/// selection, checksum) before any object is handed on.
///
/// # Errors
///
/// [`SnapshotError`]: why it cannot be used.
pub(crate) fn read<K: Resource + DeserializeOwned + Send + Sync>(
    path: &Path,
    selection: &str,
    deliver: &mut dyn FnMut(Vec<Restored<K>>) -> bool,
) -> Result<String, SnapshotError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err(SnapshotError::Missing(path.to_owned()));
        }
        Err(source) => {
            return Err(SnapshotError::Io {
                path: path.to_owned(),
                source,
            });
        }
    };
    if !bytes.starts_with(MAGIC) {
        return Err(SnapshotError::Foreign(path.to_owned()));
    }
    let mut cursor = Cursor {
        bytes: &bytes,
        at: MAGIC.len(),
    };
    let found = cursor.u32()?;
    if found != FORMAT_VERSION {
        return Err(SnapshotError::FormatVersion { found });
    }
    let (body, checksum) = bytes
        .split_last_chunk::<4>()
        .ok_or(SnapshotError::Truncated)?;
    if crc32fast::hash(body) != u32::from_le_bytes(*checksum) {
        return Err(SnapshotError::Checksum);
    }
    let mut cursor = Cursor {
        bytes: body,
        at: cursor.at,
    };
    let found = cursor.text()?;
    if found != selection {
        return Err(SnapshotError::OtherSelection {
            found,
            expected: selection.to_owned(),
        });
    }
    let resource_version = cursor.text()?;
    let protobuf = cursor.text()?;
    let protobuf = {
        let mut parts = protobuf.splitn(3, '/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(group), Some(version), Some(plural)) => {
                ProtobufResource::find(group, version, plural)
            }
            _ => None,
        }
    };
    let count = usize::try_from(cursor.u64()?).map_err(|_| SnapshotError::Truncated)?;
    // Where each record is, then the records decoded on every core: a restart has the
    // machine to itself, and decoding is most of its work.
    let mut records = Vec::with_capacity(count.min(body.len() / 8));
    for index in 0..count {
        let tag = cursor.take(1)?[0];
        let len = cursor.u32()? as usize;
        let start = cursor.at;
        cursor.take(len)?;
        let format = match (tag, protobuf) {
            (JSON, _) => RawFormat::Json,
            (PROTOBUF, Some(resource)) => RawFormat::Protobuf {
                resource,
                typed: false,
            },
            (PROTOBUF_TYPED, Some(resource)) => RawFormat::Protobuf {
                resource,
                typed: true,
            },
            _ => {
                return Err(SnapshotError::Undecodable {
                    index,
                    reason: format!("unknown encoding {tag}"),
                });
            }
        };
        records.push((format, start..start + len));
    }
    if cursor.at != body.len() {
        return Err(SnapshotError::Truncated);
    }
    // The objects keep slices of the file's bytes, as a compact store keeps slices of the
    // batches a list arrived in.
    let file = Bytes::from(bytes);
    let memo = FieldSetMemo::default();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (group_at, group) in records.chunks(PART * threads).enumerate() {
        let decoded: Vec<Result<Vec<Restored<K>>, SnapshotError>> = std::thread::scope(|scope| {
            let workers: Vec<_> = group
                .chunks(PART)
                .enumerate()
                .map(|(part, records)| {
                    let (file, memo) = (&file, &memo);
                    let first = group_at * PART * threads + part * PART;
                    scope.spawn(move || {
                        records
                            .iter()
                            .enumerate()
                            .map(|(at, (format, range))| {
                                let bytes = file.slice(range.clone());
                                decode_record::<K>(first + at, *format, bytes, memo)
                            })
                            .collect()
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|worker| {
                    worker.join().unwrap_or_else(|_| {
                        Err(SnapshotError::Undecodable {
                            index: group_at * PART * threads,
                            reason: "its decoder panicked".to_owned(),
                        })
                    })
                })
                .collect()
        });
        for part in decoded {
            if !deliver(part?) {
                return Ok(resource_version);
            }
        }
    }
    Ok(resource_version)
}
