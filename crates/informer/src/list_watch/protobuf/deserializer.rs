//! A serde [`Deserializer`] over Kubernetes protobuf, steered by the generated schema.
//!
//! Each message is presented as the JSON object its Go type marshals to, so any type that
//! deserializes from the API server's JSON (`k8s-openapi`'s, `DynamicObject`,
//! `serde_json::Value`) deserializes from protobuf with no code of its own: keys are the JSON
//! names, `omitempty` zeros are left out, inline structs are flattened, and the well-known
//! types (times, quantities, int-or-strings, raw JSON) take their JSON spelling.
//!
//! Nothing is copied on the way: strings are lent from the input, and repeated fields are
//! walked in place.

use serde::de::{
    self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor,
    value::{BorrowedStrDeserializer, MapAccessDeserializer, UnitDeserializer},
};

use super::{
    error::ProtobufError,
    schema::{Cardinality, Field, Message, Shape, Value},
    well_known,
    wire::{Raw, Reader, WireType, utf8},
};
use crate::list_watch::LAZY_OBJECT_TOKEN;

/// `apiVersion` and `kind` from the envelope, emitted first as JSON watch events carry them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TypeMeta<'de> {
    pub(crate) api_version: &'de str,
    pub(crate) kind: &'de str,
}

/// The protobuf name of `managedFields`' field sets.
pub(crate) const FIELDS_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1";

/// Whether the field sets of `managedFields` (`FieldsV1`, JSON in the protobuf) are parsed
/// where they are met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldSets {
    Parse,
    /// Each non-empty one reads as JSON `null`, for the caller to fill in from a memo
    /// (see `field_sets`): parsing them is a third of decoding a Pod.
    Defer,
}

/// Deserializes one message's bytes into `T`.
pub(crate) fn from_message<'de, T: de::Deserialize<'de>>(
    bytes: &'de [u8],
    message: &'static Message,
    type_meta: Option<TypeMeta<'de>>,
) -> Result<T, ProtobufError> {
    from_message_with(bytes, message, type_meta, FieldSets::Parse)
}

/// [`from_message`], with field sets read as `field_sets` says.
pub(crate) fn from_message_with<'de, T: de::Deserialize<'de>>(
    bytes: &'de [u8],
    message: &'static Message,
    type_meta: Option<TypeMeta<'de>>,
    field_sets: FieldSets,
) -> Result<T, ProtobufError> {
    T::deserialize(MessageDeserializer {
        bytes,
        message,
        type_meta,
        field_sets,
    })
}

/// One message, in the JSON shape of its Go type.
struct MessageDeserializer<'de> {
    bytes: &'de [u8],
    message: &'static Message,
    type_meta: Option<TypeMeta<'de>>,
    field_sets: FieldSets,
}

impl<'de> MessageDeserializer<'de> {
    fn nested(bytes: &'de [u8], message: &'static Message, field_sets: FieldSets) -> Self {
        Self {
            bytes,
            message,
            type_meta: None,
            field_sets,
        }
    }

    /// Shapes whose zero value is JSON `null`.
    fn is_null(&self) -> bool {
        match self.message.shape {
            Shape::Time | Shape::MicroTime => self.bytes.is_empty(),
            // Without its `raw` bytes (only fields this reader does not know), the message
            // is Go's `Raw == nil`, which writes as JSON `null`: absent, as the JSON path
            // reads it, not a present `null`.
            Shape::RawJson => matches!(self.scalars::<1>(), Ok([None | Some(Raw::Len(&[]))])),
            _ => false,
        }
    }

    /// The fields of a small fixed-layout message, by number; later values win.
    fn scalars<const N: usize>(&self) -> Result<[Option<Raw<'de>>; N], ProtobufError> {
        let mut out = [None; N];
        let mut reader = Reader::new(self.bytes);
        while !reader.is_empty() {
            let (number, wire) = reader.tag()?;
            let raw = reader.value(wire)?;
            if let Some(slot) = (number as usize)
                .checked_sub(1)
                .and_then(|i| out.get_mut(i))
            {
                *slot = Some(raw);
            }
        }
        Ok(out)
    }

    fn mismatch(&self, field: &'static str, expected: &'static str) -> ProtobufError {
        ProtobufError::Mismatch {
            message: self.message.name,
            field,
            expected,
        }
    }

    fn varint(&self, raw: Option<Raw<'de>>, field: &'static str) -> Result<u64, ProtobufError> {
        match raw {
            None => Ok(0),
            Some(Raw::Varint(v)) => Ok(v),
            Some(_) => Err(self.mismatch(field, "a varint")),
        }
    }

    fn string(
        &self,
        raw: Option<Raw<'de>>,
        field: &'static str,
    ) -> Result<&'de str, ProtobufError> {
        match raw {
            None => Ok(""),
            Some(Raw::Len(b)) => utf8(b, field),
            Some(_) => Err(self.mismatch(field, "a string")),
        }
    }

    fn time(&self, fraction_digits: u32) -> Result<well_known::Rfc3339, ProtobufError> {
        let [seconds, nanos] = self.scalars::<2>()?;
        let seconds = self.varint(seconds, "seconds")? as i64;
        let nanos = self.varint(nanos, "nanos")? as i32;
        Ok(well_known::rfc3339(seconds, nanos, fraction_digits))
    }
}

impl<'de> Deserializer<'de> for MessageDeserializer<'de> {
    type Error = ProtobufError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ProtobufError> {
        if self.is_null() {
            return visitor.visit_unit();
        }
        match self.message.shape {
            Shape::Object => visitor.visit_map(ObjectAccess::new(
                self.bytes,
                self.message,
                self.type_meta,
                self.field_sets,
            )),
            Shape::Time => visitor.visit_str(self.time(0)?.as_str()),
            Shape::MicroTime => visitor.visit_str(self.time(6)?.as_str()),
            Shape::Duration => {
                let [nanos] = self.scalars::<1>()?;
                visitor.visit_string(well_known::go_duration(
                    self.varint(nanos, "duration")? as i64
                ))
            }
            Shape::Quantity => {
                let [string] = self.scalars::<1>()?;
                match self.string(string, "string")? {
                    "" => visitor.visit_borrowed_str("0"),
                    s => visitor.visit_borrowed_str(s),
                }
            }
            Shape::IntOrString => {
                let [kind, int_val, str_val] = self.scalars::<3>()?;
                if self.varint(kind, "type")? == 1 {
                    visitor.visit_borrowed_str(self.string(str_val, "strVal")?)
                } else {
                    visitor.visit_i32(self.varint(int_val, "intVal")? as i32)
                }
            }
            Shape::RawJson => {
                let [raw] = self.scalars::<1>()?;
                match raw {
                    None | Some(Raw::Len(&[])) => visitor.visit_unit(),
                    Some(Raw::Len(_))
                        if self.field_sets == FieldSets::Defer
                            && self.message.name == FIELDS_V1 =>
                    {
                        visitor.visit_unit()
                    }
                    Some(Raw::Len(json)) => {
                        // Whole, as `serde_json::from_slice` reads it (and so the field-set
                        // memo): bytes after the value are an error, not ignored.
                        let mut json = serde_json::Deserializer::from_slice(json);
                        json.deserialize_any(visitor)
                            .and_then(|value| json.end().map(|()| value))
                            .map_err(|e| {
                                ProtobufError::Custom(format!(
                                    "embedded JSON in {}: {e}",
                                    self.message.name
                                ))
                            })
                    }
                    Some(_) => Err(self.mismatch("raw", "bytes")),
                }
            }
            Shape::Array => {
                let field = self
                    .message
                    .fields
                    .first()
                    .ok_or(ProtobufError::Malformed("array without items"))?;
                visitor.visit_seq(RunAccess::new(
                    self.bytes,
                    self.message,
                    field,
                    self.field_sets,
                ))
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ProtobufError> {
        if self.is_null() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    /// A [`LazyObject`](crate::list_watch::LazyObject) asks for the message's own bytes by name; every
    /// other newtype wraps the message.
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, ProtobufError> {
        if name == LAZY_OBJECT_TOKEN && self.message.shape == Shape::Object {
            visitor.visit_borrowed_bytes(self.bytes)
        } else {
            visitor.visit_newtype_struct(self)
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, ProtobufError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct enum identifier
    }
}

/// One field's value.
struct ValueDeserializer<'de> {
    message: &'static Message,
    field: &'static str,
    value: Value,
    raw: Raw<'de>,
    field_sets: FieldSets,
}

impl<'de> ValueDeserializer<'de> {
    fn new(
        message: &'static Message,
        field: &'static Field,
        raw: Raw<'de>,
        field_sets: FieldSets,
    ) -> Self {
        Self {
            message,
            field: field.json,
            value: field.value,
            raw,
            field_sets,
        }
    }

    fn mismatch(&self, expected: &'static str) -> ProtobufError {
        ProtobufError::Mismatch {
            message: self.message.name,
            field: self.field,
            expected,
        }
    }

    fn len(&self) -> Result<&'de [u8], ProtobufError> {
        match self.raw {
            Raw::Len(b) => Ok(b),
            _ => Err(self.mismatch("a length-delimited value")),
        }
    }

    fn varint(&self) -> Result<u64, ProtobufError> {
        match self.raw {
            Raw::Varint(v) => Ok(v),
            _ => Err(self.mismatch("a varint")),
        }
    }
}

impl<'de> Deserializer<'de> for ValueDeserializer<'de> {
    type Error = ProtobufError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ProtobufError> {
        match self.value {
            Value::String => visitor.visit_borrowed_str(utf8(self.len()?, self.field)?),
            Value::Bytes => visitor.visit_string(well_known::base64(self.len()?)),
            Value::Bool => visitor.visit_bool(self.varint()? != 0),
            // Negative int32s are sign-extended to 64 bits on the wire; truncation undoes it.
            Value::Int32 => visitor.visit_i32(self.varint()? as i32),
            Value::Int64 => visitor.visit_i64(self.varint()? as i64),
            Value::Uint32 | Value::Uint64 => visitor.visit_u64(self.varint()?),
            Value::Double => match self.raw {
                Raw::Fixed64(bits) => visitor.visit_f64(f64::from_bits(bits)),
                _ => Err(self.mismatch("a 64-bit double")),
            },
            Value::Message(m) => MessageDeserializer::nested(self.len()?, m, self.field_sets)
                .deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ProtobufError> {
        match self.value {
            Value::Message(m) => MessageDeserializer::nested(self.len()?, m, self.field_sets)
                .deserialize_option(visitor),
            _ => visitor.visit_some(self),
        }
    }

    /// Enums read from strings (`"Failure"`), as serde_json reads them; an enum from an
    /// object takes its single key as the variant.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, ProtobufError> {
        match self.value {
            Value::String => BorrowedStrDeserializer::new(utf8(self.len()?, self.field)?)
                .deserialize_enum(name, variants, visitor),
            Value::Message(m) if m.shape == Shape::Object => {
                visitor.visit_enum(MapAccessDeserializer::new(ObjectAccess::new(
                    self.len()?,
                    m,
                    None,
                    self.field_sets,
                )))
            }
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, ProtobufError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, ProtobufError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier
    }
}

/// The position in one message whose fields are being emitted.
struct Frame<'de> {
    reader: Reader<'de>,
    message: &'static Message,
    /// Fields (by index) seen so far: a second run of a repeated field is an error, and
    /// nullable fields never seen are emitted as `null` at the end.
    seen: u128,
    /// Once the bytes are read, the next field to consider for a `null`.
    nulls_from: usize,
}

impl<'de> Frame<'de> {
    fn new(bytes: &'de [u8], message: &'static Message) -> Self {
        Self {
            reader: Reader::new(bytes),
            message,
            seen: 0,
            nulls_from: 0,
        }
    }

    /// Marks field `index` seen; whether it was already.
    fn see(&mut self, index: usize) -> bool {
        if index >= 128 {
            return false;
        }
        let bit = 1u128 << index;
        let before = self.seen & bit != 0;
        self.seen |= bit;
        before
    }

    /// The next nullable field the message never held, to be emitted as `null`.
    fn next_null(&mut self) -> Option<&'static Field> {
        let pending = self.message.nullable & !self.seen;
        let rest = pending.checked_shr(self.nulls_from as u32).unwrap_or(0);
        if rest == 0 {
            return None;
        }
        let index = self.nulls_from + rest.trailing_zeros() as usize;
        self.nulls_from = index + 1;
        self.message.fields.get(index)
    }
}

/// What the last key's value is.
enum Pending<'de> {
    Null,
    Str(&'de str),
    Value(&'static Message, &'static Field, Raw<'de>),
    Run(&'static Message, &'static Field, &'de [u8]),
}

/// A message's fields as JSON object entries, inline structs flattened into it.
struct ObjectAccess<'de> {
    frame: Frame<'de>,
    /// The frames an inline struct interrupted.
    outer: Vec<Frame<'de>>,
    type_meta: Option<TypeMeta<'de>>,
    /// The envelope's kind, emitted right after its `apiVersion`.
    kind: Option<&'de str>,
    pending: Option<Pending<'de>>,
    field_sets: FieldSets,
}

impl<'de> ObjectAccess<'de> {
    fn new(
        bytes: &'de [u8],
        message: &'static Message,
        type_meta: Option<TypeMeta<'de>>,
        field_sets: FieldSets,
    ) -> Self {
        Self {
            frame: Frame::new(bytes, message),
            outer: Vec::new(),
            type_meta,
            kind: None,
            pending: None,
            field_sets,
        }
    }

    /// Advances to the next field JSON shows, returning its key.
    fn advance(&mut self) -> Result<Option<&'static str>, ProtobufError> {
        if let Some(meta) = self.type_meta.take() {
            self.pending = Some(Pending::Str(meta.api_version));
            self.kind = Some(meta.kind);
            return Ok(Some("apiVersion"));
        }
        if let Some(kind) = self.kind.take() {
            self.pending = Some(Pending::Str(kind));
            return Ok(Some("kind"));
        }
        loop {
            if self.frame.reader.is_empty() {
                if let Some(field) = self.frame.next_null() {
                    self.pending = Some(Pending::Null);
                    return Ok(Some(field.json));
                }
                match self.outer.pop() {
                    Some(frame) => {
                        self.frame = frame;
                        continue;
                    }
                    None => return Ok(None),
                }
            }
            let frame = &mut self.frame;
            let start = frame.reader.position();
            let (number, wire) = frame.reader.tag()?;
            let message = frame.message;
            let Some((index, field)) = message.field(number) else {
                frame.reader.value(wire)?;
                continue;
            };
            let seen_before = frame.see(index);
            match field.cardinality {
                // Protobuf merges a second occurrence into the first, JSON readers keep
                // one of two keys (serde_json's `Value` the last, derived structs
                // neither): the API server never writes one, so it is refused, and every
                // target type reads the same message the same way.
                Cardinality::Single if seen_before => {
                    return Err(ProtobufError::Mismatch {
                        message: message.name,
                        field: field.json,
                        expected: "a single occurrence",
                    });
                }
                Cardinality::Single => {
                    let raw = frame.reader.value(wire)?;
                    if field.inline {
                        let (Raw::Len(bytes), Value::Message(inner)) = (raw, field.value) else {
                            return Err(ProtobufError::Mismatch {
                                message: message.name,
                                field: field.json,
                                expected: "an embedded message",
                            });
                        };
                        let inner = Frame::new(bytes, inner);
                        self.outer.push(std::mem::replace(&mut self.frame, inner));
                        continue;
                    }
                    if field.omit_empty && raw.is_zero() {
                        continue;
                    }
                    self.pending = Some(Pending::Value(message, field, raw));
                }
                Cardinality::Repeated | Cardinality::Map => {
                    if seen_before {
                        return Err(ProtobufError::SplitRun {
                            message: message.name,
                            field: field.json,
                        });
                    }
                    let run = frame.reader.run(start, number, wire)?;
                    self.pending = Some(Pending::Run(message, field, run));
                }
            }
            return Ok(Some(field.json));
        }
    }
}

impl<'de> MapAccess<'de> for ObjectAccess<'de> {
    type Error = ProtobufError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, ProtobufError> {
        match self.advance()? {
            Some(key) => seed
                .deserialize(BorrowedStrDeserializer::new(key))
                .map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, ProtobufError> {
        match self.pending.take() {
            Some(Pending::Null) => seed.deserialize(UnitDeserializer::new()),
            Some(Pending::Str(s)) => seed.deserialize(BorrowedStrDeserializer::new(s)),
            Some(Pending::Value(message, field, raw)) => {
                seed.deserialize(ValueDeserializer::new(message, field, raw, self.field_sets))
            }
            Some(Pending::Run(message, field, run)) => match field.cardinality {
                Cardinality::Map => seed.deserialize(RunDeserializer::Map(MapRunAccess::new(
                    run,
                    message,
                    field,
                    self.field_sets,
                ))),
                _ => seed.deserialize(RunDeserializer::Seq(RunAccess::new(
                    run,
                    message,
                    field,
                    self.field_sets,
                ))),
            },
            None => Err(ProtobufError::Malformed("value requested before its key")),
        }
    }
}

/// A repeated field or a map, as a JSON array or object.
enum RunDeserializer<'de> {
    Seq(RunAccess<'de>),
    Map(MapRunAccess<'de>),
}

impl<'de> Deserializer<'de> for RunDeserializer<'de> {
    type Error = ProtobufError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ProtobufError> {
        match self {
            RunDeserializer::Seq(seq) => visitor.visit_seq(seq),
            RunDeserializer::Map(map) => visitor.visit_map(map),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, ProtobufError> {
        visitor.visit_some(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, ProtobufError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
    }
}

/// The elements of a repeated field, tags included; packed scalars are unpacked.
struct RunAccess<'de> {
    reader: Reader<'de>,
    message: &'static Message,
    field: &'static Field,
    packed: Option<Reader<'de>>,
    field_sets: FieldSets,
}

impl<'de> RunAccess<'de> {
    fn new(
        run: &'de [u8],
        message: &'static Message,
        field: &'static Field,
        field_sets: FieldSets,
    ) -> Self {
        Self {
            reader: Reader::new(run),
            message,
            field,
            packed: None,
            field_sets,
        }
    }

    fn element<T: DeserializeSeed<'de>>(
        &self,
        seed: T,
        raw: Raw<'de>,
    ) -> Result<T::Value, ProtobufError> {
        seed.deserialize(ValueDeserializer::new(
            self.message,
            self.field,
            raw,
            self.field_sets,
        ))
    }
}

impl<'de> SeqAccess<'de> for RunAccess<'de> {
    type Error = ProtobufError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, ProtobufError> {
        loop {
            if let Some(packed) = self.packed.as_mut() {
                if !packed.is_empty() {
                    let wire = match self.field.value {
                        Value::Double => WireType::Fixed64,
                        _ => WireType::Varint,
                    };
                    let raw = packed.value(wire)?;
                    return self.element(seed, raw).map(Some);
                }
                self.packed = None;
            }
            if self.reader.is_empty() {
                return Ok(None);
            }
            let (_, wire) = self.reader.tag()?;
            let raw = self.reader.value(wire)?;
            let scalar = !matches!(
                self.field.value,
                Value::String | Value::Bytes | Value::Message(_)
            );
            match raw {
                Raw::Len(bytes) if scalar => self.packed = Some(Reader::new(bytes)),
                raw => return self.element(seed, raw).map(Some),
            }
        }
    }
}

/// The entries of a map field (`{key = 1, value = 2}` messages) as a JSON object.
struct MapRunAccess<'de> {
    reader: Reader<'de>,
    message: &'static Message,
    field: &'static Field,
    value: Option<Raw<'de>>,
    field_sets: FieldSets,
}

impl<'de> MapRunAccess<'de> {
    fn new(
        run: &'de [u8],
        message: &'static Message,
        field: &'static Field,
        field_sets: FieldSets,
    ) -> Self {
        Self {
            reader: Reader::new(run),
            message,
            field,
            value: None,
            field_sets,
        }
    }

    /// The value an entry without one holds: the type's zero.
    fn zero(&self) -> Raw<'de> {
        match self.field.value {
            Value::Bool | Value::Int32 | Value::Int64 | Value::Uint32 | Value::Uint64 => {
                Raw::Varint(0)
            }
            Value::Double => Raw::Fixed64(0),
            Value::String | Value::Bytes | Value::Message(_) => Raw::Len(&[]),
        }
    }
}

impl<'de> MapAccess<'de> for MapRunAccess<'de> {
    type Error = ProtobufError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, ProtobufError> {
        if self.reader.is_empty() {
            return Ok(None);
        }
        let (_, wire) = self.reader.tag()?;
        let Raw::Len(entry) = self.reader.value(wire)? else {
            return Err(ProtobufError::Mismatch {
                message: self.message.name,
                field: self.field.json,
                expected: "map entries",
            });
        };
        let mut key = "";
        let mut value = self.zero();
        let mut reader = Reader::new(entry);
        while !reader.is_empty() {
            let (number, wire) = reader.tag()?;
            match (number, reader.value(wire)?) {
                (1, Raw::Len(k)) => {
                    key = utf8(k, self.field.json)?;
                }
                (2, raw) => value = raw,
                _ => {}
            }
        }
        self.value = Some(value);
        seed.deserialize(BorrowedStrDeserializer::new(key))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, ProtobufError> {
        let raw = self.value.take().ok_or(ProtobufError::Malformed(
            "map value requested before its key",
        ))?;
        seed.deserialize(ValueDeserializer::new(
            self.message,
            self.field,
            raw,
            self.field_sets,
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value as Json, json};

    use super::*;
    use crate::list_watch::protobuf::{
        schema::{Field, Message, Shape, Value},
        test_encoder::{self, Msg},
    };

    static INNER: Message = Message::new(
        "test.Inner",
        Shape::Object,
        &[Field::single(1, "inner", Value::String).omit_empty()],
    );
    static TIME: Message = Message::new("test.Time", Shape::Time, &[]);
    static MICRO_TIME: Message = Message::new("test.MicroTime", Shape::MicroTime, &[]);
    static QUANTITY: Message = Message::new("test.Quantity", Shape::Quantity, &[]);
    static INT_OR_STRING: Message = Message::new("test.IntOrString", Shape::IntOrString, &[]);
    static RAW: Message = Message::new("test.Raw", Shape::RawJson, &[]);
    static DURATION: Message = Message::new("test.Duration", Shape::Duration, &[]);
    static EXTRA: Message = Message::new(
        "test.Extra",
        Shape::Array,
        &[Field::repeated(1, "items", Value::String)],
    );
    static OUTER: Message = Message::new(
        "test.Outer",
        Shape::Object,
        &[
            Field::single(1, "name", Value::String).omit_empty(),
            Field::single(2, "count", Value::Int32).omit_empty(),
            Field::single(3, "Inner", Value::Message(&INNER)).inline(),
            Field::repeated(4, "tags", Value::String),
            Field::map(5, "labels", Value::String),
            Field::repeated(6, "ports", Value::Int32),
            Field::single(7, "created", Value::Message(&TIME)).omit_empty(),
            Field::single(8, "enabled", Value::Bool),
            Field::repeated(9, "items", Value::String).nullable(),
            Field::single(10, "quantity", Value::Message(&QUANTITY)),
            Field::single(11, "port", Value::Message(&INT_OR_STRING)),
            Field::single(12, "raw", Value::Message(&RAW)),
            Field::map(13, "data", Value::Bytes),
            Field::single(14, "renewed", Value::Message(&MICRO_TIME)),
            Field::single(15, "deleted", Value::Message(&TIME)),
            Field::single(16, "every", Value::Message(&DURATION)),
            Field::map(17, "extra", Value::Message(&EXTRA)),
            Field::single(18, "ratio", Value::Double),
            Field::single(19, "offset", Value::Int64),
        ],
    );

    fn decode(m: &Msg) -> Result<Json, ProtobufError> {
        from_message(&m.0, &OUTER, None)
    }

    #[test]
    fn messages_read_as_the_json_of_their_go_type() {
        let packed: Vec<u8> = [1u64, 2, u64::MAX]
            .iter()
            .flat_map(|v| test_encoder::varint(*v))
            .collect();
        let m = Msg::new()
            .str(1, "web")
            .varint(2, 0)
            .msg(3, &Msg::new().str(1, "flattened"))
            .str(4, "a")
            .str(4, "b")
            .entry(5, "app", Some(b"web"))
            .entry(5, "empty", None)
            .bytes(6, &packed)
            .varint(6, 443)
            .msg(7, &Msg::new().varint(1, 1_780_000_000).varint(2, 0))
            .varint(8, 0)
            .msg(10, &Msg::new().str(1, "500m"))
            .msg(11, &Msg::new().varint(1, 1).varint(2, 0).str(3, "http"))
            .msg(12, &Msg::new().bytes(1, br#"{"a":[1,null,"x"],"b":{}}"#))
            .entry(13, "bin", Some(&[0, 1, 0xff]))
            .msg(
                14,
                &Msg::new().varint(1, 1_780_000_000).varint(2, 123_456_789),
            )
            .msg(15, &Msg::new())
            .msg(16, &Msg::new().varint(1, 90_000_000_000))
            .msg(
                17,
                &Msg::new()
                    .str(1, "scopes")
                    .msg(2, &Msg::new().str(1, "a").str(1, "b")),
            )
            .fixed64(18, 1.5f64.to_bits())
            .varint(19, (-7i64) as u64);
        let expected = json!({
            "name": "web",
            "inner": "flattened",
            "tags": ["a", "b"],
            "labels": { "app": "web", "empty": "" },
            "ports": [1, 2, -1, 443],
            "created": "2026-05-28T20:26:40Z",
            "enabled": false,
            "items": null,
            "quantity": "500m",
            "port": "http",
            "raw": { "a": [1, null, "x"], "b": {} },
            "data": { "bin": "AAH/" },
            "renewed": "2026-05-28T20:26:40.123456Z",
            "deleted": null,
            "every": "1m30s",
            "extra": { "scopes": ["a", "b"] },
            "ratio": 1.5,
            "offset": -7,
        });
        assert_eq!(decode(&m).unwrap(), expected);
    }

    #[test]
    fn zero_values_json_omits_are_left_out_and_others_kept() {
        let m = Msg::new()
            .str(1, "")
            .varint(2, 0)
            .varint(8, 0)
            .msg(7, &Msg::new());
        assert_eq!(
            decode(&m).unwrap(),
            json!({ "enabled": false, "items": null })
        );
        let m = Msg::new().msg(11, &Msg::new().varint(1, 0).varint(2, 8080));
        assert_eq!(decode(&m).unwrap()["port"], json!(8080));
    }

    #[test]
    fn every_nullable_field_never_held_reads_null_and_no_other() {
        static NULLS: Message = Message::new(
            "test.Nulls",
            Shape::Object,
            &[
                Field::repeated(1, "first", Value::String).nullable(),
                Field::single(2, "plain", Value::String).omit_empty(),
                Field::map(3, "held", Value::String).nullable(),
                Field::repeated(4, "absent", Value::String),
                Field::single(5, "pointer", Value::Message(&INNER)).nullable(),
                Field::repeated(6, "last", Value::String).nullable(),
            ],
        );
        let m = Msg::new().str(2, "x").entry(3, "k", Some(b"v"));
        let value: Json = from_message(&m.0, &NULLS, None).unwrap();
        assert_eq!(
            value,
            json!({ "plain": "x", "held": { "k": "v" }, "first": null, "pointer": null, "last": null })
        );
        let m = Msg::new().str(1, "a").str(6, "z");
        let value: Json = from_message(&m.0, &NULLS, None).unwrap();
        assert_eq!(
            value,
            json!({ "first": ["a"], "last": ["z"], "held": null, "pointer": null })
        );
    }

    #[test]
    fn the_envelope_type_comes_first() {
        let m = Msg::new().str(1, "x");
        let meta = TypeMeta {
            api_version: "v1",
            kind: "Thing",
        };
        let value: Json = from_message(&m.0, &OUTER, Some(meta)).unwrap();
        assert_eq!(
            value,
            json!({ "apiVersion": "v1", "kind": "Thing", "name": "x", "items": null })
        );
    }

    #[test]
    fn a_repeated_field_split_in_two_runs_is_an_error() {
        let m = Msg::new().str(4, "a").str(1, "web").str(4, "b");
        assert!(matches!(
            decode(&m),
            Err(ProtobufError::SplitRun { field: "tags", .. })
        ));
    }

    #[test]
    fn a_singular_field_given_twice_is_an_error_for_every_target_type() {
        // Found by the `protobuf_dynamic` fuzz target: an object's metadata, then an empty
        // one, read as an object without a name into `Value`, and refused by a struct.
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Typed {
            name: Option<String>,
        }
        let twice = [
            Msg::new().str(1, "web").str(1, "db"),
            Msg::new()
                .msg(3, &Msg::new().str(1, "x"))
                .msg(3, &Msg::new()),
            Msg::new()
                .msg(12, &Msg::new().bytes(1, b"{}"))
                .str(1, "web")
                .msg(12, &Msg::new()),
        ];
        for m in twice {
            assert!(
                matches!(decode(&m), Err(ProtobufError::Mismatch { .. })),
                "{:?}",
                decode(&m)
            );
            assert!(from_message::<Typed>(&m.0, &OUTER, None).is_err());
        }
        let pod = Msg::new()
            .msg(1, &Msg::new().str(1, "web"))
            .msg(1, &Msg::new());
        let pods = test_encoder::pods();
        assert!(from_message::<Json>(&pod.0, pods.item, None).is_err());
        assert!(from_message::<kube_core::DynamicObject>(&pod.0, pods.item, None).is_err());
    }

    #[test]
    fn embedded_json_with_bytes_after_its_value_is_an_error() {
        // Found by the `protobuf_dynamic` fuzz target: a field set followed by more bytes
        // read as its first value here, and as an error through the field-set memo.
        let m = Msg::new().msg(12, &Msg::new().bytes(1, br#"{"f:metadata":{}} {}"#));
        assert!(matches!(decode(&m), Err(ProtobufError::Custom(_))));
        let m = Msg::new().msg(12, &Msg::new().bytes(1, b"{\"a\":1} \n"));
        assert_eq!(
            decode(&m).unwrap()["raw"],
            json!({ "a": 1 }),
            "trailing space is fine"
        );
    }

    #[test]
    fn a_field_set_without_its_raw_bytes_is_absent_as_in_its_json() {
        // Found by the `protobuf_typed` fuzz target: a managed-fields entry whose
        // `fieldsV1` holds only a field this reader does not know read as
        // `Some(FieldsV1(null))`, while the JSON it presents (`"fieldsV1": null`) reads as
        // `None`.
        use k8s_openapi::api::core::v1::Pod;
        let entry = |fields: Msg| Msg::new().str(1, "kubectl").msg(7, &fields);
        let pod =
            |fields: Msg| Msg::new().msg(1, &Msg::new().str(1, "web").msg(17, &entry(fields)));
        let pods = test_encoder::pods();
        for fields in [
            Msg::new().varint(9, 1),
            Msg::new(),
            Msg::new().bytes(1, b""),
        ] {
            let m = pod(fields);
            let typed: Pod = from_message(&m.0, pods.item, None).unwrap();
            let json: Json = from_message(&m.0, pods.item, None).unwrap();
            assert_eq!(json["metadata"]["managedFields"][0]["fieldsV1"], Json::Null);
            let via_json: Pod = serde_json::from_value(json).unwrap();
            assert_eq!(typed, via_json);
            let managed = typed.metadata.managed_fields.unwrap();
            assert_eq!(managed[0].manager.as_deref(), Some("kubectl"));
            assert_eq!(managed[0].fields_v1, None);
        }
        let m = pod(Msg::new().bytes(1, br#"{"f:metadata":{}}"#).varint(9, 1));
        let typed: Pod = from_message(&m.0, pods.item, None).unwrap();
        let fields = typed.metadata.managed_fields.unwrap()[0].fields_v1.clone();
        assert_eq!(fields.unwrap().0, json!({ "f:metadata": {} }));
    }

    #[test]
    fn wrong_wire_types_and_bad_utf8_are_errors() {
        let m = Msg::new().varint(1, 5);
        assert!(matches!(
            decode(&m),
            Err(ProtobufError::Mismatch { field: "name", .. })
        ));
        let m = Msg::new().bytes(1, &[0xff, 0xfe]);
        assert!(matches!(
            decode(&m),
            Err(ProtobufError::Utf8 { field: "name" })
        ));
        let m = Msg::new().msg(12, &Msg::new().bytes(1, b"{not json"));
        assert!(matches!(decode(&m), Err(ProtobufError::Custom(_))));
    }

    #[test]
    fn every_truncation_is_an_error_or_a_shorter_message_never_a_panic() {
        let m = Msg::new()
            .str(1, "web")
            .msg(3, &Msg::new().str(1, "flattened"))
            .str(4, "a")
            .entry(5, "app", Some(b"web"))
            .msg(7, &Msg::new().varint(1, 1_780_000_000));
        for cut in 0..m.0.len() {
            let short = Msg(m.0[..cut].to_vec());
            let _ = decode(&short);
        }
        let mid_string = Msg(m.0[..4].to_vec());
        assert!(matches!(decode(&mid_string), Err(ProtobufError::Truncated)));
    }

    #[test]
    fn typed_targets_read_enums_options_and_newtypes() {
        #[derive(Debug, serde::Deserialize, PartialEq)]
        enum Phase {
            Running,
        }
        #[derive(Debug, serde::Deserialize, PartialEq)]
        struct Typed {
            name: Option<String>,
            created: Option<String>,
            deleted: Option<String>,
            tags: Vec<String>,
            items: Option<Vec<String>>,
            inner: Phase,
        }
        let m = Msg::new()
            .str(1, "web")
            .msg(3, &Msg::new().str(1, "Running"))
            .str(4, "a")
            .msg(7, &Msg::new().varint(1, 0))
            .msg(15, &Msg::new());
        let typed: Typed = from_message(&m.0, &OUTER, None).unwrap();
        assert_eq!(
            typed,
            Typed {
                name: Some("web".into()),
                created: Some("1970-01-01T00:00:00Z".into()),
                deleted: None,
                tags: vec!["a".into()],
                items: None,
                inner: Phase::Running,
            }
        );
    }
}
