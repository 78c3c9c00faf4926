"""One trace as a waterfall: rows in tree order on a shared time axis, and whether the
trace is complete.

Rows are the spans depth first (children by start time); a span whose parent was not
stored starts a tree of its own and is marked an orphan. A span whose parent belongs to
another service is a cross-process edge (``⇢``). Only :data:`PAGE_ROWS` rows are drawn
per page, so a trace of 10,000 spans is a few pages, each of bounded size.

Completeness (:func:`completeness`): spans are exported when they end, children before
their parents, each process on its own; so while a trace is arriving, spans miss their
parent, or a client call has no span from the server it called yet. A trace is shown as
``complete`` only when it has a root, no span misses its parent, and either every
client span has a child or nothing of the trace was stored for ``settle_s`` (a call to
an uninstrumented server never gets one). Otherwise it is ``arriving`` (something was
stored less than ``settle_s`` ago: the page reloads itself) or ``incomplete``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import gym_telemetry_semconv as semconv

from gym_sidecar.store.queries import STATUS_ERROR, SpanRecord, verify_outcome

PAGE_ROWS: Final = 500
MAX_DEPTH_CLASS: Final = 24
PALETTE: Final = 8
"""Services are told apart by one of this many colour classes (``svc-0`` ...)."""
KIND_CLIENT: Final = 3


@dataclass(frozen=True)
class Row:
    span: SpanRecord
    depth: int
    cross_process: bool
    orphan: bool
    verify_failed: bool

    @property
    def error(self) -> bool:
        return self.span.status_code == STATUS_ERROR


@dataclass(frozen=True)
class Completeness:
    state: str
    """``complete``, ``arriving`` or ``incomplete``."""
    missing_parents: int
    awaiting_callees: int
    has_root: bool
    last_stored_ns: int


def tree_rows(spans: Sequence[SpanRecord]) -> list[Row]:
    """Every span once, depth first; iterative (a 10,000-deep chain is fine)."""
    by_id = {s.span_id: s for s in spans}
    children: dict[str | None, list[SpanRecord]] = defaultdict(list)
    for s in spans:
        parent_id = s.parent_span_id if s.parent_span_id in by_id else None
        children[parent_id].append(s)
    for kids in children.values():
        kids.sort(key=lambda s: (s.start_ns, s.span_id))
    rows: list[Row] = []
    seen: set[str] = set()
    stack: list[tuple[SpanRecord, int]] = [(s, 0) for s in reversed(children[None])]
    while stack:
        span, depth = stack.pop()
        if span.span_id in seen:
            continue
        seen.add(span.span_id)
        parent = by_id.get(span.parent_span_id or "")
        verify_failed = span.name == semconv.SPAN_VERIFY and (
            verify_outcome(span.attributes, span.status_code) == "failed"
        )
        rows.append(
            Row(
                span=span,
                depth=depth,
                cross_process=parent is not None and parent.service != span.service,
                orphan=span.parent_span_id is not None and parent is None,
                verify_failed=verify_failed,
            )
        )
        stack.extend((c, depth + 1) for c in reversed(children.get(span.span_id, [])))
    # a parent cycle (corrupt data) leaves spans unreached: show them at the end
    rows.extend(Row(s, 0, False, True, False) for s in spans if s.span_id not in seen)
    return rows


def completeness(spans: Sequence[SpanRecord], now_ns: int, settle_s: float) -> Completeness:
    """See the module docstring."""
    ids = {s.span_id for s in spans}
    parents = {s.parent_span_id for s in spans if s.parent_span_id}
    missing = sum(1 for s in spans if s.parent_span_id and s.parent_span_id not in ids)
    awaiting = sum(1 for s in spans if s.kind == KIND_CLIENT and s.span_id not in parents)
    has_root = any(not s.parent_span_id for s in spans)
    last = max((s.stored_ns for s in spans), default=0)
    settled = now_ns - last >= settle_s * 1e9
    if has_root and not missing and (not awaiting or settled):
        state = "complete"
    elif not settled:
        state = "arriving"
    else:
        state = "incomplete"
    return Completeness(state, missing, awaiting, has_root, last)


def service_classes(spans: Sequence[SpanRecord]) -> dict[str, str]:
    """Service -> its colour class, in order of first start."""
    out: dict[str, str] = {}
    for s in sorted(spans, key=lambda s: s.start_ns):
        if s.service not in out:
            out[s.service] = f"svc-{len(out) % PALETTE}"
    return out


def nice_ticks(span_ms: float, count: int = 6) -> list[float]:
    """Tick positions (ms from the trace start) at a 1-2-5 step covering ``span_ms``."""
    if span_ms <= 0:
        return [0.0]
    raw = span_ms / count
    step = 1e-3
    while step * 10 <= raw:
        step *= 10
    for mult in (1, 2, 5, 10):
        if step * mult >= raw:
            step *= mult
            break
    ticks: list[float] = []
    t = 0.0
    while t <= span_ms + 1e-9:
        ticks.append(round(t, 6))
        t += step
    return ticks
