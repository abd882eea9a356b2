//! Incremental decoding of a protobuf list response as its bytes arrive.
//!
//! The body is the envelope around a `…List` message: `ListMeta` as field 1, then one
//! field 2 per item. Each item is length-prefixed, so it is handed over as soon as its last
//! byte arrives, and only the item being received is buffered: the protobuf counterpart of
//! the JSON [`ListDecoder`](crate::list_decoder::ListDecoder).

use super::{
    envelope::{self, MAGIC},
    error::ProtobufError,
    schema::Resource,
    wire::{Raw, Reader, utf8, varint},
};
use crate::list_watch::ListEnd;

/// `…List`'s field numbers.
const LIST_META: u32 = 1;
const ITEMS: u32 = 2;

/// Where in the body the decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Magic,
    /// In the envelope, before its `raw` field.
    Envelope,
    /// In the list message, this many bytes of it left.
    List(usize),
    /// Past the list (the envelope's trailing fields are ignored).
    Done,
}

/// Splits a protobuf list body into items; see the module docs.
#[derive(Debug)]
pub(crate) struct ProtobufListDecoder {
    resource: &'static Resource,
    buf: Vec<u8>,
    state: State,
    end: ListEnd,
}

impl ProtobufListDecoder {
    pub(crate) fn new(resource: &'static Resource) -> Self {
        Self {
            resource,
            buf: Vec::new(),
            state: State::Magic,
            end: ListEnd::default(),
        }
    }

    /// The resource listed.
    pub(crate) fn resource(&self) -> &'static Resource {
        self.resource
    }

    /// Scans `chunk`; calls `item` with the bytes (no envelope) of every item it completes.
    pub(crate) fn feed<E: From<ProtobufError>>(
        &mut self,
        chunk: &[u8],
        mut item: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.state == State::Done {
            return Ok(());
        }
        self.buf.extend_from_slice(chunk);
        let mut pos = 0;
        let result = self.scan(&mut pos, &mut item);
        self.buf.drain(..pos);
        result
    }

    fn scan<E: From<ProtobufError>>(
        &mut self,
        pos: &mut usize,
        item: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        loop {
            let rest = &self.buf[*pos..];
            match self.state {
                State::Done => return Ok(()),
                State::Magic => {
                    if rest.len() < MAGIC.len() {
                        return Ok(());
                    }
                    if &rest[..MAGIC.len()] != MAGIC {
                        return Err(ProtobufError::Envelope.into());
                    }
                    *pos += MAGIC.len();
                    self.state = State::Envelope;
                }
                State::Envelope => {
                    let Some((number, header, len)) = len_field(rest)? else {
                        return Ok(());
                    };
                    if number == envelope::unknown::RAW {
                        *pos += header;
                        self.state = State::List(len);
                        continue;
                    }
                    if rest.len() < header + len {
                        return Ok(());
                    }
                    if number == envelope::unknown::TYPE_META {
                        let meta = envelope::parse_type_meta(&rest[header..header + len])?;
                        if meta.kind != self.resource.list_kind
                            || meta.api_version != self.resource.api_version()
                        {
                            return Err(ProtobufError::UnexpectedKind {
                                expected: self.resource.list_kind,
                                expected_version: self.resource.api_version(),
                                api_version: meta.api_version.to_owned(),
                                kind: meta.kind.to_owned(),
                            }
                            .into());
                        }
                    }
                    *pos += header + len;
                }
                State::List(0) => self.state = State::Done,
                State::List(left) => {
                    let Some((number, header, len)) = len_field(rest)? else {
                        return Ok(());
                    };
                    let size = header + len;
                    if size > left {
                        return Err(ProtobufError::Malformed("list item overruns the list").into());
                    }
                    if rest.len() < size {
                        return Ok(());
                    }
                    let bytes = &rest[header..size];
                    match number {
                        ITEMS => item(bytes)?,
                        LIST_META => self.end = list_meta(bytes)?,
                        _ => {}
                    }
                    *pos += size;
                    self.state = State::List(left - size);
                }
            }
        }
    }

    /// The list's metadata, once the whole body has been fed.
    ///
    /// # Errors
    /// [`ProtobufError::Truncated`] if the body ended inside the list.
    pub(crate) fn finish(self) -> Result<ListEnd, ProtobufError> {
        match self.state {
            State::Done | State::List(0) => Ok(self.end),
            _ => Err(ProtobufError::Truncated),
        }
    }
}

/// A length-delimited field's number, header size and length, once its header is in.
fn len_field(bytes: &[u8]) -> Result<Option<(u32, usize, usize)>, ProtobufError> {
    let Some((key, key_len)) = varint(bytes)? else {
        return Ok(None);
    };
    if key & 7 != 2 {
        return Err(ProtobufError::Malformed(
            "expected a length-delimited field",
        ));
    }
    let Some((len, len_len)) = varint(&bytes[key_len..])? else {
        return Ok(None);
    };
    let number = u32::try_from(key >> 3).map_err(|_| ProtobufError::Malformed("field number"))?;
    let len = usize::try_from(len).map_err(|_| ProtobufError::Truncated)?;
    let header = key_len + len_len;
    // Callers add the two: a length near `usize::MAX` must be refused, not wrap or panic.
    if header.checked_add(len).is_none() {
        return Err(ProtobufError::Malformed("field length overflows"));
    }
    Ok(Some((number, header, len)))
}

/// `ListMeta` `{selfLink = 1, resourceVersion = 2, continue = 3, remainingItemCount = 4,
/// shardInfo = 5}`, `ShardInfo` `{selector = 1}`.
fn list_meta(bytes: &[u8]) -> Result<ListEnd, ProtobufError> {
    let mut end = ListEnd::default();
    let mut reader = Reader::new(bytes);
    while !reader.is_empty() {
        let (number, wire) = reader.tag()?;
        let value = reader.value(wire)?;
        let text = |field| match value {
            Raw::Len(b) => utf8(b, field).map(str::to_owned),
            _ => Err(ProtobufError::Malformed("list metadata")),
        };
        match number {
            2 => end.resource_version = text("resourceVersion")?,
            3 => end.continue_token = Some(text("continue")?).filter(|c| !c.is_empty()),
            5 => {
                let Raw::Len(info) = value else {
                    return Err(ProtobufError::Malformed("list metadata"));
                };
                end.shard_selector = Some(shard_selector(info)?);
            }
            _ => {}
        }
    }
    Ok(end)
}

/// `ShardInfo.selector`.
fn shard_selector(bytes: &[u8]) -> Result<String, ProtobufError> {
    let mut selector = String::new();
    let mut reader = Reader::new(bytes);
    while !reader.is_empty() {
        let (number, wire) = reader.tag()?;
        match (number, reader.value(wire)?) {
            (1, Raw::Len(b)) => selector = utf8(b, "shardInfo.selector")?.to_owned(),
            (1, _) => return Err(ProtobufError::Malformed("shard info")),
            _ => {}
        }
    }
    Ok(selector)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::list_watch::protobuf::{
        deserializer::from_message,
        test_encoder::{Msg, envelope, pods},
    };

    fn pod(name: &str) -> Msg {
        Msg::new().msg(1, &Msg::new().str(1, name).str(3, "x"))
    }

    fn body(names: &[&str], rv: &str, token: &str) -> Vec<u8> {
        let mut list = Msg::new().msg(1, &Msg::new().str(1, "").str(2, rv).str(3, token));
        for name in names {
            list = list.msg(2, &pod(name));
        }
        envelope("v1", "PodList", &list)
    }

    #[test]
    fn the_shard_the_server_applied_is_read_from_the_list_metadata() {
        let selector =
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')";
        let meta = Msg::new().str(2, "9").msg(5, &Msg::new().str(1, selector));
        let list = Msg::new().msg(1, &meta).msg(2, &pod("a"));
        let body = envelope("v1", "PodList", &list);
        for chunk in [1, 7, body.len()] {
            let (names, end) = decode_in_chunks(&body, chunk).unwrap();
            assert_eq!(names, ["a"]);
            assert_eq!(end.shard_selector.as_deref(), Some(selector));
            assert_eq!(end.resource_version, "9");
        }
    }

    fn decode_in_chunks(
        body: &[u8],
        chunk: usize,
    ) -> Result<(Vec<String>, ListEnd), ProtobufError> {
        let mut decoder = ProtobufListDecoder::new(pods());
        let mut names = Vec::new();
        for piece in body.chunks(chunk) {
            decoder.feed(piece, |bytes| -> Result<(), ProtobufError> {
                let pod: serde_json::Value = from_message(bytes, decoder_item(), None)?;
                names.push(
                    pod["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                );
                Ok(())
            })?;
        }
        Ok((names, decoder.finish()?))
    }

    fn decoder_item() -> &'static super::super::schema::Message {
        pods().item
    }

    #[test]
    fn every_chunking_gives_the_same_items_and_metadata() {
        let body = body(&["a", "b", "c"], "42", "next");
        for chunk in 1..=body.len() {
            let (names, end) = decode_in_chunks(&body, chunk).unwrap();
            assert_eq!(names, ["a", "b", "c"], "chunks of {chunk}");
            assert_eq!(end.resource_version, "42");
            assert_eq!(end.continue_token.as_deref(), Some("next"));
        }
        let (names, end) = decode_in_chunks(&self::body(&[], "7", ""), 3).unwrap();
        assert!(names.is_empty());
        assert_eq!(
            end,
            ListEnd {
                resource_version: "7".into(),
                continue_token: None,
                shard_selector: None,
            }
        );
    }

    #[test]
    fn a_body_cut_short_another_kind_or_no_envelope_is_an_error() {
        let full = body(&["a", "b"], "42", "");
        for cut in 0..full.len() - 4 {
            // The trailing envelope fields (content encoding and type, 4 bytes) are optional.
            assert!(decode_in_chunks(&full[..cut], 5).is_err(), "cut at {cut}");
        }
        let services = envelope("v1", "ServiceList", &Msg::new());
        assert!(matches!(
            decode_in_chunks(&services, 64),
            Err(ProtobufError::UnexpectedKind {
                expected: "PodList",
                ..
            })
        ));
        assert!(matches!(
            decode_in_chunks(br#"{"items":[]}"#, 64),
            Err(ProtobufError::Envelope)
        ));
    }

    #[test]
    fn a_field_length_near_the_address_space_is_malformed_not_a_panic() {
        // The magic, then a length-delimited field 1 claiming u64::MAX bytes.
        let mut body = MAGIC.to_vec();
        body.push(0x0a);
        body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert!(matches!(
            decode_in_chunks(&body, 64),
            Err(ProtobufError::Malformed(_))
        ));
    }
}
