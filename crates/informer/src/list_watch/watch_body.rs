//! A watch response body turned into a [`WatchStream`]: protobuf frames, or JSON lines
//! should a server answer a protobuf watch in JSON after all.

use std::{collections::VecDeque, pin::Pin};

use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;

use super::{
    Change, KeyOnly, WatchEvent, WatchStream,
    protobuf::{
        error::ProtobufError,
        schema::Resource as ProtobufResource,
        watch_decoder::{WatchFrameDecoder, decode_event},
    },
};
use crate::error::{BoxError, Error, Verb};

/// How a watch body's events are delimited, as the response says.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WatchFraming {
    /// Length-prefixed protobuf frames of this resource's events.
    Protobuf(&'static ProtobufResource),
    /// One JSON event per line.
    JsonLines,
}

/// A framing with its reading state.
enum Framing {
    /// Length-prefixed protobuf frames.
    Protobuf(WatchFrameDecoder, &'static ProtobufResource),
    /// One JSON event per line; the bytes after the last newline so far.
    JsonLines(Vec<u8>),
}

struct State<B, K> {
    body: Pin<Box<B>>,
    framing: Framing,
    ready: VecDeque<Result<WatchEvent<K>, Error>>,
    resource: String,
    /// Nothing more is read: what is in `ready` is the last of the stream.
    ended: bool,
}

impl<B, K: DeserializeOwned> State<B, K> {
    fn decode_error(resource: &str, source: impl Into<BoxError>) -> Error {
        Error::Decode {
            resource: resource.to_owned(),
            verb: Verb::Watch,
            source: source.into(),
        }
    }

    /// Decodes the events `chunk` completes. An event that does not decode is an error item
    /// and the stream goes on; a broken framing is an error that ends it.
    fn feed(&mut self, chunk: &[u8]) -> Result<(), Error> {
        let (resource, ready) = (self.resource.as_str(), &mut self.ready);
        match &mut self.framing {
            Framing::Protobuf(frames, table) => frames
                .feed(chunk, |frame| -> Result<(), ProtobufError> {
                    let event = decode_event(frame, table);
                    ready.push_back(event.map_err(|e| Self::decode_error(resource, e)));
                    Ok(())
                })
                .map_err(|e| Self::decode_error(resource, e)),
            Framing::JsonLines(pending) => {
                pending.extend_from_slice(chunk);
                let mut start = 0;
                while let Some(end) = memchr::memchr(b'\n', &pending[start..]) {
                    let line = &pending[start..start + end];
                    if !line.iter().all(u8::is_ascii_whitespace) {
                        ready.push_back(
                            json_event(line).map_err(|e| Self::decode_error(resource, e)),
                        );
                    }
                    start += end + 1;
                }
                pending.drain(..start);
                Ok(())
            }
        }
    }

    /// Whether the body stopped between two events.
    fn is_clean(&self) -> bool {
        match &self.framing {
            Framing::Protobuf(frames, _) => frames.is_clean(),
            Framing::JsonLines(pending) => pending.iter().all(u8::is_ascii_whitespace),
        }
    }
}

/// One JSON watch event. An object that does not decode as `K` but whose key does is an
/// [`Undecodable`] change, so one bad object need not end the watch.
fn json_event<K: DeserializeOwned>(line: &[u8]) -> Result<WatchEvent<K>, serde_json::Error> {
    let error = match serde_json::from_slice::<kube_core::WatchEvent<K>>(line) {
        Ok(event) => return Ok(WatchEvent::from(event)),
        Err(error) => error,
    };
    #[derive(serde::Deserialize)]
    struct Keyed {
        #[serde(rename = "type")]
        event_type: String,
        object: KeyOnly,
    }
    let keyed = serde_json::from_slice::<Keyed>(line).ok();
    let change = match keyed.as_ref().map(|k| k.event_type.as_str()) {
        Some("ADDED") => Change::Added,
        Some("MODIFIED") => Change::Modified,
        Some("DELETED") => Change::Deleted,
        _ => return Err(error),
    };
    match keyed.and_then(|k| k.object.undecodable(error.to_string())) {
        Some(object) => Ok(WatchEvent::Undecodable { change, object }),
        None => Err(error),
    }
}

/// The events of a watch body, in protobuf frames or JSON lines as `framing` says.
pub(crate) fn decode_watch_body<K, B, D, E>(
    body: B,
    framing: WatchFraming,
    resource: String,
) -> WatchStream<K>
where
    K: DeserializeOwned + Send + 'static,
    B: Stream<Item = Result<D, E>> + Send + 'static,
    D: AsRef<[u8]>,
    E: std::error::Error + Send + Sync + 'static,
{
    let framing = match framing {
        WatchFraming::Protobuf(table) => Framing::Protobuf(WatchFrameDecoder::default(), table),
        WatchFraming::JsonLines => Framing::JsonLines(Vec::new()),
    };
    let state = State {
        body: Box::pin(body),
        framing,
        ready: VecDeque::new(),
        resource,
        ended: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(event) = st.ready.pop_front() {
                return Some((event, st));
            }
            if st.ended {
                return None;
            }
            match st.body.next().await {
                Some(Ok(chunk)) => {
                    if let Err(e) = st.feed(chunk.as_ref()) {
                        // The framing is lost: the events before it, the error, then the end.
                        st.ready.push_back(Err(e));
                        st.ended = true;
                    }
                }
                Some(Err(e)) => {
                    st.ready.push_back(Err(Error::Transport {
                        resource: st.resource.clone(),
                        verb: Verb::Watch,
                        source: Box::new(e),
                    }));
                    st.ended = true;
                }
                None => {
                    if !st.is_clean() {
                        tracing::debug!(
                            resource = %st.resource,
                            "watch body ended inside an event; the watch resumes from the last one"
                        );
                    }
                    return None;
                }
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::list_watch::protobuf::test_encoder::{Msg, chunked, envelope, pods};

    fn frame(event: &str, name: &str) -> Vec<u8> {
        let pod = Msg::new().msg(1, &Msg::new().str(1, name));
        let raw = envelope("v1", "Pod", &pod);
        let event = Msg::new().str(1, event).msg(2, &Msg::new().bytes(1, &raw));
        [(event.0.len() as u32).to_be_bytes().as_slice(), &event.0].concat()
    }

    fn name(event: &Result<WatchEvent<Pod>, Error>) -> String {
        match event.as_ref().ok().and_then(WatchEvent::object) {
            Some(p) => p.metadata.name.clone().unwrap_or_default(),
            None => panic!("{event:?}"),
        }
    }

    #[tokio::test]
    async fn protobuf_frames_become_events_and_a_bad_one_is_an_error_item() {
        let mut bad = frame("ADDED", "b");
        let last = bad.len() - 1;
        bad[last] = 0xff; // the name's last byte: no longer UTF-8
        let body = [frame("ADDED", "a"), bad, frame("DELETED", "c")].concat();
        let events: Vec<_> = decode_watch_body::<Pod, _, _, _>(
            chunked(body, 5),
            WatchFraming::Protobuf(pods()),
            "pods".into(),
        )
        .collect()
        .await;
        assert_eq!(events.len(), 3);
        assert_eq!(name(&events[0]), "a");
        assert!(
            matches!(
                &events[1],
                Err(Error::Decode {
                    verb: Verb::Watch,
                    ..
                })
            ),
            "{:?}",
            events[1]
        );
        assert_eq!(name(&events[2]), "c");
    }

    #[tokio::test]
    async fn a_frame_longer_than_the_limit_ends_the_stream_with_an_error() {
        let body = [
            frame("ADDED", "a"),
            u32::MAX.to_be_bytes().to_vec(),
            frame("ADDED", "b"),
        ]
        .concat();
        let events: Vec<_> = decode_watch_body::<Pod, _, _, _>(
            chunked(body, 64),
            WatchFraming::Protobuf(pods()),
            "pods".into(),
        )
        .collect()
        .await;
        assert_eq!(events.len(), 2);
        assert_eq!(name(&events[0]), "a");
        assert!(
            matches!(&events[1], Err(Error::Decode { .. })),
            "{:?}",
            events[1]
        );
    }

    #[tokio::test]
    async fn json_lines_are_read_when_the_server_answers_in_json() {
        let body = concat!(
            r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}}"#,
            "\n\n",
            r#"{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","labels":{"x":"1"}}}}"#,
            "\n",
            r#"{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"Pod","metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}}"#,
            "\n",
            r#"{"type":"ADDED","object":"not a pod"}"#,
            "\n",
        );
        for size in [1, 7, body.len()] {
            let events: Vec<_> = decode_watch_body::<Pod, _, _, _>(
                chunked(body.as_bytes().to_vec(), size),
                WatchFraming::JsonLines,
                "pods".into(),
            )
            .collect()
            .await;
            assert_eq!(events.len(), 4, "chunks of {size}");
            assert_eq!(name(&events[0]), "a");
            assert!(matches!(&events[1], Ok(WatchEvent::Modified(_))));
            assert!(matches!(
                &events[2],
                Ok(WatchEvent::Bookmark { resource_version, initial_events_end: true }) if resource_version == "9"
            ));
            assert!(matches!(&events[3], Err(Error::Decode { .. })));
        }
    }

    #[tokio::test]
    async fn an_object_that_does_not_decode_is_a_keyed_change_and_the_watch_goes_on() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let body = concat!(
            r#"{"type":"MODIFIED","object":{"metadata":{"name":"bad","namespace":"ns","resourceVersion":"7"},"data":{"v":5}}}"#,
            "\n",
            r#"{"type":"DELETED","object":{"metadata":{"name":"bad","namespace":"ns"},"data":{"v":5}}}"#,
            "\n",
            r#"{"type":"ADDED","object":{"metadata":{"name":"good","namespace":"ns"},"data":{"v":"5"}}}"#,
            "\n",
        );
        let events: Vec<_> = decode_watch_body::<ConfigMap, _, _, _>(
            chunked(body.as_bytes().to_vec(), 16),
            WatchFraming::JsonLines,
            "configmaps".into(),
        )
        .collect()
        .await;
        assert_eq!(events.len(), 3);
        match &events[0] {
            Ok(WatchEvent::Undecodable {
                change: Change::Modified,
                object,
            }) => {
                assert_eq!(object.key.as_str(), "ns/bad");
                assert_eq!(object.resource_version.as_deref(), Some("7"));
            }
            other => panic!("expected a keyed undecodable change, got {other:?}"),
        }
        assert!(matches!(
            &events[1],
            Ok(WatchEvent::Undecodable {
                change: Change::Deleted,
                ..
            })
        ));
        assert!(matches!(&events[2], Ok(WatchEvent::Added(_))));
    }
}
