//! A watch response body turned into a [`WatchStream`]: protobuf frames, or JSON lines
//! should a server answer a protobuf watch in JSON after all.

use std::{collections::VecDeque, ops::Range, pin::Pin, sync::Arc};

use futures::{FutureExt, Stream, StreamExt, stream::FuturesOrdered};
use serde::de::DeserializeOwned;

use super::{
    Change, KeyOnly, WatchEvent, WatchStream,
    batch::{self, BATCH_ITEMS, Batch, Decoding, MAX_OBJECT_BYTES, too_large},
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

/// The runs of events a watch stream keeps room for once it has handed out all it had.
const READY_KEPT_WHEN_IDLE: usize = 8;

/// One item of a watch stream.
type Item<K> = Result<WatchEvent<K>, Error>;

/// An event of the watch on `resource` that did not decode.
fn decode_error(resource: &str, source: impl Into<BoxError>) -> Error {
    Error::Decode {
        resource: resource.to_owned(),
        verb: Verb::Watch,
        source: source.into(),
    }
}

/// A run of events ready to be handed out, in order.
enum Ready<K> {
    /// Decoded already: on the blocking pool, or JSON lines as they were read.
    Decoded(std::vec::IntoIter<Item<K>>),
    /// Protobuf frames decoded one at a time as each is handed out. A batch that would be
    /// decoded on the task reading the body anyway gains nothing from being decoded at
    /// once, and its objects would all be alive together: a streaming list's first
    /// batches, a few in flight per watch, were most of a fleet's peak heap as decoded
    /// objects, where their frames are about a third of that.
    Frames {
        bytes: Vec<u8>,
        frames: VecDeque<Range<usize>>,
        table: &'static ProtobufResource,
    },
}

impl<K: DeserializeOwned> Ready<K> {
    /// The next event of the run, if any is left; `resource` names the watch in errors.
    fn next(&mut self, resource: &str) -> Option<Item<K>> {
        match self {
            Self::Decoded(events) => events.next(),
            Self::Frames {
                bytes,
                frames,
                table,
            } => {
                let frame = frames.pop_front()?;
                Some(decode_event(&bytes[frame], table).map_err(|e| decode_error(resource, e)))
            }
        }
    }
}

struct State<B, K> {
    body: Pin<Box<B>>,
    framing: Framing,
    /// Protobuf frames read but not yet handed to decoding.
    batch: Batch,
    /// Batches of frames being decoded, in the order they arrived.
    in_flight: FuturesOrdered<Decoding<Ready<K>>>,
    /// Batches decoded at once (see [`batch::parallelism`]).
    parallelism: usize,
    /// Frames handed to decoding so far.
    dispatched: usize,
    ready: VecDeque<Ready<K>>,
    /// Shared with the decoding batches, which name it only in errors.
    resource: Arc<str>,
    /// Nothing more is read: what is in flight and ready is the last of the stream.
    ended: bool,
}

impl<B, K: DeserializeOwned + Send + 'static> State<B, K> {
    /// Reads the events `chunk` completes: protobuf frames into the batch, JSON lines
    /// decoded now. An event that does not decode is an error item and the stream goes
    /// on; a broken framing is an error that ends it.
    fn feed(&mut self, chunk: &[u8]) -> Result<(), Error> {
        let resource = &*self.resource;
        match &mut self.framing {
            Framing::Protobuf(frames, _) => {
                let batch = &mut self.batch;
                frames
                    .feed(chunk, |frame| -> Result<(), ProtobufError> {
                        batch.push(frame);
                        Ok(())
                    })
                    .map_err(|e| decode_error(resource, e))
            }
            Framing::JsonLines(pending) => {
                let mut events = Vec::new();
                let mut start = 0;
                // What was pending holds no newline: scanning it again for each chunk of a
                // long line would take time quadratic in its length.
                let mut scan = pending.len();
                pending.extend_from_slice(chunk);
                while let Some(end) = memchr::memchr(b'\n', &pending[scan..]) {
                    let line = &pending[start..scan + end];
                    if !line.iter().all(u8::is_ascii_whitespace) {
                        events.push(json_event(line).map_err(|e| decode_error(resource, e)));
                    }
                    start = scan + end + 1;
                    scan = start;
                }
                pending.drain(..start);
                if !events.is_empty() {
                    self.in_flight
                        .push_back(Box::pin(std::future::ready(Ready::Decoded(
                            events.into_iter(),
                        ))));
                }
                if pending.len() > MAX_OBJECT_BYTES {
                    return Err(decode_error(resource, too_large("a watch event")));
                }
                Ok(())
            }
        }
    }

    /// Hands the frames read so far to decoding.
    fn dispatch(&mut self) {
        let Framing::Protobuf(_, table) = self.framing else {
            return;
        };
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        let dispatched = self.dispatched;
        self.dispatched += batch.len();
        if !batch::is_handed_off(self.parallelism, dispatched, batch.len()) {
            let (bytes, frames) = batch.into_items();
            let frames = Ready::Frames {
                bytes,
                frames: frames.collect(),
                table,
            };
            self.in_flight
                .push_back(Box::pin(std::future::ready(frames)));
            return;
        }
        let resource = Arc::clone(&self.resource);
        let lost_resource = Arc::clone(&resource);
        self.in_flight.push_back(batch::dispatch(
            batch,
            self.parallelism,
            dispatched,
            move |batch| {
                let (bytes, frames) = batch.into_items();
                let events: Vec<_> = frames
                    .map(|frame| {
                        decode_event(&bytes[frame], table).map_err(|e| decode_error(&resource, e))
                    })
                    .collect();
                Ready::Decoded(events.into_iter())
            },
            move |lost| Ready::Decoded(vec![Err(decode_error(&lost_resource, lost))].into_iter()),
        ));
    }

    /// The stream ends after what is in flight, with `last` (if any) as its last item.
    fn end(&mut self, last: Option<Error>) {
        self.dispatch();
        if let Some(error) = last {
            self.in_flight
                .push_back(Box::pin(std::future::ready(Ready::Decoded(
                    vec![Err(error)].into_iter(),
                ))));
        }
        self.ended = true;
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
    let parallelism = match framing {
        WatchFraming::Protobuf(_) => batch::parallelism(),
        WatchFraming::JsonLines => 1,
    };
    decode_watch_body_in(body, framing, resource, parallelism)
}

/// [`decode_watch_body`], decoding up to `parallelism` batches of frames at once.
fn decode_watch_body_in<K, B, D, E>(
    body: B,
    framing: WatchFraming,
    resource: String,
    parallelism: usize,
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
        batch: Batch::default(),
        in_flight: FuturesOrdered::new(),
        parallelism,
        dispatched: 0,
        ready: VecDeque::new(),
        resource: resource.into(),
        ended: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            while let Some(run) = st.ready.front_mut() {
                if let Some(event) = run.next(&st.resource) {
                    return Some((event, st));
                }
                st.ready.pop_front();
                if st.ready.is_empty() && st.ready.capacity() > READY_KEPT_WHEN_IDLE {
                    // A streaming list's initial events grew it; a quiet watch holds it for
                    // minutes.
                    st.ready = VecDeque::new();
                }
            }
            if st.ended && st.in_flight.is_empty() {
                return None;
            }
            let room = st.in_flight.len() < st.parallelism;
            tokio::select! {
                biased;
                run = st.in_flight.next(), if !st.in_flight.is_empty() => {
                    st.ready.extend(run);
                }
                chunk = st.body.next(), if !st.ended && room => {
                    st.read(chunk);
                    // Gather what has arrived already (a streaming list's initial events
                    // come many to a read) into full batches; a lone event of a quiet
                    // watch is decoded as soon as its read is.
                    while !st.ended && st.batch.len() < BATCH_ITEMS {
                        match st.body.next().now_or_never() {
                            Some(chunk) => st.read(chunk),
                            None => break,
                        }
                    }
                    st.dispatch();
                }
            }
        }
    })
    .boxed()
}

impl<B, D, E, K> State<B, K>
where
    K: DeserializeOwned + Send + 'static,
    B: Stream<Item = Result<D, E>>,
    D: AsRef<[u8]>,
    E: std::error::Error + Send + Sync + 'static,
{
    /// Takes in one read of the body: a chunk, an error, or its end.
    fn read(&mut self, chunk: Option<Result<D, E>>) {
        match chunk {
            Some(Ok(chunk)) => {
                if let Err(e) = self.feed(chunk.as_ref()) {
                    // The framing is lost: the events before it, the error, then the end.
                    self.end(Some(e));
                }
            }
            Some(Err(e)) => {
                let error = Error::Transport {
                    resource: self.resource.to_string(),
                    verb: Verb::Watch,
                    source: Box::new(e),
                };
                self.end(Some(error));
            }
            None => {
                if !self.is_clean() {
                    tracing::debug!(
                        resource = %self.resource,
                        "watch body ended inside an event; the watch resumes from the last one"
                    );
                }
                self.end(None);
            }
        }
    }
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

    /// The thread an object was decoded on.
    #[derive(Debug)]
    struct DecodedOn(std::thread::ThreadId);

    impl<'de> serde::Deserialize<'de> for DecodedOn {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            serde::de::IgnoredAny::deserialize(d)?;
            Ok(DecodedOn(std::thread::current().id()))
        }
    }

    #[tokio::test]
    async fn frames_that_arrive_together_decode_off_the_reading_thread_in_order() {
        const FRAMES: usize = 1000;
        let frames: Vec<Vec<u8>> = (0..FRAMES)
            .map(|i| frame("ADDED", &format!("p{i}")))
            .collect();
        let mut bad = frames[500].clone();
        let last = bad.len() - 1;
        bad[last] = 0xff;
        let mut body = frames.clone();
        body[500] = bad;
        let body = body.concat();

        // Pods: every event in the server's order, the bad one an error in its place.
        let events: Vec<_> = decode_watch_body_in::<Pod, _, _, _>(
            chunked(body.clone(), 64 << 10),
            WatchFraming::Protobuf(pods()),
            "pods".into(),
            2,
        )
        .collect()
        .await;
        assert_eq!(events.len(), FRAMES);
        for (i, event) in events.iter().enumerate() {
            if i == 500 {
                assert!(matches!(event, Err(Error::Decode { .. })), "{event:?}");
            } else {
                assert_eq!(name(event), format!("p{i}"));
            }
        }

        // On this single-threaded runtime, the first frames decoded inline (a small list
        // never reaches the blocking pool), the batches after them on its threads.
        let here = std::thread::current().id();
        let events: Vec<_> = decode_watch_body_in::<DecodedOn, _, _, _>(
            chunked(frames.concat(), 4 << 10),
            WatchFraming::Protobuf(pods()),
            "pods".into(),
            2,
        )
        .collect()
        .await;
        let on_pool = |event: &Item<DecodedOn>| matches!(event, Ok(WatchEvent::Decoded { object: DecodedOn(on), .. }) if *on != here);
        let first_on_pool = events
            .iter()
            .position(on_pool)
            .expect("some went to the pool");
        // Batches end at a read's end, so the first handed off starts at or a read after
        // the inline allowance.
        assert!(
            (batch::INLINE_FIRST_ITEMS..FRAMES / 2).contains(&first_on_pool),
            "the first {first_on_pool} decoded inline"
        );
        assert!(
            events[first_on_pool..].iter().all(on_pool),
            "every later batch decoded off the reading thread"
        );
    }

    #[tokio::test]
    async fn a_lone_event_is_delivered_without_waiting_for_more() {
        let body = futures::stream::iter([Ok::<_, std::io::Error>(frame("ADDED", "a"))])
            .chain(futures::stream::pending());
        let mut events = decode_watch_body_in::<Pod, _, _, _>(
            body,
            WatchFraming::Protobuf(pods()),
            "pods".into(),
            2,
        );
        let first = tokio::time::timeout(std::time::Duration::from_secs(30), events.next())
            .await
            .expect("the event arrives while the watch stays open")
            .expect("an item");
        assert_eq!(name(&first), "a");
    }

    #[tokio::test]
    async fn a_broken_body_ends_after_the_events_before_it() {
        let frames: Vec<_> = (0..100)
            .map(|i| Ok(frame("ADDED", &format!("p{i}"))))
            .chain([Err(std::io::Error::other("connection reset"))])
            .collect();
        let events: Vec<_> = decode_watch_body_in::<Pod, _, _, _>(
            futures::stream::iter(frames),
            WatchFraming::Protobuf(pods()),
            "pods".into(),
            2,
        )
        .collect()
        .await;
        assert_eq!(events.len(), 101);
        for (i, event) in events[..100].iter().enumerate() {
            assert_eq!(name(event), format!("p{i}"));
        }
        assert!(
            matches!(
                &events[100],
                Err(Error::Transport {
                    verb: Verb::Watch,
                    ..
                })
            ),
            "{:?}",
            events[100]
        );
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
    async fn a_json_line_longer_than_the_limit_ends_the_stream_with_an_error() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        use bytes::Bytes;

        const MIB: usize = 1 << 20;
        let first = concat!(
            r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}}"#,
            "\n{",
        );
        let read = Arc::new(AtomicUsize::new(0));
        let counted = read.clone();
        // One event, then bytes without a newline for as long as they are read.
        let body = futures::stream::iter([Bytes::from_static(first.as_bytes())])
            .chain(futures::stream::repeat(Bytes::from(vec![b'x'; MIB])))
            .map(move |chunk| {
                counted.fetch_add(chunk.len(), Ordering::Relaxed);
                Ok::<_, std::io::Error>(chunk)
            });
        let events: Vec<_> =
            decode_watch_body::<Pod, _, _, _>(body, WatchFraming::JsonLines, "pods".into())
                .collect()
                .await;
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(name(&events[0]), "a");
        let error = events[1]
            .as_ref()
            .expect_err("the endless line is an error");
        assert!(
            matches!(
                error,
                Error::Decode {
                    verb: Verb::Watch,
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("larger than 64 MiB"), "{error}");
        let read = read.load(Ordering::Relaxed);
        assert!(read <= MAX_OBJECT_BYTES + 2 * MIB, "{read} bytes read");
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
