//! The shape of the generated table: how each Kubernetes protobuf message maps onto the JSON
//! that serde types (`k8s-openapi`'s, `DynamicObject`) deserialize from.

/// One protobuf message.
#[derive(Debug)]
pub(crate) struct Message {
    /// The full protobuf name, for error messages.
    pub(crate) name: &'static str,
    pub(crate) shape: Shape,
    /// Sorted by number.
    pub(crate) fields: &'static [Field],
    /// Bit `i` is set when field `i` is nullable (of the first 128), so a message's end
    /// finds the nulls to emit without walking all its fields.
    pub(crate) nullable: u128,
}

impl Message {
    pub(crate) const fn new(name: &'static str, shape: Shape, fields: &'static [Field]) -> Self {
        let mut nullable = 0u128;
        let mut i = 0;
        while i < fields.len() && i < 128 {
            if fields[i].nullable {
                nullable |= 1 << i;
            }
            i += 1;
        }
        Self {
            name,
            shape,
            fields,
            nullable,
        }
    }

    /// The field numbered `number` and its index.
    #[inline]
    pub(crate) fn field(&self, number: u32) -> Option<(usize, &'static Field)> {
        let fields: &'static [Field] = self.fields;
        // Most messages number their fields 1, 2, 3, ...: look where the number says first.
        let guess = (number as usize).wrapping_sub(1);
        if let Some(field) = fields.get(guess)
            && field.number == number
        {
            return Some((guess, field));
        }
        fields
            .binary_search_by_key(&number, |f| f.number)
            .ok()
            .map(|i| (i, &fields[i]))
    }
}

/// What a message's JSON looks like.
// The generator emits every shape a Go type can need; a Kubernetes version's listable kinds
// need not use them all.
#[allow(dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// An object of its fields.
    Object,
    /// `metav1.Time` `{seconds = 1, nanos = 2}`: an RFC 3339 string in whole seconds.
    Time,
    /// `metav1.MicroTime`: an RFC 3339 string with microseconds.
    MicroTime,
    /// `metav1.Duration` `{duration = 1}` in nanoseconds: Go's duration string (`1h2m3s`).
    Duration,
    /// `resource.Quantity` `{string = 1}`: the string.
    Quantity,
    /// `intstr.IntOrString` `{type = 1, intVal = 2, strVal = 3}`: a number or a string.
    IntOrString,
    /// `FieldsV1`, `RawExtension` `{raw = 1}`: the bytes are JSON already.
    RawJson,
    /// A named slice wrapped as `{repeated items = 1}` (`ExtraValue`): the array.
    Array,
}

/// One field of a message.
#[derive(Debug)]
pub(crate) struct Field {
    pub(crate) number: u32,
    /// The JSON key; for an inline field, the Go field name (never emitted).
    pub(crate) json: &'static str,
    pub(crate) value: Value,
    pub(crate) cardinality: Cardinality,
    /// JSON omits the zero value (`omitempty` on a non-pointer scalar, `omitzero` on a
    /// time), while protobuf always writes it.
    pub(crate) omit_empty: bool,
    /// Go embeds the struct with `json:",inline"`: its fields belong to this JSON object.
    pub(crate) inline: bool,
    /// JSON writes `null` when the field is absent (a nil slice, map or pointer without
    /// `omitempty`).
    pub(crate) nullable: bool,
}

impl Field {
    const fn new(number: u32, json: &'static str, value: Value, cardinality: Cardinality) -> Self {
        Self {
            number,
            json,
            value,
            cardinality,
            omit_empty: false,
            inline: false,
            nullable: false,
        }
    }

    pub(crate) const fn single(number: u32, json: &'static str, value: Value) -> Self {
        Self::new(number, json, value, Cardinality::Single)
    }

    pub(crate) const fn repeated(number: u32, json: &'static str, value: Value) -> Self {
        Self::new(number, json, value, Cardinality::Repeated)
    }

    /// A `map<string, value>`: entries `{key = 1, value = 2}`.
    pub(crate) const fn map(number: u32, json: &'static str, value: Value) -> Self {
        Self::new(number, json, value, Cardinality::Map)
    }

    pub(crate) const fn omit_empty(mut self) -> Self {
        self.omit_empty = true;
        self
    }

    pub(crate) const fn inline(mut self) -> Self {
        self.inline = true;
        self
    }

    pub(crate) const fn nullable(mut self) -> Self {
        self.nullable = true;
        self
    }
}

/// Single value, repeated, or a map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cardinality {
    Single,
    Repeated,
    Map,
}

/// The protobuf type of one value.
#[allow(dead_code)] // as for `Shape`
#[derive(Debug, Clone, Copy)]
pub(crate) enum Value {
    String,
    /// JSON has it in base64.
    Bytes,
    Bool,
    Int32,
    Int64,
    Uint32,
    Uint64,
    Double,
    Message(&'static Message),
}

/// A listable built-in resource.
#[derive(Debug)]
pub(crate) struct Resource {
    pub(crate) group: &'static str,
    pub(crate) version: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) list_kind: &'static str,
    pub(crate) item: &'static Message,
}

impl Resource {
    pub(crate) const fn new(
        group: &'static str,
        version: &'static str,
        plural: &'static str,
        kind: &'static str,
        list_kind: &'static str,
        item: &'static Message,
    ) -> Self {
        Self {
            group,
            version,
            plural,
            kind,
            list_kind,
            item,
        }
    }

    /// `group/version`, or `version` for the core group.
    pub(crate) fn api_version(&self) -> std::borrow::Cow<'static, str> {
        if self.group.is_empty() {
            self.version.into()
        } else {
            format!("{}/{}", self.group, self.version).into()
        }
    }
}
