"""``rich`` renderables for the rollouts table, the trace waterfall and the stats.

Pure functions of the query results: no I/O, so the demo and the CLI print the same.

Every string that came from a client (span and service names, rollout ids, attribute
values, status messages) reaches the table through ``untrusted()``: a ``Text`` (never
parsed as rich markup) of ``gym_telemetry_semconv.safetext.clip`` (control characters
shown as ``\\xNN``, over-long values cut with ``…``). Titles quoting such strings are
``Text`` too, for the same reason.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Final

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv.safetext import clip
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from gym_sidecar.store.queries import STATUS_ERROR, RolloutSummary, SpanRecord
from gym_sidecar.store.stats import QUANTILES, Distribution, Stats

BAR_WIDTH: Final = 24
TRACE_ID_CHARS: Final = 16
"""Trace ids are shown by their first 16 hex digits (``trace`` accepts any 8+ prefix)."""
PIPE_WIDTH: Final = 160
"""Console width when output is not a terminal (rich would use 80)."""
KEY_ATTRIBUTES: Final[tuple[str, ...]] = (
    semconv.HTTP_ROUTE,
    semconv.URL_PATH,
    semconv.HTTP_RESPONSE_STATUS_CODE,
    semconv.VERIFY_SUCCEEDED,
    semconv.ERROR_TYPE,
    semconv.GEN_AI_REQUEST_MODEL,
)
"""Span attributes shown in the waterfall (when present), in this order."""
_KINDS: Final = {1: "int", 2: "srv", 3: "cli", 4: "prod", 5: "cons"}
MAX_ID_CHARS: Final = 64
"""Longest rollout id (or service name) shown; longer ones end in ``…``."""
MAX_NAME_CHARS: Final = 120
"""Longest span name shown."""
SPAN_COLUMN_WIDTH: Final = 56
"""Widest the waterfall's span column gets (depth indent included)."""
MAX_VALUE_CHARS: Final = 80
"""Longest attribute value or status message shown."""


def untrusted(value: object, max_chars: int = MAX_VALUE_CHARS, style: str = "") -> Text:
    """A client-supplied value as rich ``Text``: no markup, controls escaped, clipped."""
    return Text(clip(str(value), max_chars), style=style)


def figure(value: float | None) -> str:
    """An RL figure (reward, turns, a token count): ``-`` when unknown."""
    return "-" if value is None else f"{value:.4g}"


def tokens(input_tokens: int | None, output_tokens: int | None) -> str:
    """``34/13``, ``-`` when neither is known."""
    if input_tokens is None and output_tokens is None:
        return "-"
    return f"{figure(input_tokens)}/{figure(output_tokens)}"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def make_console() -> Console:
    """A console for the commands: the terminal's width, or PIPE_WIDTH when piped."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=PIPE_WIDTH)
    return console


def _when(ns: int) -> str:
    when = dt.datetime.fromtimestamp(ns / 1e9)
    if dt.datetime.now() - when < dt.timedelta(hours=20):
        return when.strftime("%H:%M:%S")
    return when.strftime("%m-%d %H:%M")


def _short_service(service: str) -> str:
    return clip(service.rsplit("/", 1)[-1], MAX_ID_CHARS)


def rollouts_table(rows: Sequence[RolloutSummary], title: str = "Rollouts") -> Table:
    """One line per rollout: id, trace id, start, duration, verify outcome, spans, services."""
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("rollout id", style="cyan", no_wrap=True)
    table.add_column("trace id", no_wrap=True)
    table.add_column("start", no_wrap=True)
    table.add_column("duration ms", justify="right")
    table.add_column("verify", justify="center")
    table.add_column("reward", justify="right")
    table.add_column("turns", justify="right")
    table.add_column("tokens in/out", justify="right")
    table.add_column("spans", justify="right")
    table.add_column("services")
    for r in rows:
        verify = Text(r.verify, style={"ok": "green", "failed": "bold red"}.get(r.verify, "dim"))
        duration = Text(_ms(r.duration_ms), style="red" if r.error else "")
        table.add_row(
            untrusted(r.rollout_id, MAX_ID_CHARS),
            untrusted(r.trace_id[:TRACE_ID_CHARS]),
            _when(r.start_ns),
            duration,
            verify,
            figure(r.reward),
            figure(r.turns),
            tokens(r.input_tokens, r.output_tokens),
            str(r.span_count),
            Text(", ".join(_short_service(s) for s in r.services)),
        )
    if not rows:
        table.caption = "no rollouts match"
    return table


def _ordered(spans: Sequence[SpanRecord]) -> list[tuple[int, SpanRecord, bool]]:
    """Depth-first (depth, span, orphan) by start time; orphans' parents were not stored."""
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[SpanRecord]] = {}
    for s in spans:
        parent = s.parent_span_id if s.parent_span_id in ids else None
        children.setdefault(parent, []).append(s)
    out: list[tuple[int, SpanRecord, bool]] = []
    stack: list[tuple[int, SpanRecord]] = [
        (0, s) for s in sorted(children.get(None, []), key=lambda s: s.start_ns, reverse=True)
    ]
    while stack:
        depth, span = stack.pop()
        out.append(
            (depth, span, span.parent_span_id is not None and span.parent_span_id not in ids)
        )
        kids = sorted(children.get(span.span_id, []), key=lambda s: s.start_ns, reverse=True)
        stack.extend((depth + 1, k) for k in kids)
    return out


def _bar(span: SpanRecord, t0: int, total_ns: int) -> Text:
    start = int((span.start_ns - t0) / total_ns * BAR_WIDTH) if total_ns else 0
    width = max(1, round((span.end_ns - span.start_ns) / total_ns * BAR_WIDTH)) if total_ns else 1
    start = min(start, BAR_WIDTH - 1)
    width = min(width, BAR_WIDTH - start)
    style = "red" if span.status_code == STATUS_ERROR else "green"
    return (
        Text(" " * start) + Text("█" * width, style=style) + Text(" " * (BAR_WIDTH - start - width))
    )


def _key_attributes(span: SpanRecord) -> Text:
    parts = [
        f"{k}={clip(str(span.attributes[k]), MAX_VALUE_CHARS)}"
        for k in KEY_ATTRIBUTES
        if k in span.attributes
    ]
    if span.status_code == STATUS_ERROR and span.status_message:
        parts.append(f"error: {clip(span.status_message, MAX_VALUE_CHARS)}")
    return Text(" ".join(parts))


def trace_waterfall(spans: Sequence[SpanRecord]) -> Table:
    """The span tree of one trace with a time bar per span.

    A span whose service differs from its parent's is a cross-process edge: its service
    is marked ``⇢`` and printed in bold. Spans whose parent was not stored are marked
    ``(orphan)``.
    """
    if not spans:
        return Table(title="no spans")
    t0 = min(s.start_ns for s in spans)
    t1 = max(s.end_ns for s in spans)
    total = max(1, t1 - t0)
    rollout_ids = sorted({clip(s.rollout_id, MAX_ID_CHARS) for s in spans if s.rollout_id})
    title = Text(f"trace {clip(spans[0].trace_id, MAX_ID_CHARS)}")
    if rollout_ids:
        title.append(f"  rollout {', '.join(rollout_ids)}")
    title.append(f"  {len(spans)} spans  {_ms(total / 1e6)} ms")
    table = Table(title=title, title_justify="left", header_style="bold")
    # a long span name is cut (visibly) rather than squeezing the other columns away
    table.add_column("span", no_wrap=True, overflow="ellipsis", max_width=SPAN_COLUMN_WIDTH)
    table.add_column("service", no_wrap=True, overflow="ellipsis", max_width=30)
    table.add_column("kind", no_wrap=True)
    table.add_column("ms", justify="right", no_wrap=True)
    table.add_column("timeline", no_wrap=True)
    table.add_column("attributes", overflow="fold", min_width=30)
    by_id = {s.span_id: s for s in spans}
    for depth, span, orphan in _ordered(spans):
        parent = by_id.get(span.parent_span_id or "")
        crossed = parent is not None and parent.service != span.service
        name = Text("  " * depth + ("└ " if depth else "") + clip(span.name, MAX_NAME_CHARS))
        if orphan:
            name.append(" (orphan)", style="dim")
        service = Text(("⇢ " if crossed else "") + _short_service(span.service))
        if crossed:
            service.stylize("bold magenta")
        table.add_row(
            name,
            service,
            _KINDS.get(span.kind, "-"),
            _ms(span.duration_ms),
            _bar(span, t0, total),
            _key_attributes(span),
        )
    table.caption = "⇢ marks a span in another process than its parent (a cross-process edge)"
    return table


def _quantile_cells(d: Distribution) -> list[str]:
    return [_ms(q) for q in d.quantiles]


def _fraction(ok: int, total: int) -> str:
    return "-" if total == 0 else f"{ok / total:.1%} ({ok}/{total})"


def stats_table(stats: Stats) -> Group:
    """Duration percentiles and the verify success fraction, from spans and from points."""
    window = "everything stored" if stats.window_s is None else f"last {stats.window_s:.0f}s"
    table = Table(title=f"Stats ({window})", title_justify="left", header_style="bold")
    table.add_column("measure")
    table.add_column("source")
    table.add_column("count", justify="right")
    for q in QUANTILES:
        table.add_column(f"p{round(q * 100)} ms", justify="right")
    rows: list[tuple[str, str, Distribution]] = [
        ("rollout duration", "spans (exact)", stats.rollout_spans),
        ("rollout duration", f"{semconv.METRIC_ROLLOUT_DURATION} (buckets)", stats.rollout_points),
        ("verify duration", "spans (exact)", stats.verify_spans),
        ("verify duration", f"{semconv.METRIC_VERIFY_DURATION} (buckets)", stats.verify_points),
    ]
    for measure, source, dist in rows:
        table.add_row(measure, source, str(dist.count), *_quantile_cells(dist))
    success = Table(header_style="bold", title_justify="left")
    success.add_column("verify success fraction")
    success.add_column("source")
    success.add_row(_fraction(*stats.verify_span_success), "spans")
    success.add_row(_fraction(*stats.verify_point_success), semconv.METRIC_VERIFY_COUNT)
    return Group(table, success)
