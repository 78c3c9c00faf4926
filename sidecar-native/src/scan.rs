//! The validating pass: one walk over a whole ExportTraceServiceRequest that accepts or
//! refuses it as upb's parser does, counts its messages, measures how deep the messages
//! that survive parsing nest, and records the index of its two top levels.
//!
//! What upb does, and so what this does (each checked against upb by the tests):
//!
//! - Tags: a varint of at most 5 bytes, below 2^32; field number 0, wire types 6 and 7
//!   and an end-group tag outside a group are corrupt.
//! - Varints: at most 10 bytes (bits past 64 dropped). Lengths: a varint of at most 5
//!   bytes, below 2^31 - 1, within the enclosing message. Nothing of a field may run past
//!   its message's end.
//! - A field of the schema arriving with another wire type than its own is an unknown
//!   field (kept by upb, not parsed); unknown length-delimited fields are not looked into.
//! - Unknown groups (wire type 3) are skipped up to the end-group tag of the same number;
//!   inside one, field number 0 is fine. Groups count as levels: messages and groups
//!   together may nest 101 deep (the request is level 1); a group past that is corrupt.
//! - `string` fields of the schema must be valid UTF-8. upb checks a string before it
//!   checks its message's end: a `string` field whose tag, length or bytes run past the
//!   end of its message, but not past the request's, is refused for bad UTF-8 if those
//!   bytes are not UTF-8, and as corrupt otherwise ([`Scan::past_end`]).
//! - A message at level 102 is refused as too deep (upb's `MaxDepth`), before its
//!   contents are looked at and after its length is checked.
//!
//! Message depth as `message_depth_exceeds` sees it (the parsed tree) differs from the
//! wire in one place: a later member of `AnyValue`'s oneof discards an earlier
//! array/kvlist member with everything under it, also across the repeated occurrences of
//! one `KeyValue.value` (protobuf merges them). [`AnyState`] follows that.
//!
//! Speed: [`Scan::field`] reads any field of any message by the schema table; the
//! messages that make up most of a request (Span, KeyValue, AnyValue, ScopeSpans) have
//! their own loops that read their common one-byte tags directly and hand every other
//! field to it. Those loops do exactly what `field` would do for the tags they handle; on
//! any fault they hand the field to `field` too, which reports it.

use crate::derive::{Keys, SpanFields, Value, member_value};
use crate::schema::{self, Kind, Msg};
use crate::wire;

/// upb's bound on nesting: the request and 100 levels under it.
pub const PARSER_LEVELS: u32 = 101;

/// Why a request is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The wire format is corrupt (upb: "Wire format was corrupt").
    Corrupt {
        what: &'static str,
        msg: Msg,
        at: usize,
    },
    /// A `string` field holds invalid UTF-8 (upb: "String field had bad UTF-8").
    BadUtf8 { msg: Msg, field: u32, at: usize },
    /// A message nested past upb's own limit (upb: "Exceeded upb_DecodeOptions_MaxDepth").
    ParserTooDeep { at: usize },
    /// The parsed request nests deeper than the configured limit.
    TooDeep { levels: u32 },
    /// The request holds more messages than allowed.
    TooManyMessages,
}

fn corrupt(what: &'static str, msg: Msg, at: usize) -> Refusal {
    Refusal::Corrupt { what, msg, at }
}

/// A refusal happened; what it is waits in [`Scan::refusal`]. (A unit error keeps the
/// hot functions' results in registers.)
#[derive(Debug)]
pub struct Fault;

type Step<T> = Result<T, Fault>;

/// A byte range of the request: `(start, end)`.
pub type Range = (usize, usize);

/// One ScopeSpans field of the request.
#[derive(Debug, Clone)]
pub struct ScopeRec {
    /// The field, tag included.
    pub range: Range,
    /// `InstrumentationScope.name` as merged: the last one of all `scope` fields.
    pub name: Option<Range>,
    /// How many `spans` fields the block holds.
    pub spans: usize,
    /// Where the block's spans start in [`Index::spans`].
    pub first_span: usize,
    /// How many of its spans the pass read as a sparse scope's: when all of them, the
    /// spans it may report are those in [`Index::marked`].
    pub sparse_read: usize,
}

/// One ResourceSpans field of the request.
#[derive(Debug, Clone)]
pub struct ResourceRec {
    /// The field, tag included.
    pub range: Range,
    /// Its `resource` fields' bodies: `Index::resources[resources.0..resources.1]`.
    pub resources: Range,
    /// Its ScopeSpans: `Index::scopes[scopes.0..scopes.1]`.
    pub scopes: Range,
    /// Its other fields: `Index::others[others.0..others.1]`.
    pub others: Range,
}

/// The derive fields of a span, recorded by the pass itself when its scope's name, as
/// far as read, was one to derive from (the scope field comes first in every SDK's
/// output). Incomplete when a field took a path that does not record (an unusual
/// encoding): `derive::span` then reads the span again.
#[derive(Debug)]
pub struct SpanRecord {
    /// Which span: its position in [`Index::spans`].
    pub span: usize,
    pub fields: SpanFields,
    /// Its values: `Index::values[values..values + keys]`.
    pub values: usize,
    pub complete: bool,
}

/// What the pass records: the request's two top levels, in wire order.
#[derive(Debug, Default)]
pub struct Index {
    pub blocks: Vec<ResourceRec>,
    pub resources: Vec<Range>,
    pub scopes: Vec<ScopeRec>,
    /// The body of every span, block after block.
    pub spans: Vec<Range>,
    pub others: Vec<Range>,
    /// The request's fields other than `resource_spans`.
    pub top_other: Vec<Range>,
    /// Spans read with their derive fields, in order.
    pub records: Vec<SpanRecord>,
    pub values: Vec<Value>,
    /// The spans of sparse scopes (their positions in [`Index::spans`], in order) that
    /// may carry a sparse key: every one that has one as a key the pass read, and every
    /// one with a field the pass did not read in place. Their derive fields are read
    /// again; the other spans of such a scope have no sparse key and no record.
    pub marked: Vec<usize>,
}

/// The state of one `AnyValue` (merged over every `KeyValue.value` occurrence): which
/// oneof member was set last, and how deep that member's surviving subtree goes.
#[derive(Clone, Copy, Default)]
pub struct AnyState {
    case: u32,
    deepest: u32,
}

impl AnyState {
    #[inline(always)]
    fn scalar(&mut self, number: u32) {
        self.case = number;
        self.deepest = 0;
    }

    #[inline(always)]
    fn message(&mut self, number: u32, deepest: u32) {
        if self.case == number {
            self.deepest = self.deepest.max(deepest); // the same member again: merged
        } else {
            self.case = number;
            self.deepest = deepest;
        }
    }
}

/// One message being read.
struct Frame {
    /// Its level (the request is 1).
    level: u32,
    /// The deepest level of the messages under it that survive parsing (`level` at least).
    deepest: u32,
    /// AnyValue: its oneof. KeyValue: the oneof of its `value` (merged over occurrences).
    any: AnyState,
    /// KeyValue: whether it has a `value`.
    has_value: bool,
}

impl Frame {
    #[inline(always)]
    fn new(level: u32) -> Self {
        Frame {
            level,
            deepest: level,
            any: AnyState::default(),
            has_value: false,
        }
    }
}

/// The pass over one request (see the module doc).
pub struct Scan<'a> {
    data: &'a [u8],
    /// Messages seen, the request included.
    pub count: u64,
    /// Past this many messages the index stops growing: such a request is either refused
    /// for its count or corrupt, and its index is never used.
    record_limit: u64,
    pub index: Index,
    /// Why the request is refused, once a function returned [`Fault`].
    pub refusal: Option<Refusal>,
    scope_name: Option<Range>,
    scope_spans: usize,
    /// Whether `scope_name` is one to derive from.
    scope_derives: bool,
    /// The scope names to derive from and the attribute keys to read.
    derive_scopes: &'a [&'a [u8]],
    keys: &'a Keys<'a>,
    /// Whether `scope_name` is a sparse scope's (one of `sparse_scopes`, derived).
    scope_sparse: bool,
    /// Spans of the current ScopeSpans read as a sparse scope's.
    sparse_read: usize,
    /// The derive scopes read sparsely, and the keys that select their spans.
    sparse_scopes: &'a [&'a [u8]],
    sparse_keys: &'a [&'a [u8]],
}

impl<'a> Scan<'a> {
    pub fn new(
        data: &'a [u8],
        max_messages: i64,
        derive_scopes: &'a [&'a [u8]],
        keys: &'a Keys<'a>,
        sparse: (&'a [&'a [u8]], &'a [&'a [u8]]),
    ) -> Self {
        // Room for the spans up front (a span takes 100-400 bytes on this wire): growing
        // the vectors by copying cost more than the index itself.
        let room = (data.len() / 64).min(1 << 20);
        let mut index = Index::default();
        index.spans.reserve(room);
        if !derive_scopes.is_empty() {
            index.records.reserve(room / 2);
            index.values.reserve(room / 2 * keys.len());
        }
        Scan {
            data,
            count: 1,
            record_limit: u64::try_from(max_messages).unwrap_or(0),
            index,
            refusal: None,
            scope_name: None,
            scope_spans: 0,
            scope_derives: false,
            derive_scopes,
            keys,
            scope_sparse: false,
            sparse_read: 0,
            sparse_scopes: sparse.0,
            sparse_keys: sparse.1,
        }
    }

    /// Whether the scope name read so far is one to derive from sparsely (with
    /// `scope_derives` just set from it).
    fn sparse(&self) -> bool {
        let name = self.scope_name.map_or(&[][..], |(s, e)| &self.data[s..e]);
        self.scope_derives && self.sparse_scopes.contains(&name)
    }

    /// Whether the scope name read so far is one to derive from.
    fn deriving(&self) -> bool {
        let name = self.scope_name.map_or(&[][..], |(s, e)| &self.data[s..e]);
        self.derive_scopes.contains(&name)
    }

    #[cold]
    fn fail(&mut self, refusal: Refusal) -> Fault {
        self.refusal = Some(refusal);
        Fault
    }

    /// Why upb refuses the field of `msg` at `at` that `field` could not read within its
    /// message: upb reads a tag and a length past a message's end and checks a `string`
    /// field's UTF-8 (within the request) before it checks that the field ended inside
    /// its message, so such a string is refused for bad UTF-8 when its bytes are not
    /// UTF-8; anything else is corrupt, for `what`.
    #[cold]
    #[inline(never)]
    fn past_end(&mut self, what: &'static str, msg: Msg, at: usize) -> Fault {
        let data = self.data;
        if let Some((tag, pos)) = wire::tag(data, at)
            && tag & 7 == 2
            && schema::field(msg, tag >> 3) == Some(Kind::Str)
            && let Some((s, e)) = wire::delimited(data, pos)
            && !wire::utf8(&data[s..e])
        {
            return self.fail(Refusal::BadUtf8 {
                msg,
                field: tag >> 3,
                at,
            });
        }
        self.fail(corrupt(what, msg, at))
    }

    #[inline(always)]
    fn recording(&self) -> bool {
        self.count <= self.record_limit
    }

    /// Walks the whole request. Ok: how deep its parsed messages nest (1: the request
    /// alone); Err: why upb would refuse it (corrupt, bad UTF-8 or too deep for upb).
    pub fn request(&mut self) -> Result<u32, Refusal> {
        let mut frame = Frame::new(1);
        let buf = self.data;
        let mut pos = 0;
        while pos < buf.len() {
            let at = pos;
            pos = match self.field(Msg::Request, buf, pos, &mut frame) {
                Ok(next) => next,
                Err(Fault) => return Err(self.refusal.take().expect("a fault says why")),
            };
            // Not a block (`field` records those): another field.
            if self.recording() && !self.last_block_starts_at(at) {
                self.index.top_other.push((at, pos));
            }
        }
        Ok(frame.deepest)
    }

    fn last_block_starts_at(&self, at: usize) -> bool {
        self.index.blocks.last().is_some_and(|b| b.range.0 == at)
    }

    /// A child message of `frame` whose field starts at `at` and whose body is
    /// `start..stop`: checks upb's depth limit and counts it.
    #[inline(always)]
    fn enter(&mut self, at: usize, level: u32) -> Step<u32> {
        if level >= PARSER_LEVELS {
            return Err(self.fail(Refusal::ParserTooDeep { at }));
        }
        self.count += 1;
        Ok(level + 1)
    }

    /// Reads the message `msg` whose body is `start..stop` into `frame`.
    fn message(&mut self, msg: Msg, start: usize, stop: usize, frame: &mut Frame) -> Step<()> {
        match msg {
            Msg::Span => self.span::<false, false>(start, stop, frame),
            Msg::KeyValue => self.key_value(start, stop, frame),
            Msg::AnyValue => self.any_value(start, stop, frame),
            Msg::ScopeSpans => self.scope_spans(start, stop, frame),
            _ => {
                let buf = &self.data[..stop];
                let mut pos = start;
                while pos < stop {
                    pos = self.field(msg, buf, pos, frame)?;
                }
                Ok(())
            }
        }
    }

    /// Reads one field of `msg` at `at` (any field: known, unknown, any tag encoding) and
    /// returns the offset after it. `buf` ends where the message ends.
    #[inline(never)]
    fn field(&mut self, msg: Msg, buf: &[u8], at: usize, frame: &mut Frame) -> Step<usize> {
        let Some((tag, pos)) = wire::tag(buf, at) else {
            return Err(self.past_end("unreadable field tag", msg, at));
        };
        let number = tag >> 3;
        let wire_type = tag & 7;
        let kind = match schema::field(msg, number) {
            Some(kind) if kind.wire_type() == wire_type => kind,
            _ => return self.unknown(buf, msg, number, wire_type, at, pos, frame.level),
        };
        let (start, stop) = match kind {
            Kind::Varint => {
                let Some((_, next)) = wire::varint(buf, pos) else {
                    return Err(self.fail(corrupt("unreadable varint", msg, at)));
                };
                if msg == Msg::AnyValue {
                    frame.any.scalar(number);
                }
                return Ok(next);
            }
            Kind::Fixed64 | Kind::Fixed32 => {
                let size = if kind == Kind::Fixed64 { 8 } else { 4 };
                if buf.len() - pos < size {
                    return Err(self.fail(corrupt("fixed-size value past the end", msg, at)));
                }
                if msg == Msg::AnyValue {
                    frame.any.scalar(number);
                }
                return Ok(pos + size);
            }
            _ => match wire::delimited(buf, pos) {
                Some(body) => body,
                None => return Err(self.past_end("length past the end", msg, at)),
            },
        };
        let child = match kind {
            Kind::Str if !wire::utf8(&buf[start..stop]) => {
                return Err(self.fail(Refusal::BadUtf8 {
                    msg,
                    field: number,
                    at,
                }));
            }
            Kind::Str | Kind::Bytes => {
                if msg == Msg::AnyValue {
                    frame.any.scalar(number);
                } else if msg == Msg::Scope && number == 1 {
                    self.scope_name = Some((start, stop));
                    self.scope_derives = self.deriving();
                    self.scope_sparse = self.sparse();
                }
                return Ok(stop);
            }
            Kind::Message(child) => child,
            _ => unreachable!("scalar kinds returned above"),
        };
        let level = self.enter(at, frame.level)?;
        let mut sub = Frame::new(level);
        match (msg, child) {
            (Msg::KeyValue, _) => {
                // `value` again: the same AnyValue, merged
                sub.any = frame.any;
                self.any_value(start, stop, &mut sub)?;
                frame.any = sub.any;
                frame.has_value = true;
                return Ok(stop);
            }
            (Msg::ArrayValue, _) => {
                self.any_value(start, stop, &mut sub)?;
                frame.deepest = frame.deepest.max(sub.any.deepest);
            }
            (Msg::AnyValue, _) => {
                self.message(child, start, stop, &mut sub)?;
                frame.any.message(number, sub.deepest);
                return Ok(stop);
            }
            (Msg::Request, _) => {
                let first = (
                    self.index.resources.len(),
                    self.index.scopes.len(),
                    self.index.others.len(),
                );
                self.resource_spans(start, stop, &mut sub)?;
                if self.recording() {
                    let index = &mut self.index;
                    index.blocks.push(ResourceRec {
                        range: (at, stop),
                        resources: (first.0, index.resources.len()),
                        scopes: (first.1, index.scopes.len()),
                        others: (first.2, index.others.len()),
                    });
                }
            }
            (Msg::ResourceSpans, Msg::Resource) => {
                if self.recording() {
                    self.index.resources.push((start, stop));
                }
                self.message(child, start, stop, &mut sub)?;
            }
            (Msg::ResourceSpans, _) => {
                self.scope_name = None;
                self.scope_derives = self.deriving();
                self.scope_sparse = self.sparse();
                self.scope_spans = 0;
                self.sparse_read = 0;
                let first_span = self.index.spans.len();
                self.scope_spans(start, stop, &mut sub)?;
                if self.recording() {
                    self.index.scopes.push(ScopeRec {
                        range: (at, stop),
                        name: self.scope_name,
                        spans: self.scope_spans,
                        first_span,
                        sparse_read: self.sparse_read,
                    });
                }
            }
            (Msg::ScopeSpans, Msg::Span) => {
                self.scope_spans += 1;
                if self.recording() {
                    self.index.spans.push((start, stop));
                }
                // (a span read here has no one-byte tag: not recorded)
                self.span::<false, false>(start, stop, &mut sub)?;
            }
            _ => self.message(child, start, stop, &mut sub)?,
        }
        frame.deepest = frame.deepest.max(sub.deepest);
        Ok(stop)
    }

    /// A ResourceSpans body: its `resource` and `scope_spans` fields are recorded by
    /// `field`; every other field is recorded here as "other".
    fn resource_spans(&mut self, start: usize, stop: usize, frame: &mut Frame) -> Step<()> {
        let buf = &self.data[..stop];
        let mut pos = start;
        while pos < stop {
            let at = pos;
            let (resources, scopes) = (self.index.resources.len(), self.index.scopes.len());
            pos = self.field(Msg::ResourceSpans, buf, pos, frame)?;
            let indexed =
                self.index.resources.len() != resources || self.index.scopes.len() != scopes;
            if !indexed && self.recording() {
                self.index.others.push((at, pos));
            }
        }
        Ok(())
    }

    /// A ScopeSpans body; spans (tag 0x12) read here.
    fn scope_spans(&mut self, start: usize, stop: usize, frame: &mut Frame) -> Step<()> {
        let buf = &self.data[..stop];
        let mut pos = start;
        while pos < stop {
            if buf[pos] == 0x12 {
                if let Some((s, e)) = wire::delimited(buf, pos + 1) {
                    let level = self.enter(pos, frame.level)?;
                    self.scope_spans += 1;
                    if self.recording() {
                        self.index.spans.push((s, e));
                    }
                    let mut sub = Frame::new(level);
                    if self.scope_derives && self.recording() {
                        if self.scope_sparse {
                            self.sparse_read += 1;
                            self.span::<false, true>(s, e, &mut sub)?;
                        } else {
                            self.span::<true, false>(s, e, &mut sub)?;
                        }
                    } else {
                        self.span::<false, false>(s, e, &mut sub)?;
                    }
                    frame.deepest = frame.deepest.max(sub.deepest);
                    pos = e;
                    continue;
                }
            }
            pos = self.field(Msg::ScopeSpans, buf, pos, frame)?;
        }
        Ok(())
    }

    /// A Span body. `DERIVE`: also record its derive fields (a [`SpanRecord`]).
    /// `SPARSE` (a sparse scope's span): no record; listed in [`Index::marked`] when it
    /// may carry a sparse key.
    fn span<const DERIVE: bool, const SPARSE: bool>(
        &mut self,
        start: usize,
        stop: usize,
        frame: &mut Frame,
    ) -> Step<()> {
        let buf = &self.data[..stop];
        let mut rec = SpanFields::default();
        let mut complete = true;
        let mut marked = false;
        let values_at = self.index.values.len();
        if DERIVE {
            let n = self.keys.len();
            self.index.values.resize(values_at + n, Value::None);
        }
        let mut pos = start;
        while pos < stop {
            let next = match buf[pos] {
                // attributes
                0x4a => match wire::delimited(buf, pos + 1) {
                    Some((s, e)) => {
                        let simple = if frame.level + 2 <= PARSER_LEVELS {
                            simple_key_value(buf, s, e)
                        } else {
                            None
                        };
                        if let Some((key, member)) = simple {
                            self.count += 2; // the KeyValue and its AnyValue
                            frame.deepest = frame.deepest.max(frame.level + 2);
                            if DERIVE && self.keys.maybe(key.1 - key.0) {
                                let name = &buf[key.0..key.1];
                                let value = member_value(buf, member);
                                let slots = &mut self.index.values[values_at..];
                                self.keys.set(name, value, slots);
                            }
                            if SPARSE && !marked {
                                let name = &buf[key.0..key.1];
                                marked = self.sparse_keys.contains(&name);
                            }
                        } else {
                            complete = false;
                            let level = self.enter(pos, frame.level)?;
                            let mut kv = Frame::new(level);
                            self.key_value(s, e, &mut kv)?;
                            frame.deepest = frame.deepest.max(kv.deepest);
                        }
                        Some(e)
                    }
                    None => None,
                },
                // status: nearly always empty (UNSET) or a code
                0x7a => match wire::delimited(buf, pos + 1) {
                    Some((s, e)) => {
                        let level = self.enter(pos, frame.level)?;
                        let mut status = Frame::new(level);
                        if s != e {
                            match status_code(buf, s, e) {
                                Some(code) if DERIVE => rec.status_code = code,
                                Some(_) => {}
                                None => {
                                    complete = false;
                                    self.message(Msg::Status, s, e, &mut status)?;
                                }
                            }
                        }
                        frame.deepest = frame.deepest.max(status.deepest);
                        Some(e)
                    }
                    None => None,
                },
                // flags (field 16, fixed32: a two-byte tag)
                0x85 if buf.get(pos + 1) == Some(&0x01) => (stop - pos >= 6).then_some(pos + 6),
                // trace_id, span_id
                0x0a | 0x12 => match wire::delimited(buf, pos + 1) {
                    Some(body) => {
                        if DERIVE {
                            if buf[pos] == 0x0a {
                                rec.trace_id = body;
                            } else {
                                rec.span_id = body;
                            }
                        }
                        Some(body.1)
                    }
                    None => None,
                },
                // parent_span_id
                0x22 => wire::delimited(buf, pos + 1).map(|(_, e)| e),
                // trace_state
                0x1a => match wire::delimited(buf, pos + 1) {
                    Some((s, e)) if wire::utf8(&buf[s..e]) => Some(e),
                    _ => None,
                },
                // name
                0x2a => match wire::delimited(buf, pos + 1) {
                    Some((s, e)) if wire::utf8(&buf[s..e]) => {
                        if DERIVE {
                            rec.name = (s, e);
                        }
                        Some(e)
                    }
                    _ => None,
                },
                // start_time_unix_nano, end_time_unix_nano
                0x39 | 0x41 => match buf.get(pos + 1..pos + 9) {
                    Some(bytes) => {
                        if DERIVE {
                            let time = u64::from_le_bytes(bytes.try_into().unwrap_or_default());
                            if buf[pos] == 0x39 {
                                rec.start_time = time;
                            } else {
                                rec.end_time = time;
                            }
                        }
                        Some(pos + 9)
                    }
                    None => None,
                },
                // kind, dropped_attributes_count, dropped_events_count, dropped_links_count
                0x30 | 0x50 | 0x60 | 0x70 => wire::varint(buf, pos + 1).map(|(_, e)| e),
                _ => None,
            };
            pos = match next {
                Some(next) => next,
                None => {
                    complete = false;
                    self.field(Msg::Span, buf, pos, frame)?
                }
            };
        }
        if SPARSE && (marked || !complete) {
            // (not complete: a field read elsewhere, maybe a sparse key's attribute)
            self.index.marked.push(self.index.spans.len() - 1);
        }
        if DERIVE {
            let span = self.index.spans.len() - 1;
            let record = SpanRecord {
                span,
                fields: rec,
                values: values_at,
                complete,
            };
            self.index.records.push(record);
        }
        Ok(())
    }

    /// A KeyValue body; at the end, `frame.deepest` includes its value.
    #[inline(always)]
    fn key_value(&mut self, start: usize, stop: usize, frame: &mut Frame) -> Step<()> {
        let buf = &self.data[..stop];
        let mut pos = start;
        while pos < stop {
            let next = match buf[pos] {
                0x0a => match wire::delimited(buf, pos + 1) {
                    Some((s, e)) if wire::utf8(&buf[s..e]) => Some(e),
                    _ => None,
                },
                0x12 => match wire::delimited(buf, pos + 1) {
                    Some((s, e)) => {
                        let level = self.enter(pos, frame.level)?;
                        frame.has_value = true;
                        // Nearly always one scalar member: read it here.
                        match scalar_member(buf, s, e) {
                            Some(number) => frame.any.scalar(number),
                            None => {
                                let mut value = Frame::new(level);
                                value.any = frame.any;
                                self.any_value(s, e, &mut value)?;
                                frame.any = value.any;
                            }
                        }
                        Some(e)
                    }
                    None => None,
                },
                _ => None,
            };
            pos = match next {
                Some(next) => next,
                None => self.field(Msg::KeyValue, buf, pos, frame)?,
            };
        }
        if frame.has_value {
            frame.deepest = frame.deepest.max(frame.level + 1).max(frame.any.deepest);
        }
        Ok(())
    }

    /// An AnyValue body (one occurrence; `frame.any` carries the merged oneof).
    fn any_value(&mut self, start: usize, stop: usize, frame: &mut Frame) -> Step<()> {
        let buf = &self.data[..stop];
        let mut pos = start;
        while pos < stop {
            pos = match scalar_field(buf, pos) {
                Some(next) => {
                    frame.any.scalar(u32::from(buf[pos] >> 3));
                    next
                }
                None => self.field(Msg::AnyValue, buf, pos, frame)?,
            };
        }
        Ok(())
    }

    /// Skips an unknown field (or one of the schema with another wire type) whose tag
    /// ends at `pos`; returns the offset after it.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn unknown(
        &mut self,
        buf: &[u8],
        msg: Msg,
        number: u32,
        wire_type: u32,
        at: usize,
        pos: usize,
        level: u32,
    ) -> Step<usize> {
        let skipped = if number == 0 {
            Err("field number 0")
        } else {
            match wire_type {
                3 => skip_group(buf, number, pos, level + 1),
                4 => Err("end-group tag outside a group"),
                _ => skip_value(buf, wire_type, pos).ok_or(bad_value(wire_type)),
            }
        };
        skipped.map_err(|what| self.fail(corrupt(what, msg, at)))
    }
}

/// When the KeyValue body `start..stop` is the common shape, valid: a `key` field, then a
/// `value` field holding one scalar member ([`scalar_member`]), one-byte tags: the key's
/// range and the member's offset. Such a KeyValue is what `key_value` would accept, with
/// a depth of its level + 1.
#[inline(always)]
fn simple_key_value(buf: &[u8], start: usize, stop: usize) -> Option<(Range, usize)> {
    let kv = &buf[..stop];
    if kv.get(start) != Some(&0x0a) {
        return None;
    }
    let (s, e) = wire::delimited(kv, start + 1)?;
    if kv.get(e) != Some(&0x12) || !wire::utf8(&kv[s..e]) {
        return None;
    }
    match wire::delimited(kv, e + 1) {
        Some((vs, ve)) if ve == stop && scalar_member(kv, vs, ve).is_some() => Some(((s, e), vs)),
        _ => None,
    }
}

/// When the Status body `start..stop` is only a `code` (one-byte tag): the code.
#[inline(always)]
fn status_code(buf: &[u8], start: usize, stop: usize) -> Option<i32> {
    if buf[start] != 0x18 {
        return None;
    }
    match wire::varint(&buf[..stop], start + 1) {
        Some((code, end)) if end == stop => Some(code as u32 as i32), // int32: low 32 bits
        _ => None,
    }
}

/// An AnyValue scalar member at `pos` with a one-byte tag, valid: the offset after it.
/// None for anything else (`Scan::field` then reads it).
#[inline(always)]
fn scalar_field(buf: &[u8], pos: usize) -> Option<usize> {
    match buf[pos] {
        // string_value
        0x0a => match wire::delimited(buf, pos + 1) {
            Some((s, e)) if wire::utf8(&buf[s..e]) => Some(e),
            _ => None,
        },
        // bool_value, int_value, string_value_strindex
        0x10 | 0x18 | 0x40 => wire::varint(buf, pos + 1).map(|(_, e)| e),
        // double_value
        0x21 => (buf.len() - pos > 8).then_some(pos + 9),
        // bytes_value
        0x3a => wire::delimited(buf, pos + 1).map(|(_, e)| e),
        _ => None,
    }
}

/// When the AnyValue body `start..stop` is exactly one scalar member that
/// [`scalar_field`] reads, its field number.
#[inline(always)]
fn scalar_member(buf: &[u8], start: usize, stop: usize) -> Option<u32> {
    if start == stop {
        return None;
    }
    let body = &buf[..stop];
    match scalar_field(body, start) {
        Some(end) if end == stop => Some(u32::from(body[start] >> 3)),
        _ => None,
    }
}

fn bad_value(wire_type: u32) -> &'static str {
    match wire_type {
        0 => "unreadable varint",
        1 | 5 => "fixed-size value past the end",
        2 => "length past the end",
        _ => "invalid wire type",
    }
}

/// Skips the value of a field of wire type 0, 1, 2 or 5 starting at `pos`; None when it
/// is corrupt or the wire type is none of these.
#[inline]
pub fn skip_value(buf: &[u8], wire_type: u32, pos: usize) -> Option<usize> {
    match wire_type {
        0 => wire::varint(buf, pos).map(|(_, next)| next),
        1 => (buf.len() - pos >= 8).then_some(pos + 8),
        5 => (buf.len() - pos >= 4).then_some(pos + 4),
        2 => wire::delimited(buf, pos).map(|(_, stop)| stop),
        _ => None,
    }
}

/// Skips an unknown group `number` whose start tag ends at `pos` (the group being at
/// `level`): returns the offset after its end-group tag.
pub fn skip_group(
    buf: &[u8],
    number: u32,
    mut pos: usize,
    level: u32,
) -> Result<usize, &'static str> {
    if level > PARSER_LEVELS {
        return Err("groups nested past the parser's depth limit");
    }
    loop {
        let Some((tag, next)) = wire::tag(buf, pos) else {
            return Err(if pos >= buf.len() {
                "group not closed before the end of its message"
            } else {
                "unreadable field tag in a group"
            });
        };
        pos = next;
        match tag & 7 {
            3 => pos = skip_group(buf, tag >> 3, pos, level + 1)?,
            4 if tag >> 3 == number => return Ok(pos),
            4 => return Err("end-group tag of another group"),
            wire_type => {
                pos = skip_value(buf, wire_type, pos).ok_or(bad_value(wire_type))?;
            }
        }
    }
}
