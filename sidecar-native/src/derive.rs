//! The fields the derive stage reads from a span, read from a span the validating pass
//! accepted, with protobuf's merge semantics: the last occurrence of a scalar field
//! wins, a message field occurring twice is one message (`status`), and of `AnyValue`'s
//! oneof the member set last is the value.

use crate::scan::{Range, skip_group, skip_value};
use crate::wire;

/// An attribute's value as the scan reports it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// No such attribute, or its value is unset, an array or a kvlist (Python None).
    None,
    Str(Range),
    Bool(bool),
    Int(i64),
    Double(f64),
    Bytes(Range),
}

/// The derive fields of one span (ranges into the request; empty ranges are defaults).
#[derive(Debug, Default, PartialEq)]
pub struct SpanFields {
    pub name: Range,
    pub start_time: u64,
    pub end_time: u64,
    pub trace_id: Range,
    pub span_id: Range,
    pub status_code: i32,
}

/// A field of a validated message: (number, wire type, value start, field end, varint or
/// fixed value). Groups are skipped here, so none is returned.
struct Field {
    number: u32,
    wire_type: u32,
    value: u64,
    body: Range,
}

/// The fields of the validated message `buf[pos..]`, unknown groups skipped.
struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Iterator for Fields<'_> {
    type Item = Field;

    #[inline(always)]
    fn next(&mut self) -> Option<Field> {
        loop {
            let buf = self.buf;
            if self.pos >= buf.len() {
                return None;
            }
            let (tag, pos) = wire::tag(buf, self.pos)?;
            let number = tag >> 3;
            let wire_type = tag & 7;
            let mut field = Field {
                number,
                wire_type,
                value: 0,
                body: (pos, pos),
            };
            self.pos = match wire_type {
                0 => {
                    let (value, next) = wire::varint(buf, pos)?;
                    field.value = value;
                    next
                }
                1 => {
                    let bytes: [u8; 8] = buf.get(pos..pos + 8)?.try_into().ok()?;
                    field.value = u64::from_le_bytes(bytes);
                    pos + 8
                }
                2 => {
                    let (start, stop) = wire::delimited(buf, pos)?;
                    field.body = (start, stop);
                    stop
                }
                3 => {
                    self.pos = skip_group(buf, number, pos, 0).ok()?;
                    continue;
                }
                _ => skip_value(buf, wire_type, pos)?,
            };
            return Some(field);
        }
    }
}

fn fields(data: &[u8], range: Range) -> Fields<'_> {
    Fields {
        buf: &data[..range.1],
        pos: range.0,
    }
}

/// Reads the derive fields of the span whose body is `span`, and into `values[i]` the
/// value of its last attribute whose key is `keys[i]` (`Value::None` when it has none).
pub fn span(data: &[u8], span: Range, keys: &[&[u8]], values: &mut [Value]) -> SpanFields {
    values.fill(Value::None);
    let mut out = SpanFields::default();
    for f in fields(data, span) {
        match (f.number, f.wire_type) {
            (1, 2) => out.trace_id = f.body,
            (2, 2) => out.span_id = f.body,
            (5, 2) => out.name = f.body,
            (7, 1) => out.start_time = f.value,
            (8, 1) => out.end_time = f.value,
            (9, 2) if !keys.is_empty() => attribute(data, f.body, keys, values),
            (15, 2) => {
                for s in fields(data, f.body) {
                    if (s.number, s.wire_type) == (3, 0) {
                        out.status_code = s.value as u32 as i32; // int32: the low 32 bits
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// One KeyValue: when its key is one of `keys`, its value goes to that slot.
#[inline]
fn attribute(data: &[u8], kv: Range, keys: &[&[u8]], values: &mut [Value]) {
    let mut key: Range = (0, 0);
    let mut value = Value::None;
    for f in fields(data, kv) {
        match (f.number, f.wire_type) {
            (1, 2) => key = f.body,
            (2, 2) => any_value(data, f.body, &mut value),
            _ => {}
        }
    }
    let key = &data[key.0..key.1];
    for (slot, wanted) in values.iter_mut().zip(keys) {
        if *wanted == key {
            *slot = value;
        }
    }
}

/// Merges one AnyValue occurrence into `value`: each member field sets the oneof.
fn any_value(data: &[u8], body: Range, value: &mut Value) {
    for f in fields(data, body) {
        *value = match (f.number, f.wire_type) {
            (1, 2) => Value::Str(f.body),
            (2, 0) => Value::Bool(f.value != 0),
            (3, 0) => Value::Int(f.value as i64),
            (4, 1) => Value::Double(f64::from_bits(f.value)),
            (5 | 6, 2) => Value::None, // array_value, kvlist_value
            (7, 2) => Value::Bytes(f.body),
            (8, 0) => Value::Int(i64::from(f.value as u32 as i32)), // string_value_strindex
            _ => continue,
        };
    }
}
