//! Warm restarts: an informer's cache written to a file, and read back at start so that its
//! watch resumes where it stopped instead of listing everything again. The full
//! documentation is on [`WarmRestart`].

use std::{
    fmt, fs,
    io::{self, Write},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use kube_core::Resource;
use serde::{Serialize, de::DeserializeOwned};
use tracing::debug;

use crate::{
    error::BoxError,
    key::ObjectKey,
    list_watch::{FieldSetMemo, ProtobufResource, RawFormat, RawObject},
    store::{EncodedObject, Kept, LabelRun, LabelText, WireDecoder, decode_wire},
};

/// Where an informer keeps a snapshot of its cache, and how often it writes it
/// ([`InformerBuilder::warm_restart`](crate::informer::InformerBuilder::warm_restart)).
///
/// The snapshot holds the objects as the cache keeps them (the bytes the server sent, where
/// it kept those) with each one's key, resourceVersion and labels beside its bytes, the
/// resourceVersion they are the state at, and what they were listed with: the library's
/// version, the type, the resource, the namespace, the selectors and the shard. It is written
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
/// replayed so far.
///
/// How the objects are read back depends on what needs them. A compact cache (the
/// default) with no index of its own, whose handlers all take keys
/// ([`add_key_handler`](crate::InformerHandle::add_key_handler), a controller's primary
/// source), takes each one as it is kept, decoding none: the handlers
/// get keys, and a read decodes the object, as it decodes any object of a compact cache.
/// Otherwise (a decoded cache, an index function, a handler that needs each object) the
/// objects are decoded on every core a part at a time. Either way they are stored as they
/// come.
///
/// [`ListWatch::cached_version`]: crate::list_watch::ListWatch::cached_version
///
/// It lists from scratch instead, replacing the snapshot's objects atomically as any
/// relist does, when the snapshot is missing, unreadable, corrupt (its checksum), of
/// another format version, or of another selection (library version, type, resource,
/// namespace, selectors, shard); and when the resumed watch ends before its bookmark: 410 Gone (the server's
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

/// The layout this library writes and reads. 2: each object's key, resourceVersion and
/// labels beside its bytes, so that a compact store takes it without decoding it.
const FORMAT_VERSION: u32 = 2;

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

#[cfg(feature = "fuzzing")]
impl From<&SnapshotError> for crate::fuzzing::SnapshotRefusal {
    fn from(error: &SnapshotError) -> Self {
        match error {
            SnapshotError::Missing(_) => Self::Missing,
            SnapshotError::Io { .. } => Self::Io,
            SnapshotError::Foreign(_) => Self::Foreign,
            SnapshotError::FormatVersion { .. } => Self::FormatVersion,
            SnapshotError::OtherSelection { .. } => Self::OtherSelection,
            SnapshotError::Checksum => Self::Checksum,
            SnapshotError::Truncated => Self::Truncated,
            SnapshotError::Undecodable { index, .. } => Self::Undecodable(*index),
        }
    }
}

/// One object of a warm restart's snapshot, as a restore hands it to a
/// [`ReflectorStore`](super::ReflectorStore): its key, and the bytes the store kept it as
/// with its resourceVersion and labels beside them. It comes decoded when the store said
/// it needs objects ([`ReflectorStore::restores_encoded`](super::ReflectorStore::restores_encoded)
/// false), decoded on every core; a compact store takes it as it is, decoding nothing.
pub struct RestoredObject<K> {
    pub(crate) encoded: EncodedObject,
    pub(crate) object: Option<Arc<K>>,
    /// Decodes the bytes as `K` (taken where `K`'s serde bounds are known).
    pub(crate) decode: WireDecoder<K>,
}

impl<K> RestoredObject<K> {
    /// The object's key.
    pub fn key(&self) -> &ObjectKey {
        &self.encoded.key
    }

    /// The object's resourceVersion, read without decoding it.
    pub fn resource_version(&self) -> Option<&str> {
        self.encoded.version.as_deref()
    }
}

impl<K> RestoredObject<K> {
    /// The key, the object (decoded now if it was not yet) and the bytes it decodes from.
    ///
    /// # Errors
    ///
    /// The decoder's, when the bytes do not decode as `K`.
    pub fn into_decoded(self) -> Result<(ObjectKey, Arc<K>, RawObject), BoxError> {
        let EncodedObject {
            key, format, bytes, ..
        } = self.encoded;
        let object = match self.object {
            Some(object) => object,
            None => Arc::new((self.decode)(format, &bytes, &FieldSetMemo::default())?),
        };
        Ok((
            key,
            object,
            RawObject::new(Bytes::from_owner(bytes), format),
        ))
    }
}

impl<K> fmt::Debug for RestoredObject<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RestoredObject")
            .field("key", &self.encoded.key)
            .field("resource_version", &self.encoded.version)
            .field("decoded", &self.object.is_some())
            .finish_non_exhaustive()
    }
}

/// Objects per part handed on: a restore holds a few parts at a time, not every object of
/// the snapshot.
const PART: usize = 1024;

/// The selection a snapshot is of: the library's version, the type, the resource, the
/// namespace, the selectors and the shard, one per line.
pub(crate) fn selection<K>(
    resource: &str,
    namespace: Option<&str>,
    selectors: &str,
    shard: &str,
) -> String {
    // The library's version too: another one may decode the same bytes differently, and
    // a restore stores the objects without decoding them.
    format!(
        "library {}\ntype {}\nresource {resource}\nnamespace {}\nselectors {selectors}\nshard {shard}",
        env!("CARGO_PKG_VERSION"),
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
pub(crate) fn write<K: Resource + Serialize>(
    path: &Path,
    selection: &str,
    resource_version: &str,
    objects: &[(ObjectKey, Kept<K>)],
) -> io::Result<usize> {
    let protobuf_kind = objects.iter().find_map(|(_, kept)| match kept {
        Kept::Wire {
            format: RawFormat::Protobuf { resource, .. },
            ..
        } => Some(*resource),
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
    for (key, kept) in objects {
        match kept {
            Kept::Wire {
                format,
                bytes,
                version,
                labels,
            } => {
                let tag = match format {
                    RawFormat::Protobuf { resource, typed } => {
                        if protobuf_kind.is_none_or(|first| !std::ptr::eq(first, *resource)) {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                "objects of two protobuf kinds in one cache",
                            ));
                        }
                        if *typed { PROTOBUF_TYPED } else { PROTOBUF }
                    }
                    RawFormat::Json => JSON,
                };
                put_record(
                    &mut out,
                    tag,
                    key,
                    version.as_deref(),
                    labels.pairs(),
                    bytes,
                )?;
            }
            Kept::Object(object) => put_object(&mut out, key, &**object)?,
            Kept::Encoded(codec, bytes) => {
                // An object left out would be missing after the restore, and the resumed
                // watch would never bring it back: no snapshot rather than a wrong one.
                let object = codec.decode(bytes).map_err(io::Error::other)?;
                put_object(&mut out, key, &object)?;
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

/// One record: how its bytes decode, the object's key, resourceVersion and labels, and
/// its bytes.
fn put_record<'a>(
    out: &mut impl Write,
    tag: u8,
    key: &ObjectKey,
    version: Option<&str>,
    labels: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    bytes: &[u8],
) -> io::Result<()> {
    out.write_all(&[tag])?;
    put_bytes(out, key.as_str().as_bytes())?;
    put_bytes(out, version.unwrap_or_default().as_bytes())?;
    let count = u32::try_from(labels.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "too many labels"))?;
    out.write_all(&count.to_le_bytes())?;
    for (key, value) in labels {
        put_bytes(out, key.as_bytes())?;
        put_bytes(out, value.as_bytes())?;
    }
    put_bytes(out, bytes)
}

/// The record of an object the store kept decoded, or in its own codec's encoding: its
/// JSON, which decodes as the server's JSON does.
fn put_object<K: Resource + Serialize>(
    out: &mut impl Write,
    key: &ObjectKey,
    object: &K,
) -> io::Result<()> {
    let meta = object.meta();
    let labels: Vec<_> = (meta.labels.iter().flatten())
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let bytes = serde_json::to_vec(object)?;
    let version = meta.resource_version.as_deref();
    put_record(out, JSON, key, version, labels.into_iter(), &bytes)
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

/// A snapshot's fields read in order, each checked against what is left of it.
struct Fields<R> {
    inner: R,
    /// The bytes left before the checksum.
    left: u64,
    path: PathBuf,
    /// Where a record's labels are read before they are checked as text.
    scratch: Vec<u8>,
}

impl<R: io::Read> Fields<R> {
    fn io(&self, source: io::Error) -> SnapshotError {
        match source.kind() {
            io::ErrorKind::UnexpectedEof => SnapshotError::Truncated,
            _ => SnapshotError::Io {
                path: self.path.clone(),
                source,
            },
        }
    }

    /// Fills `buf`, which must fit in what is left.
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), SnapshotError> {
        self.left = self
            .left
            .checked_sub(buf.len() as u64)
            .ok_or(SnapshotError::Truncated)?;
        self.inner.read_exact(buf).map_err(|error| self.io(error))
    }

    fn u8(&mut self) -> Result<u8, SnapshotError> {
        let mut byte = [0];
        self.fill(&mut byte)?;
        Ok(byte[0])
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        let mut word = [0; 4];
        self.fill(&mut word)?;
        Ok(u32::from_le_bytes(word))
    }

    fn u64(&mut self) -> Result<u64, SnapshotError> {
        let mut word = [0; 8];
        self.fill(&mut word)?;
        Ok(u64::from_le_bytes(word))
    }

    /// The length of the field that follows, if it fits in what is left.
    fn len(&mut self) -> Result<usize, SnapshotError> {
        let len = self.u32()?;
        if u64::from(len) > self.left {
            return Err(SnapshotError::Truncated);
        }
        Ok(len as usize)
    }

    fn text(&mut self) -> Result<String, SnapshotError> {
        let mut bytes = vec![0; self.len()?];
        self.fill(&mut bytes)?;
        String::from_utf8(bytes).map_err(|error| SnapshotError::Undecodable {
            index: 0,
            reason: format!("a text field is not UTF-8: {error}"),
        })
    }

    /// Reads a text field into the scratch buffer at `at`; returns where it ends.
    fn scratch_text(&mut self, at: usize) -> Result<usize, SnapshotError> {
        let end = at + self.len()?;
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(end, 0);
        let filled = self.fill(&mut scratch[at..end]);
        self.scratch = scratch;
        filled.map(|()| end)
    }

    /// An object's bytes, read into the allocation the store keeps them in.
    fn object(&mut self) -> Result<Arc<[u8]>, SnapshotError> {
        let mut bytes: Arc<[u8]> = std::iter::repeat_n(0, self.len()?).collect();
        match Arc::get_mut(&mut bytes) {
            Some(buf) => self.fill(buf)?,
            // A new `Arc` has no other owner: this is never taken.
            None => return Err(SnapshotError::Truncated),
        }
        Ok(bytes)
    }

    /// One record: how its bytes decode, the object's key, resourceVersion and labels
    /// (added to `labels`), and its bytes.
    fn record(
        &mut self,
        index: usize,
        protobuf: Option<&'static ProtobufResource>,
        labels: &mut LabelText,
    ) -> Result<Record, SnapshotError> {
        let undecodable = |reason: String| SnapshotError::Undecodable { index, reason };
        let format = match (self.u8()?, protobuf) {
            (JSON, _) => RawFormat::Json,
            (PROTOBUF, Some(resource)) => RawFormat::Protobuf {
                resource,
                typed: false,
            },
            (PROTOBUF_TYPED, Some(resource)) => RawFormat::Protobuf {
                resource,
                typed: true,
            },
            (tag, _) => return Err(undecodable(format!("unknown encoding {tag}"))),
        };
        let key = ObjectKey::from(self.text()?);
        let version = Some(self.text()?).filter(|v| !v.is_empty()).map(Arc::from);
        let first_label = labels.len();
        for _ in 0..self.u32()? {
            let key_at = self.scratch_text(0)?;
            let value_at = self.scratch_text(key_at)?;
            let text = std::str::from_utf8(&self.scratch[..value_at])
                .map_err(|error| undecodable(format!("a label is not UTF-8: {error}")))?;
            let (key, value) = text.split_at(key_at);
            labels.push(key, value);
        }
        Ok(Record {
            key,
            format,
            bytes: self.object()?,
            version,
            labels: first_label..labels.len(),
        })
    }
}

/// A record read, its labels a run of the group's [`LabelText`].
struct Record {
    key: ObjectKey,
    format: RawFormat,
    bytes: Arc<[u8]>,
    version: Option<Arc<str>>,
    labels: std::ops::Range<usize>,
}

/// Opens the snapshot at `path` and checks it is one in this format, whole (its checksum):
/// the file, and its length without the checksum.
fn open_checked(path: &Path) -> Result<(fs::File, u64), SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = match fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err(SnapshotError::Missing(path.to_owned()));
        }
        Err(source) => return Err(io(source)),
    };
    let len = file.metadata().map_err(io)?.len();
    let mut head = [0; MAGIC.len() + 4];
    if len < head.len() as u64 + 4 {
        return Err(SnapshotError::Foreign(path.to_owned()));
    }
    let body = len - 4;
    // Read through once for the checksum, a buffer at a time: the objects are read again
    // straight into the allocations the store keeps them in.
    let mut reader = io::BufReader::with_capacity(1 << 20, &mut file);
    io::Read::read_exact(&mut reader, &mut head).map_err(io)?;
    if !head.starts_with(MAGIC) {
        return Err(SnapshotError::Foreign(path.to_owned()));
    }
    let found = u32::from_le_bytes([head[24], head[25], head[26], head[27]]);
    if found != FORMAT_VERSION {
        return Err(SnapshotError::FormatVersion { found });
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head);
    let mut rest = io::Read::take(&mut reader, body - head.len() as u64);
    let summed = io::copy(&mut rest, &mut CrcSink(&mut crc)).map_err(io)?;
    let mut checksum = [0; 4];
    io::Read::read_exact(&mut reader, &mut checksum).map_err(io)?;
    if summed != body - head.len() as u64 || crc.finalize() != u32::from_le_bytes(checksum) {
        return Err(SnapshotError::Checksum);
    }
    drop(reader);
    io::Seek::seek(&mut file, io::SeekFrom::Start(head.len() as u64)).map_err(io)?;
    Ok((file, body - head.len() as u64))
}

/// Where the checksum pass writes.
struct CrcSink<'a>(&'a mut crc32fast::Hasher);

impl Write for CrcSink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads the snapshot at `path`, if it is one of `selection` in this format, and hands its
/// objects to `deliver` a part at a time (until it returns false), decoded on every core
/// if `decode`. Returns the resourceVersion they are the state at. The whole file is
/// checked (format, selection, checksum) before any object is handed on.
///
/// # Errors
///
/// [`SnapshotError`]: why it cannot be used.
pub(crate) fn read<K: Resource + DeserializeOwned + Send + Sync>(
    path: &Path,
    selection: &str,
    decode: bool,
    deliver: &mut dyn FnMut(Vec<RestoredObject<K>>) -> bool,
) -> Result<String, SnapshotError> {
    let started = std::time::Instant::now();
    let (file, left) = open_checked(path)?;
    let checked_ms = started.elapsed().as_millis() as u64;
    let mut fields = Fields {
        inner: io::BufReader::with_capacity(1 << 20, file),
        left,
        path: path.to_owned(),
        scratch: Vec::new(),
    };
    let found = fields.text()?;
    if found != selection {
        return Err(SnapshotError::OtherSelection {
            found,
            expected: selection.to_owned(),
        });
    }
    let resource_version = fields.text()?;
    let protobuf = fields.text()?;
    let protobuf = {
        let mut parts = protobuf.splitn(3, '/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(group), Some(version), Some(plural)) => {
                ProtobufResource::find(group, version, plural)
            }
            _ => None,
        }
    };
    let count = fields.u64()?;
    debug!(objects = count, checked_ms, "snapshot checked");
    // Read in order on this thread, a group of parts at a time; decoded, when asked, a part
    // per core.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let memo = FieldSetMemo::default();
    let mut index = 0usize;
    while (index as u64) < count {
        let group = (count - index as u64).min((PART * threads) as u64) as usize;
        let mut labels = LabelText::default();
        let mut read = Vec::with_capacity(group);
        for at in index..index + group {
            read.push(fields.record(at, protobuf, &mut labels)?);
        }
        // Bytes after the last record: the count is not the file's. Refused before the
        // last part is decoded or handed on, whether or not the store decodes.
        if index as u64 + group as u64 == count && fields.left != 0 {
            return Err(SnapshotError::Truncated);
        }
        let labels = Arc::new(labels);
        let records: Vec<EncodedObject> = read
            .into_iter()
            .map(|record| EncodedObject {
                key: record.key,
                format: record.format,
                bytes: record.bytes,
                version: record.version,
                labels: LabelRun::new(labels.clone(), record.labels),
            })
            .collect();
        let first = index;
        index += group;
        let parts: Vec<Result<Vec<RestoredObject<K>>, SnapshotError>> = match decode {
            false => into_parts(records)
                .into_iter()
                .map(|part| {
                    Ok(part
                        .into_iter()
                        .map(|encoded| RestoredObject {
                            encoded,
                            object: None,
                            decode: decode_wire::<K>,
                        })
                        .collect())
                })
                .collect(),
            true => decode_parts(records, first, &memo),
        };
        for part in parts {
            if !deliver(part?) {
                return Ok(resource_version);
            }
        }
    }
    if fields.left != 0 {
        return Err(SnapshotError::Truncated);
    }
    Ok(resource_version)
}

/// `items` in parts of [`PART`], in order.
fn into_parts<T>(items: Vec<T>) -> Vec<Vec<T>> {
    let mut parts = Vec::with_capacity(items.len().div_ceil(PART));
    let mut items = items.into_iter();
    loop {
        let part: Vec<T> = items.by_ref().take(PART).collect();
        if part.is_empty() {
            return parts;
        }
        parts.push(part);
    }
}

/// `records` decoded a part per thread, in order; `first` is the index of the first.
fn decode_parts<K: Resource + DeserializeOwned + Send + Sync>(
    records: Vec<EncodedObject>,
    first: usize,
    memo: &FieldSetMemo,
) -> Vec<Result<Vec<RestoredObject<K>>, SnapshotError>> {
    std::thread::scope(|scope| {
        let workers: Vec<_> = into_parts(records)
            .into_iter()
            .enumerate()
            .map(|(at, part)| {
                let start = first + at * PART;
                scope.spawn(move || {
                    part.into_iter()
                        .enumerate()
                        .map(|(offset, encoded)| {
                            let object = encoded
                                .format
                                .decode_sharing::<K>(&encoded.bytes, memo)
                                .map_err(|error| SnapshotError::Undecodable {
                                index: start + offset,
                                reason: error.to_string(),
                            })?;
                            Ok(RestoredObject {
                                encoded,
                                object: Some(Arc::new(object)),
                                decode: decode_wire::<K>,
                            })
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
                        index: first,
                        reason: "its decoder panicked".to_owned(),
                    })
                })
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_core::ObjectMeta;

    use super::*;

    fn cm(name: &str, version: &str, labels: &[(&str, &str)]) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                resource_version: Some(version.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    /// Every object of the snapshot at `path`, read with `decode`.
    fn read_all(path: &Path, decode: bool) -> Vec<RestoredObject<ConfigMap>> {
        let mut objects = Vec::new();
        read::<ConfigMap>(path, "selection", decode, &mut |part| {
            objects.extend(part);
            true
        })
        .unwrap();
        objects
    }

    #[test]
    fn a_snapshot_reads_back_each_object_s_key_version_and_labels_without_decoding_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot");
        let objects = [
            cm("a", "7", &[("app", "web"), ("tier", "front")]),
            cm("b", "9", &[]),
        ];
        let kept: Vec<_> = objects
            .iter()
            .map(|o| {
                (
                    ObjectKey::from_object(&**o).unwrap(),
                    Kept::Object(o.clone()),
                )
            })
            .collect();
        write(&path, "selection", "10", &kept).unwrap();

        let restored = read_all(&path, false);
        assert_eq!(restored.len(), 2);
        for (restored, object) in restored.into_iter().zip(&objects) {
            assert!(restored.object.is_none(), "not decoded");
            assert_eq!(restored.key(), &ObjectKey::from_object(&**object).unwrap());
            assert_eq!(
                restored.resource_version(),
                object.metadata.resource_version.as_deref()
            );
            let labels: BTreeMap<String, String> = (restored.encoded.labels.pairs())
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            assert_eq!(Some(&labels), object.metadata.labels.as_ref());
            let (_, decoded, _) = restored.into_decoded().unwrap();
            assert_eq!(decoded, *object, "decoded on demand");
        }
        let restored = read_all(&path, true);
        assert!(
            restored
                .iter()
                .zip(&objects)
                .all(|(r, o)| r.object.as_ref() == Some(o)),
            "decoded as they are read when asked"
        );
        let other = read::<ConfigMap>(&path, "another", false, &mut |_| true);
        assert!(matches!(other, Err(SnapshotError::OtherSelection { .. })));
    }

    #[test]
    fn a_snapshot_cut_short_foreign_or_of_another_format_is_refused_before_any_object() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot");
        let kept = vec![(
            ObjectKey::new(Some("ns"), "a"),
            Kept::Object(cm("a", "1", &[])),
        )];
        write(&path, "selection", "1", &kept).unwrap();
        let whole = fs::read(&path).unwrap();
        let refused = |bytes: &[u8]| {
            fs::write(&path, bytes).unwrap();
            let mut delivered = 0;
            let result = read::<ConfigMap>(&path, "selection", false, &mut |part| {
                delivered += part.len();
                true
            });
            assert_eq!(delivered, 0, "nothing handed on");
            result.unwrap_err()
        };
        assert!(matches!(
            refused(&whole[..whole.len() - 10]),
            SnapshotError::Checksum
        ));
        assert!(matches!(
            refused(b"{\"kind\": \"Pod\"}"),
            SnapshotError::Foreign(_)
        ));
        let mut older = whole.clone();
        older[MAGIC.len()..MAGIC.len() + 4].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(
            refused(&older),
            SnapshotError::FormatVersion { found: 1 }
        ));
        fs::remove_file(&path).unwrap();
        assert!(matches!(refused_missing(&path), SnapshotError::Missing(_)));
    }

    #[test]
    fn a_snapshot_with_bytes_after_its_last_record_is_refused_before_any_object() {
        // Found by the `snapshot_read` fuzz target: bytes left after the records the count
        // names were refused only once every object had been handed on, or, by a store
        // that decodes, as the first object that did not decode.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot");
        let kept: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|name| {
                (
                    ObjectKey::new(Some("ns"), name),
                    Kept::Object(cm(name, "1", &[])),
                )
            })
            .collect();
        write(&path, "selection", "1", &kept).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        let count_at = MAGIC.len() + 4 + (4 + "selection".len()) + (4 + "1".len()) + 4;
        bytes[count_at..count_at + 8].copy_from_slice(&1u64.to_le_bytes());
        let body = bytes.len() - 4;
        let checksum = crc32fast::hash(&bytes[..body]);
        bytes[body..].copy_from_slice(&checksum.to_le_bytes());
        fs::write(&path, &bytes).unwrap();
        for decode in [false, true] {
            let mut delivered = 0;
            let result = read::<ConfigMap>(&path, "selection", decode, &mut |part| {
                delivered += part.len();
                true
            });
            assert!(
                matches!(result, Err(SnapshotError::Truncated)),
                "decode {decode}: {result:?}"
            );
            assert_eq!(delivered, 0, "decode {decode}: nothing handed on");
        }
    }

    fn refused_missing(path: &Path) -> SnapshotError {
        read::<ConfigMap>(path, "selection", false, &mut |_| true).unwrap_err()
    }
}
