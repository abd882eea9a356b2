//! A protobuf writer for the tests: just enough to build the messages the server sends,
//! and the few helpers the decoders' tests share.

use std::convert::Infallible;

use futures::Stream;

use super::schema::Resource;

/// The table's entry for Pods.
pub(crate) fn pods() -> &'static Resource {
    Resource::for_url("/api/v1/namespaces/x/pods").expect("pods are in the table")
}

/// The table's entry for ConfigMaps.
pub(crate) fn config_maps() -> &'static Resource {
    Resource::for_url("/api/v1/namespaces/x/configmaps").expect("configmaps are in the table")
}

/// `body` as a response body arriving in pieces of `size` bytes.
pub(crate) fn chunked(
    body: Vec<u8>,
    size: usize,
) -> impl Stream<Item = Result<Vec<u8>, Infallible>> {
    let pieces: Vec<_> = body.chunks(size).map(|c| Ok(c.to_vec())).collect();
    futures::stream::iter(pieces)
}

/// A message under construction.
#[derive(Default, Clone)]
pub(crate) struct Msg(pub(crate) Vec<u8>);

pub(crate) fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

impl Msg {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn varint(mut self, number: u32, v: u64) -> Self {
        self.0.extend(varint(u64::from(number) << 3));
        self.0.extend(varint(v));
        self
    }

    pub(crate) fn fixed64(mut self, number: u32, v: u64) -> Self {
        self.0.extend(varint((u64::from(number) << 3) | 1));
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(crate) fn bytes(mut self, number: u32, b: &[u8]) -> Self {
        self.0.extend(varint((u64::from(number) << 3) | 2));
        self.0.extend(varint(b.len() as u64));
        self.0.extend_from_slice(b);
        self
    }

    pub(crate) fn str(self, number: u32, s: &str) -> Self {
        self.bytes(number, s.as_bytes())
    }

    pub(crate) fn msg(self, number: u32, m: &Msg) -> Self {
        self.bytes(number, &m.0)
    }

    /// A `map<string, string>` entry; `None` leaves the value out, as for an empty one.
    pub(crate) fn entry(self, number: u32, key: &str, value: Option<&[u8]>) -> Self {
        let mut entry = Msg::new().str(1, key);
        if let Some(v) = value {
            entry = entry.bytes(2, v);
        }
        self.msg(number, &entry)
    }
}

/// `k8s\0` + `runtime.Unknown{typeMeta, raw}`.
pub(crate) fn envelope(api_version: &str, kind: &str, raw: &Msg) -> Vec<u8> {
    let unknown = Msg::new()
        .msg(1, &Msg::new().str(1, api_version).str(2, kind))
        .msg(2, raw)
        .str(3, "")
        .str(4, "");
    [b"k8s\0".as_slice(), &unknown.0].concat()
}
