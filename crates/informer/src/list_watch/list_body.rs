//! A list response body turned into a [`ListStream`], its items decoded in parallel.
//!
//! Decoding, not the network, bounds how fast a large protobuf list syncs: once the server
//! starts sending, building the Rust objects on one core takes longer than the bytes take
//! to arrive. The splitters ([`ListDecoder`] for JSON,
//! [`ProtobufListDecoder`] for protobuf) only find where each item's bytes are; the items
//! are gathered into batches, and each batch is decoded on tokio's blocking pool while the
//! body keeps arriving and earlier batches are being stored. Items still come out in the
//! server's order, and only a few batches are ever in flight, so memory stays bounded as
//! with decoding one by one.
//!
//! JSON lists, a list's first few hundred items (all of a small list), and runtimes
//! without a blocking pool decode inline.

use std::{collections::VecDeque, pin::Pin};

use futures::{
    Stream, StreamExt,
    stream::{FuturesOrdered, try_unfold},
};
use serde::de::DeserializeOwned;

use bytes::Bytes;

use super::{
    KeyOnly, ListEnd, ListItem, ListStream, RawFormat, RawObject,
    batch::{self, BATCH_ITEMS, Batch, Decoding, MAX_OBJECT_BYTES, too_large},
    json_list::{ListDecodeError, ListDecoder},
    protobuf::{error::ProtobufError, list_decoder::ProtobufListDecoder},
};
use crate::error::{BoxError, Error, Verb};

/// A list body's splitter, by encoding.
pub(crate) enum BodySplitter {
    /// `application/json`.
    Json(ListDecoder),
    /// Kubernetes protobuf.
    Protobuf(ProtobufListDecoder),
}

impl BodySplitter {
    /// Appends the items `chunk` completes to `batch`.
    fn feed(&mut self, chunk: &[u8], batch: &mut Batch) -> Result<(), BoxError> {
        match self {
            BodySplitter::Json(splitter) => splitter
                .feed(chunk, |bytes| -> Result<(), ListDecodeError> {
                    batch.push(bytes);
                    Ok(())
                })
                .map_err(Into::into),
            BodySplitter::Protobuf(splitter) => splitter
                .feed(chunk, |bytes| -> Result<(), ProtobufError> {
                    batch.push(bytes);
                    Ok(())
                })
                .map_err(Into::into),
        }
    }

    fn finish(self) -> Result<ListEnd, BoxError> {
        match self {
            BodySplitter::Json(splitter) => splitter.finish().map_err(Into::into),
            BodySplitter::Protobuf(splitter) => splitter.finish().map_err(Into::into),
        }
    }

    fn item_decoder(&self) -> ItemDecoder {
        ItemDecoder(match self {
            BodySplitter::Json(_) => RawFormat::Json,
            BodySplitter::Protobuf(splitter) => RawFormat::Protobuf {
                resource: splitter.resource(),
                typed: false,
            },
        })
    }
}

/// How one item's bytes become an object.
#[derive(Clone, Copy)]
struct ItemDecoder(RawFormat);

impl ItemDecoder {
    fn decode<K: DeserializeOwned>(self, batch: Batch) -> Result<Vec<ListItem<K>>, BoxError> {
        let mut items = Vec::with_capacity(batch.len());
        let (bytes, ranges) = batch.into_items();
        let bytes = Bytes::from(bytes);
        for range in ranges {
            let item = &bytes[range.clone()];
            let item = match self.0.decode::<K>(item) {
                Ok(object) => ListItem::Decoded {
                    object,
                    // A slice of the batch: a store that keeps it copies it out.
                    raw: RawObject::new(bytes.slice(range), self.0),
                },
                // One bad object must not fail the list: read its key alone, so the
                // reflector can keep its last good state and apply everything else.
                Err(error) => {
                    let keyed = self.0.decode::<KeyOnly>(item).ok();
                    match keyed.and_then(|k| k.undecodable(error.to_string())) {
                        Some(undecodable) => ListItem::Undecodable(undecodable),
                        None => return Err(error),
                    }
                }
            };
            items.push(item);
        }
        Ok(items)
    }
}

struct State<B, K> {
    body: Pin<Box<B>>,
    splitter: Option<BodySplitter>,
    decoder: ItemDecoder,
    batch: Batch,
    in_flight: FuturesOrdered<Decoding<Result<Vec<ListItem<K>>, BoxError>>>,
    /// Batches decoded at once: the cores there are, when there is a blocking pool.
    parallelism: usize,
    /// Items handed to decoding so far.
    dispatched: usize,
    ready: VecDeque<ListItem<K>>,
    end: Option<ListEnd>,
    resource: String,
    /// Bytes read since the last chunk that completed an item: what the splitter holds of
    /// the item it is receiving, give or take one chunk.
    since_item: usize,
}

impl<B, K: DeserializeOwned + Send + 'static> State<B, K> {
    fn decode_error(&self, source: impl Into<BoxError>) -> Error {
        Error::Decode {
            resource: self.resource.clone(),
            verb: Verb::List,
            source: source.into(),
        }
    }

    /// Hands the batch over: to the blocking pool when decoding in parallel, else inline.
    fn dispatch(&mut self) {
        let batch = std::mem::take(&mut self.batch);
        let dispatched = self.dispatched;
        self.dispatched += batch.len();
        let decoder = self.decoder;
        self.in_flight.push_back(batch::dispatch(
            batch,
            self.parallelism,
            dispatched,
            move |batch| decoder.decode::<K>(batch),
            |lost| Err(lost.into()),
        ));
    }
}

/// The items of a list body as they arrive, then its metadata; see the module docs.
pub(crate) fn decode_list_body<K, B, D, E>(
    body: B,
    splitter: BodySplitter,
    resource: String,
) -> ListStream<K>
where
    K: DeserializeOwned + Send + 'static,
    B: Stream<Item = Result<D, E>> + Send + 'static,
    D: AsRef<[u8]>,
    E: std::error::Error + Send + Sync + 'static,
{
    // A JSON list streams out while the server encodes it, so decoding item by item
    // already keeps pace on a core of its own, and more cores would be taken from a server
    // on the same machine; a protobuf list arrives whole once encoded, and then decoding is
    // all that is left to do.
    let parallelism = match splitter {
        BodySplitter::Protobuf(_) => batch::parallelism(),
        BodySplitter::Json(_) => 1,
    };
    let state = State {
        body: Box::pin(body),
        decoder: splitter.item_decoder(),
        splitter: Some(splitter),
        batch: Batch::default(),
        in_flight: FuturesOrdered::new(),
        parallelism,
        dispatched: 0,
        ready: VecDeque::new(),
        end: None,
        resource,
        since_item: 0,
    };
    try_unfold(state, |mut st| async move {
        loop {
            if let Some(item) = st.ready.pop_front() {
                return Ok(Some((item, st)));
            }
            let body_open = st.splitter.is_some();
            let room = st.in_flight.len() < st.parallelism;
            if st.in_flight.is_empty() && !body_open {
                return Ok(st.end.take().map(|end| {
                    let item = ListItem::End {
                        resource_version: end.resource_version,
                        continue_token: end.continue_token,
                        shard_selector: end.shard_selector,
                    };
                    (item, st)
                }));
            }
            tokio::select! {
                biased;
                decoded = st.in_flight.next(), if !st.in_flight.is_empty() => {
                    match decoded {
                        Some(Ok(items)) => st.ready.extend(items),
                        Some(Err(e)) => return Err(st.decode_error(e)),
                        None => {}
                    }
                }
                chunk = st.body.next(), if body_open && room => match chunk {
                    Some(Ok(chunk)) => {
                        let Some(splitter) = st.splitter.as_mut() else { continue };
                        let chunk = chunk.as_ref();
                        // Counted whatever the encoding, so no splitter needs a limit of
                        // its own.
                        if st.since_item + chunk.len() > MAX_OBJECT_BYTES {
                            return Err(st.decode_error(too_large("a list item")));
                        }
                        let items = st.batch.len();
                        if let Err(e) = splitter.feed(chunk, &mut st.batch) {
                            return Err(st.decode_error(e));
                        }
                        st.since_item = if st.batch.len() > items {
                            0
                        } else {
                            st.since_item + chunk.len()
                        };
                        if st.batch.len() >= BATCH_ITEMS {
                            st.dispatch();
                        }
                    }
                    Some(Err(e)) => {
                        return Err(Error::Transport {
                            resource: st.resource.clone(),
                            verb: Verb::List,
                            source: Box::new(e),
                        });
                    }
                    None => {
                        let Some(splitter) = st.splitter.take() else { continue };
                        match splitter.finish() {
                            Ok(end) => st.end = Some(end),
                            Err(e) => return Err(st.decode_error(e)),
                        }
                        if !st.batch.is_empty() {
                            st.dispatch();
                        }
                    }
                },
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use futures::TryStreamExt;
    use serde_json::{Value, json};

    use super::*;
    use crate::list_watch::protobuf::test_encoder::{Msg, chunked, envelope, pods, varint};

    /// A protobuf list of `n` Pods named `p0`, `p1`, ...; `bad` gets a name that is not UTF-8.
    fn protobuf_body(n: usize, bad: Option<usize>) -> Vec<u8> {
        let mut list = Msg::new().msg(1, &Msg::new().str(2, "77"));
        for i in 0..n {
            let name = format!("p{i}");
            let meta = if Some(i) == bad {
                Msg::new().bytes(1, &[0xff])
            } else {
                Msg::new().str(1, &name)
            };
            list = list.msg(2, &Msg::new().msg(1, &meta));
        }
        envelope("v1", "PodList", &list)
    }

    async fn names(stream: ListStream<Value>) -> Result<(Vec<String>, String), Error> {
        let items: Vec<ListItem<Value>> = stream.try_collect().await?;
        let mut names = Vec::new();
        let mut rv = None;
        for item in items {
            match item {
                ListItem::Decoded { object, raw } => {
                    // Each item's bytes, and only its own, decode to it again.
                    let again: Value = raw.format().decode(raw.as_bytes()).unwrap();
                    assert_eq!(again, object);
                    names.push(object["metadata"]["name"].as_str().unwrap().to_owned())
                }
                ListItem::Object(o) => panic!("a body's items come with their bytes: {o}"),
                ListItem::End {
                    resource_version, ..
                } => rv = Some(resource_version),
                ListItem::Undecodable(u) => panic!("every Value decodes: {u:?}"),
            }
        }
        Ok((names, rv.expect("the stream ends with the list's metadata")))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn parallel_batches_keep_the_servers_order() {
        let n = BATCH_ITEMS * 7 + 5;
        for size in [97, 4096, usize::MAX] {
            let splitter = BodySplitter::Protobuf(ProtobufListDecoder::new(pods()));
            let stream = decode_list_body(
                chunked(protobuf_body(n, None), size),
                splitter,
                "pods".into(),
            );
            let (names, rv) = names(stream).await.unwrap();
            let expected: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
            assert_eq!(names, expected, "chunks of {size}");
            assert_eq!(rv, "77");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_item_whose_key_does_not_decode_fails_the_list() {
        let splitter = BodySplitter::Protobuf(ProtobufListDecoder::new(pods()));
        let body = protobuf_body(BATCH_ITEMS * 3, Some(BATCH_ITEMS * 2 + 1));
        let err = names(decode_list_body(
            chunked(body, 1000),
            splitter,
            "pods".into(),
        ))
        .await
        .unwrap_err();
        assert!(
            matches!(&err, Error::Decode { resource, verb: Verb::List, .. } if resource == "pods"),
            "{err}"
        );
        assert!(err.to_string().contains("UTF-8"), "{err}");
    }

    /// `head`, then `filler` bytes in chunks of 1 MiB made as they are read, then `tail`;
    /// counts the bytes read.
    fn endless_item(
        head: Vec<u8>,
        filler: usize,
        tail: &'static [u8],
        read: Arc<AtomicUsize>,
    ) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static {
        const MIB: usize = 1 << 20;
        let chunk = Bytes::from(vec![b'x'; MIB]);
        let fill = (0..filler.div_ceil(MIB)).map(move |i| chunk.slice(..MIB.min(filler - i * MIB)));
        futures::stream::iter(
            std::iter::once(Bytes::from(head))
                .chain(fill)
                .chain([Bytes::from_static(tail)]),
        )
        .map(move |chunk| {
            read.fetch_add(chunk.len(), Ordering::Relaxed);
            Ok(chunk)
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_item_larger_than_the_limit_is_refused_before_it_is_buffered() {
        let filler = MAX_OBJECT_BYTES + (16 << 20);
        // JSON: one item, a string in it going on past the limit.
        let read = Arc::new(AtomicUsize::new(0));
        let head = br#"{"metadata":{"resourceVersion":"1"},"items":[{"data":{"big":""#.to_vec();
        let stream = decode_list_body::<Value, _, _, _>(
            endless_item(head, filler, br#""}}]}"#, read.clone()),
            BodySplitter::Json(ListDecoder::default()),
            "configmaps".into(),
        );
        let err = names(stream).await.unwrap_err();
        assert!(
            matches!(&err, Error::Decode { resource, verb: Verb::List, .. } if resource == "configmaps"),
            "{err}"
        );
        assert!(err.to_string().contains("larger than 64 MiB"), "{err}");
        let read = read.load(Ordering::Relaxed);
        assert!(
            read <= MAX_OBJECT_BYTES + (1 << 20),
            "{read} bytes read of {filler}"
        );

        // Protobuf: the magic, the envelope's `raw` (the list) and the list's one item, each
        // a length-delimited field that says how long it is, and is that long.
        let read = Arc::new(AtomicUsize::new(0));
        let item_len = filler as u64;
        let item_header = [vec![0x12], varint(item_len)].concat();
        let list_len = item_header.len() as u64 + item_len;
        let head = [
            b"k8s\0".as_slice(),
            &[0x12],
            &varint(list_len),
            &item_header,
        ]
        .concat();
        let stream = decode_list_body::<Value, _, _, _>(
            endless_item(head, filler, b"", read.clone()),
            BodySplitter::Protobuf(ProtobufListDecoder::new(pods())),
            "pods".into(),
        );
        let err = names(stream).await.unwrap_err();
        assert!(
            matches!(&err, Error::Decode { resource, .. } if resource == "pods"),
            "{err}"
        );
        assert!(err.to_string().contains("larger than 64 MiB"), "{err}");
        let read = read.load(Ordering::Relaxed);
        assert!(
            read <= MAX_OBJECT_BYTES + (1 << 20),
            "{read} bytes read of {filler}"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn json_lists_decode_inline_in_order() {
        let items: Vec<Value> = (0..300)
            .map(|i| serde_json::json!({ "metadata": { "name": format!("c{i}") } }))
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({
            "kind": "ConfigMapList",
            "metadata": { "resourceVersion": "9" },
            "items": items,
        }))
        .unwrap();
        let splitter = BodySplitter::Json(ListDecoder::default());
        let (names, rv) = names(decode_list_body(
            chunked(body, 333),
            splitter,
            "configmaps".into(),
        ))
        .await
        .unwrap();
        assert_eq!(names.len(), 300);
        assert_eq!(
            (names[0].as_str(), names[299].as_str(), rv.as_str()),
            ("c0", "c299", "9")
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_object_that_does_not_decode_is_reported_by_key_and_the_rest_decode() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let items: Vec<Value> = (0..100)
            .map(|i| {
                // ConfigMap data is a map of strings: a number makes c42 undecodable.
                let data = if i == 42 {
                    json!({ "v": 5 })
                } else {
                    json!({ "v": "ok" })
                };
                json!({ "metadata": { "name": format!("c{i}"), "namespace": "ns" }, "data": data })
            })
            .collect();
        let body = serde_json::to_vec(&json!({
            "kind": "ConfigMapList",
            "metadata": { "resourceVersion": "9" },
            "items": items,
        }))
        .unwrap();
        let stream = decode_list_body::<ConfigMap, _, _, _>(
            chunked(body, 333),
            BodySplitter::Json(ListDecoder::default()),
            "configmaps".into(),
        );
        let items: Vec<ListItem<ConfigMap>> = stream.try_collect().await.unwrap();
        let objects = items.iter().filter(|i| i.object().is_some()).count();
        let undecodable: Vec<&crate::list_watch::Undecodable> = items
            .iter()
            .filter_map(|i| match i {
                ListItem::Undecodable(u) => Some(u),
                _ => None,
            })
            .collect();
        assert_eq!(objects, 99);
        assert_eq!(undecodable.len(), 1);
        assert_eq!(undecodable[0].key.as_str(), "ns/c42");
        assert!(
            undecodable[0].reason.contains("string"),
            "{:?}",
            undecodable[0]
        );
        assert!(matches!(items.last(), Some(ListItem::End { .. })));
    }
}
