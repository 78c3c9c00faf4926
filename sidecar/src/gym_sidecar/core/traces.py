"""The wire view of an OTLP trace export request: what the trace pipeline works on.

A trace request travels the pipeline as the bytes it arrived in plus an index of them:
where each ResourceSpans and ScopeSpans block lies, its resource, its scope name and
span count, and, for the scopes the derive stage reads, the few fields of each span it
needs. Nothing else of a span is ever turned into a Python object.

Stages edit the index, never the bytes: enrich sets a block's ``resource_out``, the gate
removes :class:`ScopeBlock` s (marking their block ``edited``), single spans from the
blocks of scopes that carry several span groups (:meth:`ScopeBlock.keep_spans`, for the
scopes the scan was asked to split: ``ScanSpec.split_scopes``) and :class:`ResourceBlock`
s left empty (marking the request ``changed``). :meth:`TraceRequest.SerializeToString`
then writes the request out by splicing: each block no stage touched is copied as it
arrived, a touched one is rebuilt from its resource and the byte ranges of its kept
ScopeSpans and other fields behind a new length prefix (a ScopeSpans with removed spans
is itself rebuilt from its other fields and its kept spans), and a request no stage
changed is sent as the very bytes received.

Why not a protobuf message: parsing a whole request into upb objects and serializing it
again cost 64 % of the sidecar's instructions per span (callgrind, whole sidecar, the
``rollouts`` load; docs/benchmarks.md, performance round 3), for a pipeline that looks
at resources and scope names only, and at a handful of fields of the spans it derives
metrics from.

The index is built by a scanner (``gym_sidecar.wire.protobuf.scan``), which also validates
the whole request as protobuf (wire format, UTF-8 of string fields, nesting and message
count limits) exactly as the upb parser would, so a request that reaches a stage is one
every backend can decode. Two scanners build it: the native one
(``gym_sidecar_native``, Rust) and the pure-Python fallback (upb parse plus a walk of
the two top levels); they return equal indexes for every input.

Field numbers used here (opentelemetry-proto ``trace/v1``, ``collector/trace/v1``):
ExportTraceServiceRequest.resource_spans = 1; ResourceSpans: resource = 1,
scope_spans = 2, schema_url = 3; ScopeSpans: scope = 1, spans = 2, schema_url = 3;
InstrumentationScope.name = 1; Span.events = 11; Span.Event: name = 2, attributes = 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

AttrValue: TypeAlias = bool | str | int | float | bytes | None
"""An attribute's value as the scanner reports it: the AnyValue's scalar (``bytes`` for
``bytes_value``), or None when the key is absent or the value is an array, a kvlist or
empty."""

DerivedSpan: TypeAlias = tuple[str, int, int, bytes, bytes, int, tuple[AttrValue, ...]]
"""One span of a derive scope: ``(name, start_time_unix_nano, end_time_unix_nano, trace_id,
span_id, status_code, values)``. ``values`` holds, for each key the scan was asked for
(``attr_keys``) in that order, the value of the span's *last* attribute with that key
(None if it has none), then for each ``(event name, key)`` of ``event_keys`` the value
of that key in the span's last event of that name that has the key (None if none has,
and for every span whose status is not ERROR: event values are failure details, and
reading no events elsewhere keeps the scan's cost where failures are). Absent fields
read as protobuf defaults: ``""``, ``0``, ``b""``; ``status_code`` is ``Status.code`` (0
when the span has no status)."""

ByteRange: TypeAlias = tuple[int, int]
"""``(start, end)`` offsets into :attr:`TraceRequest.raw`, a field's tag included."""

SplitSpan: TypeAlias = tuple[str, int, int]
"""One span of a split scope (``ScanSpec.split_scopes``): ``(name, start, end)``, its name
(the last ``name`` field, ``""`` without one) and its ``spans`` field's byte range in
:attr:`TraceRequest.raw`, tag included."""

NATIVE_ENV = "GYM_SIDECAR_NATIVE"
"""``0`` keeps the sidecar on the pure-Python scanner even where the native one imports
(``gym_sidecar.wire.protobuf.scan``); not a configuration key."""

RESOURCE_SPANS_TAG = b"\x0a"
"""ExportTraceServiceRequest field 1 (resource_spans), wire type 2."""
RESOURCE_TAG = b"\x0a"
"""ResourceSpans field 1 (resource), wire type 2."""


def varint(n: int) -> bytes:
    """``n`` (non-negative) as a protobuf base-128 varint."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


SCOPE_SPANS_TAG = b"\x12"
"""ResourceSpans field 2 (scope_spans), wire type 2."""


@dataclass(frozen=True, slots=True)
class ScanSpec:
    """What a scan reads beyond the index: the spans of the scopes named here (of the
    ``sparse_scopes`` among them, only those with a value for one of ``sparse_keys``),
    and of their attributes and events the keys named here (see :data:`DerivedSpan`);
    and the byte range of each span in the blocks of ``split_scopes``. The derive stage
    says what it reads (empty when it is off), the gate which scopes it splits; the
    receivers pass the merge (``core.stage.pipeline_trace_scan``) to the scanner."""

    def __post_init__(self) -> None:
        if not set(self.sparse_keys) <= set(self.attr_keys):
            raise ValueError("every sparse key must be one of attr_keys")
        if not self.sparse_scopes <= self.derive_scopes:
            raise ValueError("every sparse scope must be a derive scope")

    derive_scopes: frozenset[str] = frozenset()
    attr_keys: tuple[str, ...] = ()
    event_keys: tuple[tuple[str, str], ...] = ()
    """``(event name, attribute key)`` pairs read after ``attr_keys``."""
    split_scopes: frozenset[str] = frozenset()
    """Scopes whose blocks report :attr:`ScopeBlock.split` (the gate removes single
    spans from them)."""
    sparse_scopes: frozenset[str] = frozenset()
    """Derive scopes read for their rare spans only: a block of one of them lists in
    :attr:`ScopeBlock.derived` only the spans with a value for one of ``sparse_keys``
    (in wire order; an empty list when none has). The scope of the hops between Gym
    servers (every span a hop, a retried or failed one now and then): its other spans
    cost the scan no derive tuple."""
    sparse_keys: tuple[str, ...] = ()
    """The keys (each one of ``attr_keys``) that select a sparse scope's spans."""


class ScopeBlock:
    """One ScopeSpans block of a request."""

    __slots__ = ("derived", "end", "kept", "name", "spans", "split", "start")

    def __init__(
        self,
        start: int,
        end: int,
        name: str,
        spans: int,
        derived: list[DerivedSpan] | None,
    ) -> None:
        self.start = start
        """Offset of the ScopeSpans field's tag in the request."""
        self.end = end
        """Offset just past the field's last byte."""
        self.name = name
        """``InstrumentationScope.name`` (``""`` without a scope or name)."""
        self.spans = spans
        """How many spans the block holds."""
        self.derived = derived
        """The block's spans' derive fields, in order, when its scope name was one the
        scan was asked to read (``derive_scopes``; of a ``sparse_scopes`` block, only
        its spans with a value for one of ``sparse_keys``); None for every other block."""
        self.split: list[SplitSpan] | None = None
        """Each span's name and field bytes (:data:`SplitSpan`), in wire order, when the
        scope name was one the scan was asked to split (``split_scopes``; the scanner
        sets it); None for every other block."""
        self.kept: list[int] | None = None
        """Set by :meth:`keep_spans`: the indexes (into :attr:`split`) of the spans still
        in the block; None: every span received."""

    def keep_spans(self, kept: list[int]) -> None:
        """Keep only the spans at these indexes of :attr:`split` (increasing); the caller
        marks the ResourceBlock ``edited``. :attr:`spans` becomes their count."""
        if self.split is None:
            raise ValueError(f"scope {self.name!r} was not split by the scan")
        self.kept = kept
        self.spans = len(kept)

    def write(self, raw: memoryview, out: list[bytes | memoryview]) -> None:
        """Append this block's ScopeSpans field to ``out``: as received, or rebuilt from
        its fields other than ``spans`` and its kept spans (:meth:`keep_spans`)."""
        kept = self.kept
        if kept is None:
            out.append(raw[self.start : self.end])
            return
        split = self.split
        assert split is not None  # keep_spans checked
        parts: list[memoryview] = []
        pos = _body_start(raw, self.start)
        for _, start, end in split:  # the other fields: the gaps around the spans
            if start > pos:
                parts.append(raw[pos:start])
            pos = end
        if self.end > pos:
            parts.append(raw[pos : self.end])
        parts += [raw[split[i][1] : split[i][2]] for i in kept]
        out += (SCOPE_SPANS_TAG, varint(sum(map(len, parts))))
        out += parts

    def __repr__(self) -> str:
        return f"ScopeBlock({self.start}, {self.end}, {self.name!r}, {self.spans})"


def _body_start(raw: memoryview, start: int) -> int:
    """Where the body of the length-delimited field at ``start`` begins (after its tag
    and length varints, however long they are encoded)."""
    pos = start
    for _ in range(2):  # the tag, then the length
        while raw[pos] >= 0x80:
            pos += 1
        pos += 1
    return pos


class ResourceBlock:
    """One ResourceSpans block of a request."""

    __slots__ = ("edited", "end", "other", "resource", "resource_out", "scopes", "start")

    def __init__(
        self,
        start: int,
        end: int,
        resource: bytes | None,
        scopes: list[ScopeBlock],
        other: list[ByteRange],
    ) -> None:
        self.start = start
        """Offset of the ResourceSpans field's tag in the request."""
        self.end = end
        """Offset just past the field's last byte."""
        self.resource = resource
        """The serialized Resource as received (the concatenated bodies of every
        ``resource`` field, which is how protobuf merges repeated occurrences of a
        message field); None when the block has no ``resource`` field."""
        self.scopes = scopes
        """The ScopeSpans blocks, in wire order. Stages remove the ones they drop."""
        self.other = other
        """The block's other fields (``schema_url``, unknown ones), kept verbatim."""
        self.resource_out: bytes | None = None
        """Set by enrichment: the serialized Resource to write instead of ``resource``."""
        self.edited = False
        """Set by a stage that removed ScopeSpans from ``scopes``: the block is rebuilt."""

    @property
    def span_count(self) -> int:
        return sum(scope.spans for scope in self.scopes)

    @property
    def current_resource(self) -> bytes:
        """The serialized Resource as it now stands: ``resource_out`` once enrichment
        changed it, else as received (``b""`` for a block without one, which is how an
        absent Resource serializes too)."""
        if self.resource_out is not None:
            return self.resource_out
        return self.resource if self.resource is not None else b""

    def __repr__(self) -> str:
        return f"ResourceBlock({self.start}, {self.end}, scopes={self.scopes!r})"


class TraceRequest:
    """An ExportTraceServiceRequest as received, with its index (see the module doc).

    Not thread-safe: the pipeline's stages use it on the event loop, one at a time.
    """

    __slots__ = ("blocks", "changed", "other", "raw")

    def __init__(self, raw: bytes, blocks: list[ResourceBlock], other: list[ByteRange]) -> None:
        self.raw = raw
        """The request's bytes as received (never modified)."""
        self.blocks = blocks
        """The ResourceSpans blocks still in the request, in wire order."""
        self.other = other
        """The request's fields other than ``resource_spans``, kept verbatim."""
        self.changed = False
        """Whether a stage removed a block (enrichment is seen in ``resource_out``, a
        removed ScopeSpans in the block's ``edited``)."""

    def span_count(self) -> int:
        """Spans still in the request."""
        return sum(scope.spans for block in self.blocks for scope in block.scopes)

    def removed_nothing(self) -> bool:
        """Whether every block, ScopeSpans and span received is still in the request
        (the stages may have enriched resources): all of :attr:`raw` but the replaced
        resources is still to be sent. (A gate that removed single spans from a split
        scope marked their block ``edited``.)"""
        return not self.changed and not any(b.edited for b in self.blocks)

    def parts(self) -> list[bytes | memoryview]:
        """The request as it now stands, as the byte strings (slices of :attr:`raw`
        among them) whose concatenation is its protobuf wire format; ``[raw]`` when no
        stage changed anything. See :meth:`SerializeToString`."""
        blocks = self.blocks
        if not self.changed and all(b.resource_out is None and not b.edited for b in blocks):
            return [self.raw]
        raw = memoryview(self.raw)  # slices of a view copy nothing
        out: list[bytes | memoryview] = []
        for block in blocks:
            if block.resource_out is None and not block.edited:
                out.append(raw[block.start : block.end])
                continue
            parts: list[bytes | memoryview] = []
            resource = block.resource_out if block.resource_out is not None else block.resource
            if resource is not None:
                parts += (RESOURCE_TAG, varint(len(resource)), resource)
            for scope in block.scopes:
                scope.write(raw, parts)
            parts += [raw[start:end] for start, end in block.other]
            out += (RESOURCE_SPANS_TAG, varint(sum(map(len, parts))))
            out += parts
        out += [raw[start:end] for start, end in self.other]
        return out

    def SerializeToString(self) -> bytes:  # the protobuf message method's name
        """The request as it now stands, in protobuf wire format.

        ``raw`` itself when no stage changed anything. Otherwise each kept ResourceSpans
        no stage touched is copied as received; a touched one (``resource_out`` set, or
        ``edited``) is written as its resource (``resource_out`` or the received one),
        its kept ScopeSpans blocks and its other fields, each copied byte for byte,
        behind a new tag and length; the request's own other fields follow verbatim.
        Protobuf gives fields no order but a repeated field's, which is kept. Every
        byte of the result is copied once (the join of :meth:`parts`).
        """
        parts = self.parts()
        if len(parts) == 1 and parts[0] is self.raw:
            return self.raw
        return b"".join(parts)
