//! Protobuf's wire format: varints, tags and length-delimited values.

use super::error::ProtobufError;

/// How a value is laid out on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireType {
    Varint,
    Fixed64,
    Len,
    Fixed32,
}

/// One value as read from the wire, not yet interpreted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Raw<'de> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Len(&'de [u8]),
}

impl Raw<'_> {
    /// Protobuf's zero value, which JSON leaves out under `omitempty`.
    pub(crate) fn is_zero(&self) -> bool {
        match *self {
            Raw::Varint(v) | Raw::Fixed64(v) => v == 0,
            Raw::Fixed32(v) => v == 0,
            Raw::Len(b) => b.is_empty(),
        }
    }
}

/// A cursor over one message's bytes.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'de> {
    bytes: &'de [u8],
    pos: usize,
}

impl<'de> Reader<'de> {
    pub(crate) fn new(bytes: &'de [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    #[inline]
    pub(crate) fn varint(&mut self) -> Result<u64, ProtobufError> {
        // Tags and the lengths of most strings fit in one byte.
        if let Some(&byte) = self.bytes.get(self.pos)
            && byte < 0x80
        {
            self.pos += 1;
            return Ok(u64::from(byte));
        }
        let (value, used) = varint(&self.bytes[self.pos..])?.ok_or(ProtobufError::Truncated)?;
        self.pos += used;
        Ok(value)
    }

    /// The next field's number and wire type.
    #[inline]
    pub(crate) fn tag(&mut self) -> Result<(u32, WireType), ProtobufError> {
        let key = self.varint()?;
        let number =
            u32::try_from(key >> 3).map_err(|_| ProtobufError::Malformed("field number"))?;
        let wire = match key & 7 {
            0 => WireType::Varint,
            1 => WireType::Fixed64,
            2 => WireType::Len,
            5 => WireType::Fixed32,
            other => return Err(ProtobufError::WireType(other as u8)),
        };
        if number == 0 {
            return Err(ProtobufError::Malformed("field number 0"));
        }
        Ok((number, wire))
    }

    #[inline]
    pub(crate) fn value(&mut self, wire: WireType) -> Result<Raw<'de>, ProtobufError> {
        Ok(match wire {
            WireType::Varint => Raw::Varint(self.varint()?),
            WireType::Fixed64 => Raw::Fixed64(u64::from_le_bytes(
                self.take(8)?.try_into().unwrap_or_default(),
            )),
            WireType::Fixed32 => Raw::Fixed32(u32::from_le_bytes(
                self.take(4)?.try_into().unwrap_or_default(),
            )),
            WireType::Len => {
                let len = usize::try_from(self.varint()?).map_err(|_| ProtobufError::Truncated)?;
                Raw::Len(self.take(len)?)
            }
        })
    }

    fn take(&mut self, n: usize) -> Result<&'de [u8], ProtobufError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(ProtobufError::Truncated)?;
        let taken = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(taken)
    }

    /// Reads the value of the field whose tag started at `start`, then every field right
    /// after it with the same number: a repeated field or a map, as the API server's
    /// encoders write them. The run is returned with its tags.
    pub(crate) fn run(
        &mut self,
        start: usize,
        number: u32,
        wire: WireType,
    ) -> Result<&'de [u8], ProtobufError> {
        self.value(wire)?;
        let mut end = self.pos;
        while !self.is_empty() {
            match self.tag()? {
                // Packed and unpacked elements of one field may mix.
                (n, w) if n == number => {
                    self.value(w)?;
                    end = self.pos;
                }
                _ => break,
            }
        }
        self.pos = end;
        Ok(&self.bytes[start..end])
    }
}

/// A string field's bytes as text.
pub(crate) fn utf8<'a>(bytes: &'a [u8], field: &'static str) -> Result<&'a str, ProtobufError> {
    std::str::from_utf8(bytes).map_err(|_| ProtobufError::Utf8 { field })
}

/// Decodes a varint at the start of `bytes`: its value and length, or `None` when `bytes`
/// ends inside it.
pub(crate) fn varint(bytes: &[u8]) -> Result<Option<(u64, usize)>, ProtobufError> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((value, i + 1)));
        }
    }
    if bytes.len() >= 10 {
        Err(ProtobufError::Malformed("varint longer than 10 bytes"))
    } else {
        Ok(None)
    }
}
