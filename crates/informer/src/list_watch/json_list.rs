//! Incremental decoding of a JSON list response (`{"kind":..,"metadata":{..},"items":[..]}`)
//! as its bytes arrive.
//!
//! Decoding a list the usual way waits for the whole body, holds it, and then holds every
//! decoded item at once: the whole body, then every struct, before the first object
//! reaches the cache. [`ListDecoder`] instead finds each element of
//! `items` as soon as its closing brace arrives and hands its bytes over, so objects are
//! decoded while the server is still sending, and only the element being received is
//! buffered. Everything outside `items` (the envelope, with the list's metadata) is kept
//! and parsed at the end.
//!
//! The scanner only tracks strings (with escapes) and nesting depth; the elements and the
//! envelope are parsed by `serde_json`, so malformed JSON is reported by it.

use serde::Deserialize;

use super::ListEnd;

/// Why a list body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ListDecodeError {
    /// An element of `items` or the envelope is not valid for its type.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The body is not a list object, or it ended before the list did.
    #[error("malformed list response: {0}")]
    Shape(&'static str),
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    metadata: EnvelopeMeta,
}

#[derive(Default, Deserialize)]
struct EnvelopeMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
    #[serde(default, rename = "shardInfo")]
    shard_info: Option<ShardInfo>,
}

#[derive(Deserialize)]
struct ShardInfo {
    #[serde(default)]
    selector: String,
}

/// Splits a list body into its `items` elements and its envelope; see the
/// module docs.
#[derive(Debug, Default)]
pub(crate) struct ListDecoder {
    /// Bytes not yet consumed: the element (or top-level key) being received.
    buf: Vec<u8>,
    /// Everything outside the elements of `items`.
    envelope: Vec<u8>,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth 1, the next string is a key.
    expect_key: bool,
    /// Start in `buf` of the top-level key being received.
    key_start: Option<usize>,
    last_key_is_items: bool,
    in_items: bool,
    seen_items: bool,
    /// Start in `buf` of the element being received.
    item_start: Option<usize>,
    /// In `items`, what may come next between its elements: serde_json parses each element
    /// alone and never sees the commas between them.
    items_next: ItemsNext,
}

/// What may come next in `items`, outside its elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ItemsNext {
    /// Right after `[`: an element or `]`.
    #[default]
    First,
    /// After an element: `,` or `]`.
    Comma,
    /// After a comma: an element.
    Element,
}

impl ListDecoder {
    /// Scans `chunk`; calls `item` with the bytes of every element of `items` it completes.
    pub(crate) fn feed<E: From<ListDecodeError>>(
        &mut self,
        chunk: &[u8],
        mut item: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let scan_from = self.buf.len();
        self.buf.extend_from_slice(chunk);
        let mut i = scan_from;
        while i < self.buf.len() {
            if self.in_string && !self.escaped {
                // Most of a list is string contents: jump to the next quote or backslash.
                let run =
                    memchr::memchr2(b'"', b'\\', &self.buf[i..]).unwrap_or(self.buf.len() - i);
                if !self.in_items {
                    self.envelope.extend_from_slice(&self.buf[i..i + run]);
                }
                i += run;
                if i == self.buf.len() {
                    break;
                }
            }
            let b = self.buf[i];
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if let Some(start) = self.key_start.take() {
                        self.last_key_is_items = &self.buf[start..i] == b"items";
                    }
                }
                if !self.in_items {
                    self.envelope.push(b);
                }
                i += 1;
                continue;
            }
            match b {
                b'"' => {
                    self.in_string = true;
                    if self.depth == 1 && self.expect_key {
                        self.expect_key = false;
                        self.key_start = Some(i + 1);
                    }
                    if self.in_items && self.depth == 2 {
                        return Err(ListDecodeError::Shape("an item is not an object").into());
                    }
                }
                b'{' | b'[' => {
                    self.depth += 1;
                    match self.depth {
                        1 if b == b'{' => self.expect_key = true,
                        1 => return Err(ListDecodeError::Shape("not a JSON object").into()),
                        2 if b == b'[' && self.last_key_is_items => {
                            self.in_items = true;
                            self.seen_items = true;
                            self.items_next = ItemsNext::First;
                            self.envelope.push(b);
                            i += 1;
                            continue;
                        }
                        3 if self.in_items => {
                            if self.items_next == ItemsNext::Comma {
                                return Err(ListDecodeError::Shape("items without a comma").into());
                            }
                            self.items_next = ItemsNext::Comma;
                            self.item_start = Some(i);
                        }
                        _ => {}
                    }
                }
                b'}' | b']' => {
                    if self.depth == 0 {
                        return Err(ListDecodeError::Shape("unbalanced brackets").into());
                    }
                    if self.in_items && self.depth == 3 {
                        let start = self.item_start.take().unwrap_or(i);
                        item(&self.buf[start..=i])?;
                    } else if self.in_items && self.depth == 2 {
                        if self.items_next == ItemsNext::Element {
                            return Err(
                                ListDecodeError::Shape("a comma after the last item").into()
                            );
                        }
                        self.in_items = false;
                    }
                    self.depth -= 1;
                }
                b',' if self.depth == 1 => self.expect_key = true,
                b',' if self.in_items && self.depth == 2 => {
                    if self.items_next != ItemsNext::Comma {
                        return Err(
                            ListDecodeError::Shape("a comma without an item before it").into()
                        );
                    }
                    self.items_next = ItemsNext::Element;
                }
                b':' if self.in_items && self.depth == 2 => {
                    return Err(ListDecodeError::Shape("an item is not an object").into());
                }
                b' ' | b'\t' | b'\r' | b'\n' | b',' | b':' => {}
                _ if self.in_items && self.depth == 2 => {
                    return Err(ListDecodeError::Shape("an item is not an object").into());
                }
                _ => {}
            }
            if !self.in_items {
                self.envelope.push(b);
            }
            i += 1;
        }
        self.consume();
        Ok(())
    }

    /// Drops the scanned bytes that no pending element or key needs.
    fn consume(&mut self) {
        let keep_from = self.item_start.or(self.key_start).unwrap_or(self.buf.len());
        self.buf.drain(..keep_from);
        if let Some(start) = &mut self.item_start {
            *start -= keep_from;
        }
        if let Some(start) = &mut self.key_start {
            *start -= keep_from;
        }
    }

    /// The list's metadata, once the body has ended.
    pub(crate) fn finish(self) -> Result<ListEnd, ListDecodeError> {
        if self.depth != 0 || self.in_string || self.envelope.is_empty() {
            return Err(ListDecodeError::Shape("the body ended before the list did"));
        }
        let envelope: Envelope = serde_json::from_slice(&self.envelope)?;
        if !self.seen_items && envelope.metadata.resource_version.is_none() {
            return Err(ListDecodeError::Shape("neither items nor metadata"));
        }
        Ok(ListEnd {
            resource_version: envelope.metadata.resource_version.unwrap_or_default(),
            continue_token: envelope.metadata.continue_token.filter(|c| !c.is_empty()),
            shard_selector: envelope.metadata.shard_info.map(|info| info.selector),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn the_shard_the_server_applied_is_read_from_the_list_metadata() {
        let body = br#"{"metadata":{"resourceVersion":"5","shardInfo":{"selector":"shardRange(object.metadata.namespace, '0x0000000000000000', '0x10000000000000000')"}},"items":[{"a":1}]}"#;
        let (items, end) = decode_in_chunks(body, 4).unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(
            end.shard_selector.as_deref(),
            Some(
                "shardRange(object.metadata.namespace, '0x0000000000000000', '0x10000000000000000')"
            )
        );
        let (_, end) =
            decode_in_chunks(br#"{"metadata":{"resourceVersion":"5"},"items":[]}"#, 3).unwrap();
        assert_eq!(
            end.shard_selector, None,
            "no shardInfo: the server applied none"
        );
    }

    fn decode_in_chunks(body: &[u8], chunk: usize) -> Result<(Vec<Value>, ListEnd), String> {
        let mut decoder = ListDecoder::default();
        let mut items = Vec::new();
        for part in body.chunks(chunk.max(1)) {
            decoder
                .feed(part, |bytes| -> Result<(), ListDecodeError> {
                    items.push(serde_json::from_slice(bytes)?);
                    Ok(())
                })
                .map_err(|e| e.to_string())?;
        }
        let end = decoder.finish().map_err(|e| e.to_string())?;
        Ok((items, end))
    }

    fn sample() -> Value {
        json!({
            "kind": "ConfigMapList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "42", "continue": "tok\"en", "remainingItemCount": 3},
            "items": [
                {"metadata": {"name": "a", "annotations": {"items": "[{\"x\":\"}\"}]"}}, "data": {"k": "v\\\"}"}},
                {"metadata": {"name": "b"}, "data": {"nested": "[[{}]]", "items": "]"}},
                {"metadata": {"name": "c", "labels": {"é": "ü\u{1F600}"}}}
            ]
        })
    }

    #[test]
    fn every_chunking_gives_the_same_items_and_metadata() {
        let value = sample();
        let compact = serde_json::to_vec(&value).unwrap();
        let pretty = serde_json::to_vec_pretty(&value).unwrap();
        for body in [&compact, &pretty] {
            for chunk in 1..body.len() + 1 {
                let (items, end) = decode_in_chunks(body, chunk).unwrap();
                assert_eq!(Value::Array(items), value["items"], "chunk {chunk}");
                assert_eq!(end.resource_version, "42");
                assert_eq!(end.continue_token.as_deref(), Some("tok\"en"));
            }
        }
    }

    #[test]
    fn items_before_metadata_and_empty_or_null_items() {
        let body = br#"{"items":[{"a":1}],"metadata":{"resourceVersion":"7"},"kind":"List"}"#;
        let (items, end) = decode_in_chunks(body, 5).unwrap();
        assert_eq!(items, [json!({"a": 1})]);
        assert_eq!(end.resource_version, "7");
        assert_eq!(end.continue_token, None);
        for body in [
            &br#"{"metadata":{"resourceVersion":"9","continue":""},"items":[]}"#[..],
            br#"{"metadata":{"resourceVersion":"9"},"items":null}"#,
        ] {
            let (items, end) = decode_in_chunks(body, 3).unwrap();
            assert!(items.is_empty());
            assert_eq!(end.resource_version, "9");
            assert_eq!(end.continue_token, None);
        }
    }

    #[test]
    fn items_not_separated_by_single_commas_are_errors() {
        // Found with the `list_body` fuzz target's check against serde_json: the elements
        // are parsed alone, so the separators between them went unchecked.
        for body in [
            &br#"{"metadata":{"resourceVersion":"1"},"items":[{} {}]}"#[..],
            br#"{"metadata":{"resourceVersion":"1"},"items":[{},]}"#,
            br#"{"metadata":{"resourceVersion":"1"},"items":[,{}]}"#,
            br#"{"metadata":{"resourceVersion":"1"},"items":[{},,{}]}"#,
            br#"{"metadata":{"resourceVersion":"1"},"items":[{}:{}]}"#,
        ] {
            assert!(
                serde_json::from_slice::<Value>(body).is_err(),
                "not JSON to begin with"
            );
            for chunk in [1, 3, body.len()] {
                let result = decode_in_chunks(body, chunk);
                assert!(
                    result.is_err(),
                    "{}: {result:?}",
                    String::from_utf8_lossy(body)
                );
            }
        }
        let (items, _) =
            decode_in_chunks(br#"{"items":[ {} , {"a":[1,2]} ],"metadata":{}}"#, 2).unwrap();
        assert_eq!(items, [json!({}), json!({"a": [1, 2]})]);
    }

    #[test]
    fn malformed_bodies_are_errors() {
        for (body, expect) in [
            (
                &br#"{"metadata":{"resourceVersion":"1"},"items":[{"a":1}"#[..],
                "ended",
            ),
            (
                br#"{"metadata":{"resourceVersion":"1"},"items":[1,2]}"#,
                "not an object",
            ),
            (
                br#"{"metadata":{"resourceVersion":"1"},"items":["x"]}"#,
                "not an object",
            ),
            (br#"[{"a":1}]"#, "not a JSON object"),
            (br#"{"kind":"Status"}"#, "neither items nor metadata"),
            (
                br#"{"metadata":{"resourceVersion":1},"items":[]}"#,
                "invalid type",
            ),
            (
                br#"{"metadata":{"resourceVersion":"1"},"items":[{"a":tru}]}"#,
                "expected",
            ),
            (b"", "ended"),
        ] {
            let err = decode_in_chunks(body, 4).unwrap_err();
            assert!(
                err.contains(expect),
                "{}: {err}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
