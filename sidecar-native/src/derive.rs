//! The fields the derive stage reads from a span, read from a span the validating pass
//! accepted, with protobuf's merge semantics: the last occurrence of a scalar field
//! wins, a message field occurring twice is one message (`status`), and of `AnyValue`'s
//! oneof the member set last is the value. Fields are matched by their tag's value, so a
//! non-minimal tag encoding reads the same as the usual one byte.
//!
//! Besides attributes, the value of one attribute of an event may be asked for (an
//! event key: the event's name and the attribute's key): the value in the span's last
//! event of that name that has the key, for spans whose status is ERROR (None for the
//! others: event values are failure details).

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

/// The attribute keys asked for, with a quick test that rules most keys out by length,
/// and the event keys (event name, attribute key) whose values follow theirs.
pub struct Keys<'a> {
    keys: &'a [&'a [u8]],
    /// Bit `n` set: some key is `n` bytes long (bit 63: 63 bytes or longer).
    lengths: u64,
    events: &'a [(&'a [u8], &'a [u8])],
}

impl<'a> Keys<'a> {
    pub fn new(keys: &'a [&'a [u8]], events: &'a [(&'a [u8], &'a [u8])]) -> Self {
        let lengths = keys.iter().fold(0, |acc, k| acc | 1u64 << k.len().min(63));
        Keys {
            keys,
            lengths,
            events,
        }
    }

    /// How many values a span has: one per attribute key, then one per event key.
    pub fn len(&self) -> usize {
        self.keys.len() + self.events.len()
    }

    /// Whether a key of this length may be one asked for (false rules it out).
    #[inline(always)]
    pub fn maybe(&self, key_len: usize) -> bool {
        self.lengths & (1u64 << key_len.min(63)) != 0
    }

    /// Sets `values[i]` for every key `i` equal to `name`.
    #[inline]
    pub fn set(&self, name: &[u8], value: Value, values: &mut [Value]) {
        for (slot, wanted) in values.iter_mut().zip(self.keys) {
            if *wanted == name {
                *slot = value;
            }
        }
    }
}

/// The value of the AnyValue scalar member at `pos` in a validated message (one of the
/// one-byte tags `scan` reads in place).
#[inline]
pub fn member_value(buf: &[u8], pos: usize) -> Value {
    let mut value = Value::None;
    let end = skip(buf, u32::from(buf[pos]), pos + 1);
    any_value(buf, (pos, end), &mut value);
    value
}

/// Offset after the field whose tag (wire type `tag & 7`) ends at `pos`, in a validated
/// message `buf`.
#[inline(always)]
fn skip(buf: &[u8], tag: u32, pos: usize) -> usize {
    let next = match tag & 7 {
        3 => skip_group(buf, tag >> 3, pos, 0).ok(),
        wire_type => skip_value(buf, wire_type, pos),
    };
    next.unwrap_or(buf.len()) // validated: never None
}

#[inline(always)]
fn fixed64(buf: &[u8], pos: usize) -> u64 {
    buf.get(pos..pos + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The body of the length-delimited field whose length starts at `pos`.
#[inline(always)]
fn body(buf: &[u8], pos: usize) -> Range {
    wire::delimited(buf, pos).unwrap_or((buf.len(), buf.len()))
}

/// Reads the derive fields of the span whose body is `span`, and into `values[i]` the
/// value of its last attribute whose key is `keys[i]` (`Value::None` when it has none).
pub fn span(data: &[u8], span: Range, keys: &Keys<'_>, values: &mut [Value]) -> SpanFields {
    values.fill(Value::None);
    let mut out = SpanFields::default();
    let buf = &data[..span.1];
    let mut pos = span.0;
    while let Some((tag, next)) = wire::tag(buf, pos) {
        pos = match tag {
            0x0a => {
                out.trace_id = body(buf, next);
                out.trace_id.1
            }
            0x12 => {
                out.span_id = body(buf, next);
                out.span_id.1
            }
            0x2a => {
                out.name = body(buf, next);
                out.name.1
            }
            0x39 => {
                out.start_time = fixed64(buf, next);
                next + 8
            }
            0x41 => {
                out.end_time = fixed64(buf, next);
                next + 8
            }
            0x4a => {
                let kv = body(buf, next);
                if !keys.keys.is_empty() {
                    attribute(data, kv, keys, values);
                }
                kv.1
            }
            0x5a => {
                let ev = body(buf, next);
                if !keys.events.is_empty() {
                    event(data, ev, keys, values);
                }
                ev.1
            }
            0x7a => {
                let status = body(buf, next);
                status_code(data, status, &mut out.status_code);
                status.1
            }
            _ => skip(buf, tag, next),
        };
    }
    if out.status_code != STATUS_ERROR {
        values[keys.keys.len()..].fill(Value::None);
    }
    out
}

/// `Status.code` ERROR: the spans whose event values are read.
const STATUS_ERROR: i32 = 2;

/// Merges one Status occurrence: its `code` (int32: the varint's low 32 bits).
fn status_code(data: &[u8], status: Range, code: &mut i32) {
    let buf = &data[..status.1];
    let mut pos = status.0;
    while let Some((tag, next)) = wire::tag(buf, pos) {
        pos = if tag == 0x18 {
            let (value, after) = wire::varint(buf, next).unwrap_or((0, buf.len()));
            *code = value as u32 as i32;
            after
        } else {
            skip(buf, tag, next)
        };
    }
}

/// One Event (its body `ev`): for each event key whose event name is this event's
/// (merged: the last `name`), the value of its last attribute with that key, if it has
/// one, goes to the key's slot (after the attribute keys' slots). A later event with the
/// key overwrites an earlier one's value: the last event that has it wins.
fn event(data: &[u8], ev: Range, keys: &Keys<'_>, values: &mut [Value]) {
    let buf = &data[..ev.1];
    let mut name: Range = (0, 0);
    // Per event key: the value found in this event (the name may come after them).
    // Allocated only for a span with events, and only when event keys are asked for.
    let events = keys.events;
    let mut found: Vec<Option<Value>> = vec![None; events.len()];
    let mut pos = ev.0;
    while let Some((tag, next)) = wire::tag(buf, pos) {
        pos = match tag {
            0x12 => {
                name = body(buf, next);
                name.1
            }
            0x1a => {
                let kv = body(buf, next);
                let key = kv_key(data, kv);
                let key_bytes = &data[key.0..key.1];
                for (slot, (_, wanted)) in found.iter_mut().zip(events) {
                    if *wanted == key_bytes {
                        *slot = Some(value_of(data, kv));
                    }
                }
                kv.1
            }
            _ => skip(buf, tag, next),
        };
    }
    let name_bytes = &data[name.0..name.1];
    let first = keys.keys.len();
    for (j, (wanted_name, _)) in events.iter().enumerate() {
        if let Some(value) = found[j]
            && *wanted_name == name_bytes
        {
            values[first + j] = value;
        }
    }
}

/// The key of a KeyValue (its body `kv`; merged: the last `key`).
#[inline(always)]
fn kv_key(data: &[u8], kv: Range) -> Range {
    let buf = &data[..kv.1];
    // The common shape first: the key, then the value, nothing else.
    if buf.get(kv.0) == Some(&0x0a) {
        let key = body(buf, kv.0 + 1);
        if buf.get(key.1) == Some(&0x12) && body(buf, key.1 + 1).1 == kv.1 {
            return key;
        }
    }
    let mut key: Range = (0, 0);
    let mut pos = kv.0;
    while let Some((tag, next)) = wire::tag(buf, pos) {
        pos = if tag == 0x0a {
            key = body(buf, next);
            key.1
        } else {
            skip(buf, tag, next)
        };
    }
    key
}

/// One KeyValue: when its key is one of `keys`, its value goes to that slot.
#[inline(always)]
fn attribute(data: &[u8], kv: Range, keys: &Keys<'_>, values: &mut [Value]) {
    let key = kv_key(data, kv);
    if !keys.maybe(key.1 - key.0) {
        return;
    }
    let name = &data[key.0..key.1];
    let Some(first) = keys.keys.iter().position(|k| *k == name) else {
        return;
    };
    let value = value_of(data, kv);
    for (slot, wanted) in values.iter_mut().zip(keys.keys).skip(first) {
        if *wanted == name {
            *slot = value;
        }
    }
}

/// The value of a KeyValue: its AnyValue merged over every `value` occurrence.
fn value_of(data: &[u8], kv: Range) -> Value {
    let buf = &data[..kv.1];
    let mut value = Value::None;
    let mut pos = kv.0;
    while let Some((tag, next)) = wire::tag(buf, pos) {
        pos = if tag == 0x12 {
            let any = body(buf, next);
            any_value(data, any, &mut value);
            any.1
        } else {
            skip(buf, tag, next)
        };
    }
    value
}

/// Merges one AnyValue occurrence into `value`: each member field sets the oneof.
fn any_value(data: &[u8], any: Range, value: &mut Value) {
    let buf = &data[..any.1];
    let mut pos = any.0;
    while let Some((tag, next)) = wire::tag(buf, pos) {
        let varint = || wire::varint(buf, next).unwrap_or((0, buf.len()));
        pos = match tag {
            0x0a => {
                let s = body(buf, next);
                *value = Value::Str(s);
                s.1
            }
            0x10 => {
                let (v, after) = varint();
                *value = Value::Bool(v != 0);
                after
            }
            0x18 => {
                let (v, after) = varint();
                *value = Value::Int(v as i64);
                after
            }
            0x21 => {
                *value = Value::Double(f64::from_bits(fixed64(buf, next)));
                next + 8
            }
            0x2a | 0x32 => {
                *value = Value::None; // array_value, kvlist_value
                body(buf, next).1
            }
            0x3a => {
                let b = body(buf, next);
                *value = Value::Bytes(b);
                b.1
            }
            0x40 => {
                let (v, after) = varint(); // string_value_strindex, an int32
                *value = Value::Int(i64::from(v as u32 as i32));
                after
            }
            _ => skip(buf, tag, next),
        };
    }
}

/// Whether two values are equal as Python would see them (strings and bytes by content).
pub fn same(data: &[u8], a: Value, b: Value) -> bool {
    match (a, b) {
        (Value::Str(x), Value::Str(y)) | (Value::Bytes(x), Value::Bytes(y)) => {
            data[x.0..x.1] == data[y.0..y.1]
        }
        (Value::Double(x), Value::Double(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}
