//! The spans of one ScopeSpans block, one by one: each span's name and the bytes of its
//! `spans` field, for the blocks of scopes that carry several span groups (the gate
//! removes single spans from them, `gym_sidecar.core.traces.ScopeBlock.keep_spans`).
//!
//! Read from a request the validating pass accepted: every field is known to be well
//! formed, so a read that cannot fail there falls back to an empty value.

use crate::scan::{Range, skip_group, skip_value};
use crate::wire;

/// The offset after the field whose tag (wire type `tag & 7`) ends at `pos`.
#[inline(always)]
fn skip(buf: &[u8], tag: u32, pos: usize) -> usize {
    let next = match tag & 7 {
        3 => skip_group(buf, tag >> 3, pos, 0).ok(),
        wire_type => skip_value(buf, wire_type, pos),
    };
    next.unwrap_or(buf.len())
}

/// A span's name (the last `name` field; empty without one), its body being `span`.
fn name(data: &[u8], span: Range) -> Range {
    let buf = &data[..span.1];
    let mut name: Range = (span.1, span.1);
    let mut pos = span.0;
    while let Some((tag, next)) = wire::tag(buf, pos) {
        pos = if tag == 0x2a {
            name = wire::delimited(buf, next).unwrap_or((buf.len(), buf.len()));
            name.1
        } else {
            skip(buf, tag, next)
        };
    }
    name
}

/// `(name, start, end)` of each `spans` field of the ScopeSpans field `block` (its tag
/// included), in wire order: the name's range, and the field's bytes, tag included.
pub fn spans(data: &[u8], block: Range) -> Vec<(Range, usize, usize)> {
    let buf = &data[..block.1];
    let mut out = Vec::new();
    // The ScopeSpans field's own tag and length.
    let Some((_, after_tag)) = wire::tag(buf, block.0) else {
        return out;
    };
    let Some((start, stop)) = wire::delimited(buf, after_tag) else {
        return out;
    };
    let body = &data[..stop];
    let mut pos = start;
    while let Some((tag, next)) = wire::tag(body, pos) {
        if tag == 0x12 {
            let span = wire::delimited(body, next).unwrap_or((stop, stop));
            out.push((name(data, span), pos, span.1));
            pos = span.1;
        } else {
            pos = skip(body, tag, next);
        }
    }
    out
}
