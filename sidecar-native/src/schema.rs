//! The part of the OTLP schema the scanner knows: every message reachable from
//! `opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest`, and for each of
//! their fields the wire type it is read with.
//!
//! Compiled in from opentelemetry-proto's `.proto` files (the version the sidecar's lock
//! file pins). `schema()` in lib.rs hands this table to Python, where a test compares it
//! with the descriptors of the installed `opentelemetry-proto`: a new field there (for
//! example another `string` whose UTF-8 upb checks) fails that test, not a request.

/// A message type of the trace schema.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Msg {
    Request,
    ResourceSpans,
    Resource,
    EntityRef,
    ScopeSpans,
    Scope,
    Span,
    Event,
    Link,
    Status,
    KeyValue,
    AnyValue,
    ArrayValue,
    KeyValueList,
}

/// How a field is encoded: which wire type upb reads it with, and what it checks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// int32, int64, uint32, uint64, bool, enum: wire type 0.
    Varint,
    /// fixed64, double: wire type 1.
    Fixed64,
    /// fixed32: wire type 5.
    Fixed32,
    /// bytes: wire type 2, any content.
    Bytes,
    /// string: wire type 2, valid UTF-8 (proto3).
    Str,
    /// A message: wire type 2, parsed.
    Message(Msg),
}

impl Kind {
    /// The wire type upb expects; a field arriving with another one is an unknown field.
    #[inline(always)]
    pub fn wire_type(self) -> u32 {
        match self {
            Kind::Varint => 0,
            Kind::Fixed64 => 1,
            Kind::Fixed32 => 5,
            Kind::Bytes | Kind::Str | Kind::Message(_) => 2,
        }
    }
}

pub const ALL: [Msg; 14] = [
    Msg::Request,
    Msg::ResourceSpans,
    Msg::Resource,
    Msg::EntityRef,
    Msg::ScopeSpans,
    Msg::Scope,
    Msg::Span,
    Msg::Event,
    Msg::Link,
    Msg::Status,
    Msg::KeyValue,
    Msg::AnyValue,
    Msg::ArrayValue,
    Msg::KeyValueList,
];

/// The highest field number any message of the schema uses.
pub const MAX_FIELD: u32 = 16;

/// The field `number` of `msg`, or None for a field the schema does not have.
#[inline(always)]
pub fn field(msg: Msg, number: u32) -> Option<Kind> {
    use Kind::*;
    use Msg as M;
    Some(match (msg, number) {
        (M::Request, 1) => Message(M::ResourceSpans),

        (M::ResourceSpans, 1) => Message(M::Resource),
        (M::ResourceSpans, 2) => Message(M::ScopeSpans),
        (M::ResourceSpans, 3) => Str, // schema_url

        (M::Resource, 1) => Message(M::KeyValue), // attributes
        (M::Resource, 2) => Varint,               // dropped_attributes_count
        (M::Resource, 3) => Message(M::EntityRef),

        (M::EntityRef, 1..=4) => Str, // schema_url, type, id_keys, description_keys

        (M::ScopeSpans, 1) => Message(M::Scope),
        (M::ScopeSpans, 2) => Message(M::Span),
        (M::ScopeSpans, 3) => Str, // schema_url

        (M::Scope, 1 | 2) => Str,              // name, version
        (M::Scope, 3) => Message(M::KeyValue), // attributes
        (M::Scope, 4) => Varint,               // dropped_attributes_count

        (M::Span, 1 | 2 | 4) => Bytes, // trace_id, span_id, parent_span_id
        (M::Span, 3 | 5) => Str,       // trace_state, name
        (M::Span, 6) => Varint,        // kind
        (M::Span, 7 | 8) => Fixed64,   // start/end_time_unix_nano
        (M::Span, 9) => Message(M::KeyValue), // attributes
        (M::Span, 10 | 12 | 14) => Varint, // dropped_*_count
        (M::Span, 11) => Message(M::Event), // events
        (M::Span, 13) => Message(M::Link), // links
        (M::Span, 15) => Message(M::Status), // status
        (M::Span, 16) => Fixed32,      // flags

        (M::Event, 1) => Fixed64,              // time_unix_nano
        (M::Event, 2) => Str,                  // name
        (M::Event, 3) => Message(M::KeyValue), // attributes
        (M::Event, 4) => Varint,               // dropped_attributes_count

        (M::Link, 1 | 2) => Bytes,            // trace_id, span_id
        (M::Link, 3) => Str,                  // trace_state
        (M::Link, 4) => Message(M::KeyValue), // attributes
        (M::Link, 5) => Varint,               // dropped_attributes_count
        (M::Link, 6) => Fixed32,              // flags

        (M::Status, 2) => Str,    // message
        (M::Status, 3) => Varint, // code

        (M::KeyValue, 1) => Str,                  // key
        (M::KeyValue, 2) => Message(M::AnyValue), // value
        (M::KeyValue, 3) => Varint,               // key_strindex

        // AnyValue.value is a oneof of all eight.
        (M::AnyValue, 1) => Str,                      // string_value
        (M::AnyValue, 2 | 3 | 8) => Varint, // bool_value, int_value, string_value_strindex
        (M::AnyValue, 4) => Fixed64,        // double_value
        (M::AnyValue, 5) => Message(M::ArrayValue), // array_value
        (M::AnyValue, 6) => Message(M::KeyValueList), // kvlist_value
        (M::AnyValue, 7) => Bytes,          // bytes_value

        (M::ArrayValue, 1) => Message(M::AnyValue), // values
        (M::KeyValueList, 1) => Message(M::KeyValue), // values
        _ => return None,
    })
}

/// The field's name (its `.proto` name), for error messages and `schema()`.
pub fn field_name(msg: Msg, number: u32) -> &'static str {
    use Msg as M;
    match (msg, number) {
        (M::Request, 1) => "resource_spans",
        (M::ResourceSpans, 1) => "resource",
        (M::ResourceSpans, 2) => "scope_spans",
        (M::ResourceSpans | M::ScopeSpans, 3) | (M::EntityRef, 1) => "schema_url",
        (M::Resource | M::Scope | M::Span | M::Event, 1 | 3 | 9)
            if field(msg, number) == Some(Kind::Message(M::KeyValue)) =>
        {
            "attributes"
        }
        (M::Link, 4) => "attributes",
        (M::Resource | M::Scope | M::Event, 2 | 4) | (M::Span, 10) | (M::Link, 5)
            if field(msg, number) == Some(Kind::Varint) =>
        {
            "dropped_attributes_count"
        }
        (M::Resource, 3) => "entity_refs",
        (M::EntityRef, 2) => "type",
        (M::EntityRef, 3) => "id_keys",
        (M::EntityRef, 4) => "description_keys",
        (M::ScopeSpans, 1) => "scope",
        (M::ScopeSpans, 2) => "spans",
        (M::Scope, 1) | (M::Span, 5) | (M::Event, 2) => "name",
        (M::Scope, 2) => "version",
        (M::Span | M::Link, 1) => "trace_id",
        (M::Span | M::Link, 2) => "span_id",
        (M::Span | M::Link, 3) => "trace_state",
        (M::Span, 4) => "parent_span_id",
        (M::Span, 6) => "kind",
        (M::Span, 7) => "start_time_unix_nano",
        (M::Span, 8) => "end_time_unix_nano",
        (M::Span, 11) => "events",
        (M::Span, 12) => "dropped_events_count",
        (M::Span, 13) => "links",
        (M::Span, 14) => "dropped_links_count",
        (M::Span, 15) => "status",
        (M::Span | M::Link, 16 | 6) if field(msg, number) == Some(Kind::Fixed32) => "flags",
        (M::Event, 1) => "time_unix_nano",
        (M::Status, 2) => "message",
        (M::Status, 3) => "code",
        (M::KeyValue, 1) => "key",
        (M::KeyValue, 2) => "value",
        (M::KeyValue, 3) => "key_strindex",
        (M::AnyValue, 1) => "string_value",
        (M::AnyValue, 2) => "bool_value",
        (M::AnyValue, 3) => "int_value",
        (M::AnyValue, 4) => "double_value",
        (M::AnyValue, 5) => "array_value",
        (M::AnyValue, 6) => "kvlist_value",
        (M::AnyValue, 7) => "bytes_value",
        (M::AnyValue, 8) => "string_value_strindex",
        (M::ArrayValue | M::KeyValueList, 1) => "values",
        _ => "?",
    }
}

/// The message's protobuf full name.
pub fn full_name(msg: Msg) -> &'static str {
    match msg {
        Msg::Request => "opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest",
        Msg::ResourceSpans => "opentelemetry.proto.trace.v1.ResourceSpans",
        Msg::Resource => "opentelemetry.proto.resource.v1.Resource",
        Msg::EntityRef => "opentelemetry.proto.common.v1.EntityRef",
        Msg::ScopeSpans => "opentelemetry.proto.trace.v1.ScopeSpans",
        Msg::Scope => "opentelemetry.proto.common.v1.InstrumentationScope",
        Msg::Span => "opentelemetry.proto.trace.v1.Span",
        Msg::Event => "opentelemetry.proto.trace.v1.Span.Event",
        Msg::Link => "opentelemetry.proto.trace.v1.Span.Link",
        Msg::Status => "opentelemetry.proto.trace.v1.Status",
        Msg::KeyValue => "opentelemetry.proto.common.v1.KeyValue",
        Msg::AnyValue => "opentelemetry.proto.common.v1.AnyValue",
        Msg::ArrayValue => "opentelemetry.proto.common.v1.ArrayValue",
        Msg::KeyValueList => "opentelemetry.proto.common.v1.KeyValueList",
    }
}

/// The short name used in error messages (`Span`, `Span.Event`, ...).
pub fn short_name(msg: Msg) -> &'static str {
    match msg {
        Msg::Request => "ExportTraceServiceRequest",
        Msg::ResourceSpans => "ResourceSpans",
        Msg::Resource => "Resource",
        Msg::EntityRef => "EntityRef",
        Msg::ScopeSpans => "ScopeSpans",
        Msg::Scope => "InstrumentationScope",
        Msg::Span => "Span",
        Msg::Event => "Span.Event",
        Msg::Link => "Span.Link",
        Msg::Status => "Status",
        Msg::KeyValue => "KeyValue",
        Msg::AnyValue => "AnyValue",
        Msg::ArrayValue => "ArrayValue",
        Msg::KeyValueList => "KeyValueList",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_end_the_full_names() {
        for msg in ALL {
            assert!(full_name(msg).ends_with(short_name(msg)), "{msg:?}");
        }
    }

    #[test]
    fn every_field_has_a_name() {
        for msg in ALL {
            for n in 0..=MAX_FIELD {
                assert_eq!(
                    field(msg, n).is_some(),
                    field_name(msg, n) != "?",
                    "{msg:?} {n}"
                );
            }
        }
    }

    #[test]
    fn no_field_above_max() {
        for msg in ALL {
            for n in MAX_FIELD + 1..MAX_FIELD + 64 {
                assert!(field(msg, n).is_none());
            }
        }
    }
}
