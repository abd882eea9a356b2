//! Watch responses in protobuf: length-prefixed frames (four bytes, big-endian), each a
//! `metav1.WatchEvent` `{type = 1, object = 2}` whose object is a `RawExtension` holding
//! an enveloped object.

use std::collections::BTreeMap;

use bytes::Bytes;
use kube_core::Status;
use serde::{Deserialize, de::DeserializeOwned};

use super::{
    deserializer::from_message,
    envelope::Envelope,
    error::ProtobufError,
    schema::Resource,
    schema_table::STATUS,
    wire::{Raw, Reader, utf8},
};
use crate::list_watch::{Change, INITIAL_EVENTS_END, KeyOnly, RawFormat, RawObject, WatchEvent};

/// No watch frame may claim more than this: objects are limited to 1.5 MiB by etcd's
/// default, so a larger length is a corrupt stream, not an object to buffer.
pub(crate) const MAX_FRAME: usize = 64 << 20;

/// The room, in bytes, the decoder keeps between frames (see `feed`).
const KEPT_WHEN_IDLE: usize = 4 << 10;

/// Splits a watch body into frames as it arrives.
#[derive(Debug, Default)]
pub(crate) struct WatchFrameDecoder {
    buf: Vec<u8>,
}

impl WatchFrameDecoder {
    /// Adds `chunk`; calls `frame` with every frame it completes.
    pub(crate) fn feed<E: From<ProtobufError>>(
        &mut self,
        chunk: &[u8],
        mut frame: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        self.buf.extend_from_slice(chunk);
        let mut pos = 0;
        let result = loop {
            let rest = &self.buf[pos..];
            let Some(header) = rest.first_chunk::<4>() else {
                break Ok(());
            };
            let len = u32::from_be_bytes(*header) as usize;
            if len > MAX_FRAME {
                break Err(ProtobufError::FrameTooLarge(len).into());
            }
            if rest.len() < 4 + len {
                break Ok(());
            }
            if let Err(e) = frame(&rest[4..4 + len]) {
                break Err(e);
            }
            pos += 4 + len;
        };
        self.buf.drain(..pos);
        if self.buf.is_empty() && self.buf.capacity() > KEPT_WHEN_IDLE {
            // A streaming list's initial events grew it; a quiet watch holds it for minutes.
            self.buf = Vec::new();
        }
        result
    }

    /// Whether the body ended between frames.
    pub(crate) fn is_clean(&self) -> bool {
        self.buf.is_empty()
    }
}

#[derive(Deserialize)]
struct BookmarkObject {
    #[serde(default)]
    metadata: BookmarkMeta,
}

#[derive(Default, Deserialize)]
struct BookmarkMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// Decodes one frame into an event for `resource`.
///
/// # Errors
/// A [`ProtobufError`] when the frame is not a watch event of that resource, or its object
/// does not deserialize into `K`.
pub(crate) fn decode_event<K: DeserializeOwned>(
    frame: &[u8],
    resource: &'static Resource,
) -> Result<WatchEvent<K>, ProtobufError> {
    let mut reader = Reader::new(frame);
    let mut event_type = "";
    let mut object = &[][..];
    while !reader.is_empty() {
        let (number, wire) = reader.tag()?;
        match (number, reader.value(wire)?) {
            (1, Raw::Len(b)) => {
                event_type = utf8(b, "type")?;
            }
            (2, Raw::Len(b)) => object = raw_extension(b)?,
            _ => {}
        }
    }
    let envelope = Envelope::open(object)?;
    let meta = Some(envelope.type_meta);
    if event_type == "ERROR" {
        let status: Status = from_message(envelope.raw, STATUS, meta)?;
        return Ok(WatchEvent::Error(Box::new(status)));
    }
    // The object is what the watch asked for, version and all: its bytes are kept and
    // read again later as the resource's, so an object of another version (which the
    // server converts away) would read one way now and another then.
    if envelope.type_meta.kind != resource.kind
        || envelope.type_meta.api_version != resource.api_version()
    {
        return Err(ProtobufError::UnexpectedKind {
            expected: resource.kind,
            expected_version: resource.api_version(),
            api_version: envelope.type_meta.api_version.to_owned(),
            kind: envelope.type_meta.kind.to_owned(),
        });
    }
    let object = |change: Change| match from_message::<K>(envelope.raw, resource.item, meta) {
        Ok(object) => Ok(match change {
            // A store removes a deleted object: its bytes are of no use.
            Change::Deleted => WatchEvent::Deleted(object),
            Change::Added | Change::Modified => WatchEvent::Decoded {
                change,
                object,
                raw: RawObject::new(
                    Bytes::copy_from_slice(envelope.raw),
                    RawFormat::Protobuf {
                        resource,
                        typed: true,
                    },
                ),
            },
        }),
        // The object's key alone may still read: one bad object need not end the watch.
        Err(error) => match from_message::<KeyOnly>(envelope.raw, resource.item, meta)
            .ok()
            .and_then(|k| k.undecodable(error.to_string()))
        {
            Some(object) => Ok(WatchEvent::Undecodable { change, object }),
            None => Err(error),
        },
    };
    Ok(match event_type {
        "ADDED" => object(Change::Added)?,
        "MODIFIED" => object(Change::Modified)?,
        "DELETED" => object(Change::Deleted)?,
        "BOOKMARK" => {
            let bookmark: BookmarkObject = from_message(envelope.raw, resource.item, meta)?;
            WatchEvent::Bookmark {
                initial_events_end: bookmark
                    .metadata
                    .annotations
                    .get(INITIAL_EVENTS_END)
                    .is_some_and(|v| v == "true"),
                resource_version: bookmark.metadata.resource_version,
            }
        }
        other => {
            return Err(ProtobufError::Custom(format!(
                "unknown watch event type {other:?}"
            )));
        }
    })
}

/// `runtime.RawExtension` `{raw = 1}`.
fn raw_extension(bytes: &[u8]) -> Result<&[u8], ProtobufError> {
    let mut reader = Reader::new(bytes);
    let mut raw = &[][..];
    while !reader.is_empty() {
        let (number, wire) = reader.tag()?;
        if let (1, Raw::Len(b)) = (number, reader.value(wire)?) {
            raw = b;
        }
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::list_watch::protobuf::test_encoder::{Msg, envelope, pods};

    fn frame(event: &str, api_version: &str, kind: &str, object: &Msg) -> Vec<u8> {
        let raw = envelope(api_version, kind, object);
        let event = Msg::new().str(1, event).msg(2, &Msg::new().bytes(1, &raw));
        [(event.0.len() as u32).to_be_bytes().as_slice(), &event.0].concat()
    }

    fn meta(name: &str, rv: &str) -> Msg {
        Msg::new().str(1, name).str(6, rv)
    }

    fn events(body: &[u8], chunk: usize) -> Vec<Result<WatchEvent<Pod>, ProtobufError>> {
        let mut decoder = WatchFrameDecoder::default();
        let mut out = Vec::new();
        for piece in body.chunks(chunk) {
            decoder
                .feed(piece, |f| -> Result<(), ProtobufError> {
                    out.push(decode_event::<Pod>(f, pods()));
                    Ok(())
                })
                .unwrap();
        }
        assert!(decoder.is_clean());
        out
    }

    #[test]
    fn frames_in_any_chunking_give_the_events() {
        let bookmark_meta = meta("", "12").entry(12, INITIAL_EVENTS_END, Some(b"true"));
        let status = Msg::new()
            .str(2, "Failure")
            .str(3, "too old")
            .str(4, "Expired")
            .varint(6, 410);
        let body = [
            frame("ADDED", "v1", "Pod", &Msg::new().msg(1, &meta("a", "10"))),
            frame(
                "MODIFIED",
                "v1",
                "Pod",
                &Msg::new().msg(1, &meta("a", "11")),
            ),
            frame("BOOKMARK", "v1", "Pod", &Msg::new().msg(1, &bookmark_meta)),
            frame("DELETED", "v1", "Pod", &Msg::new().msg(1, &meta("a", "13"))),
            frame("ERROR", "v1", "Status", &status),
        ]
        .concat();
        for chunk in [1, 2, 7, body.len()] {
            let events = events(&body, chunk);
            assert_eq!(events.len(), 5);
            let rv = |e: &Result<WatchEvent<Pod>, ProtobufError>| match e {
                Ok(event) => event.object().unwrap().metadata.resource_version.clone(),
                other => panic!("{other:?}"),
            };
            assert_eq!(rv(&events[0]).as_deref(), Some("10"));
            match &events[1] {
                Ok(WatchEvent::Decoded {
                    change: Change::Modified,
                    object,
                    raw,
                }) => {
                    // The bytes kept decode to the object delivered, type included.
                    let again: Pod = raw.format().decode(raw.as_bytes()).unwrap();
                    assert_eq!(&again, object);
                    let value: serde_json::Value = raw.format().decode(raw.as_bytes()).unwrap();
                    assert_eq!(value["kind"], "Pod");
                }
                other => panic!("{other:?}"),
            }
            assert!(matches!(
                &events[2],
                Ok(WatchEvent::Bookmark { resource_version, initial_events_end: true }) if resource_version == "12"
            ));
            assert!(matches!(events[3], Ok(WatchEvent::Deleted(_))));
            match &events[4] {
                Ok(WatchEvent::Error(status)) => {
                    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn another_kind_an_unknown_type_or_a_huge_frame_is_an_error() {
        let service = frame("ADDED", "v1", "Service", &Msg::new());
        assert!(matches!(
            events(&service, 64)[0],
            Err(ProtobufError::UnexpectedKind {
                expected: "Pod",
                ..
            })
        ));
        // Found by the `watch_protobuf_frames` fuzz target: a Pod of another version read
        // as that version, while its bytes, kept, read back as a v1 Pod.
        let other_version = frame("ADDED", "v2", "Pod", &Msg::new());
        let refused = events(&other_version, 64)[0]
            .as_ref()
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert_eq!(refused, "expected v1 Pod, the server sent v2 Pod");
        let odd = frame("SURPRISE", "v1", "Pod", &Msg::new());
        assert!(matches!(events(&odd, 64)[0], Err(ProtobufError::Custom(_))));
        let mut decoder = WatchFrameDecoder::default();
        let huge = ((MAX_FRAME + 1) as u32).to_be_bytes();
        let fed = decoder.feed(&huge, |_| -> Result<(), ProtobufError> { Ok(()) });
        assert!(matches!(fed, Err(ProtobufError::FrameTooLarge(_))));
    }
}
