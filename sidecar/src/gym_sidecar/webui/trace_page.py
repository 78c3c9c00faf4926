"""The trace pages: one trace's waterfall (rows, time axis, details, pager) and the
choice between several traces of one id. Every value from a span is escaped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import gym_telemetry_semconv as semconv

from gym_sidecar.core import producers
from gym_sidecar.store.figures import RlFigures
from gym_sidecar.store.queries import SpanRecord
from gym_sidecar.webui.html import clip, e, fmt_ms, kv_table, page, seg, url
from gym_sidecar.webui.pages import KIND_LABELS, STATUS_LABELS, figure, tokens_text, when
from gym_sidecar.webui.waterfall import (
    MAX_DEPTH_CLASS,
    PAGE_ROWS,
    Completeness,
    Row,
    nice_ticks,
    service_classes,
    tree_rows,
)


def trace_choice_page(ident: str, trace_ids: Sequence[str]) -> str:
    links = "".join(
        f'<li><a href="/trace/{e(seg(t))}" data-testid="trace-choice">{e(t)}</a></li>'
        for t in trace_ids
    )
    return page(
        f"Traces of {ident}", f"<p>{len(trace_ids)} traces match {e(ident)!s}:</p><ul>{links}</ul>"
    )


def _details(row: Row, classes: Mapping[str, str]) -> str:
    s = row.span
    status = STATUS_LABELS.get(s.status_code, str(s.status_code))
    fields: dict[str, object] = {
        "service": s.service,
        "span id": s.span_id,
        "parent span id": s.parent_span_id or "(root)",
        "kind": KIND_LABELS.get(s.kind, str(s.kind)),
        "start (UTC)": when(s.start_ns),
        "duration": fmt_ms(s.duration_ms),
        "status": status + (f": {s.status_message}" if s.status_message else ""),
        "scope": s.scope + (f" {s.scope_version}" if s.scope_version else ""),
        # which telemetry wrote it: the agent, Gym's own (nemo_gym.telemetry), other
        "producer": producers.scope_role(s.scope).producer.value,
    }
    parts = [
        '<div class="detail" data-testid="span-detail">',
        "<h3>Span</h3>",
        kv_table(fields),
        "<h3>Attributes</h3>",
        kv_table(s.attributes) if s.attributes else "<p>none</p>",
    ]
    if s.events:
        parts.append('<h3>Events</h3><ol class="events">')
        for ev in s.events:
            offset = fmt_ms((ev.time_ns - s.start_ns) / 1e6)
            parts.append(
                f"<li><b>{clip(ev.name)}</b> at +{e(offset)}{kv_table(ev.attributes)}</li>"
            )
        parts.append("</ol>")
    if s.links:
        links = "".join(f"<li>{e(t)} / {e(sp)}</li>" for t, sp in s.links)
        parts.append(f"<h3>Links</h3><ul>{links}</ul>")
    parts.extend(["<h3>Resource</h3>", kv_table(s.resource), "</div>"])
    return "".join(parts)


def _waterfall_row(row: Row, t0: int, total_ns: int, classes: Mapping[str, str]) -> str:
    s = row.span
    svc = classes.get(s.service, "svc-0")
    x = 1000 * (s.start_ns - t0) / total_ns if total_ns else 0
    w = max(2.0, 1000 * max(0, s.end_ns - s.start_ns) / total_ns) if total_ns else 1000
    x = min(x, 998.0)
    flags = []
    if row.cross_process:
        flags.append(
            '<span class="edge" title="parent in another process" data-testid="cross-process">'
            "⇢</span>"
        )
    if row.orphan:
        flags.append('<span class="badge orphan">orphan</span>')
    if row.error:
        flags.append('<span class="badge error" data-testid="span-error">error</span>')
    if row.verify_failed:
        flags.append(
            '<span class="badge verify-failed" data-testid="verify-failed">verification '
            "failed</span>"
        )
    classes_attr = " ".join(
        c
        for c in (
            "span",
            "error" if row.error else "",
            "verify-failed" if row.verify_failed else "",
        )
        if c
    )
    depth = min(row.depth, MAX_DEPTH_CLASS)
    return (
        f'<details class="{classes_attr}" data-testid="span" data-span-id="{e(s.span_id)}" '
        f'data-service="{e(s.service)}" data-name="{e(s.name)}" data-depth="{row.depth}" '
        f'data-error="{str(row.error).lower()}" '
        f'data-verify-failed="{str(row.verify_failed).lower()}">'
        f'<summary><span class="label d{depth}">{"".join(flags)}'
        f'<span class="svc {svc}">{clip(s.service, 60)}</span> '
        f'<span class="op">{clip(s.name, 120)}</span></span>'
        f'<span class="dur">{e(fmt_ms(s.duration_ms))}</span>'
        f'<svg class="bar" viewBox="0 0 1000 14" preserveAspectRatio="none" aria-hidden="true">'
        f'<rect class="{svc}" x="{x:.2f}" y="2" width="{min(w, 1000 - x):.2f}" height="10"/></svg>'
        f"</summary>{_details(row, classes)}</details>"
    )


def trace_page(
    trace_id: str,
    spans: Sequence[SpanRecord],
    state: Completeness,
    *,
    page_no: int,
    errors_only: bool,
    jaeger_url: str | None,
) -> str:
    """One trace's waterfall, :data:`PAGE_ROWS` rows per page."""
    rows = tree_rows(spans)
    classes = service_classes(spans)
    t0 = min(s.start_ns for s in spans)
    t1 = max(s.end_ns for s in spans)
    total_ns = max(1, t1 - t0)
    shown = [r for r in rows if r.error or r.verify_failed] if errors_only else rows
    pages = max(1, -(-len(shown) // PAGE_ROWS))
    page_no = min(page_no, pages - 1)
    window = shown[page_no * PAGE_ROWS : (page_no + 1) * PAGE_ROWS]
    rollouts = sorted({s.rollout_id for s in spans if s.rollout_id})
    errors = sum(1 for r in rows if r.error)
    failed_verifies = sum(1 for r in rows if r.verify_failed)
    state_text = {
        "complete": "complete",
        "arriving": "still arriving: spans of this trace were stored moments ago; this page "
        "reloads",
        "incomplete": "incomplete: some spans never arrived",
    }[state.state]
    notes = []
    if state.missing_parents:
        notes.append(f"{state.missing_parents} spans whose parent is not stored")
    if not state.has_root:
        notes.append("no root span stored")
    if state.awaiting_callees:
        notes.append(f"{state.awaiting_callees} client calls without a span from the callee")
    rollout_spans = sorted(
        (s for s in spans if s.name == semconv.SPAN_ROLLOUT), key=lambda s: s.start_ns
    )
    figures = RlFigures()
    if rollout_spans:  # the outermost (it starts first); counts from whichever carries them
        figures = RlFigures.of(rollout_spans[0].attributes)
        for inner in rollout_spans[1:]:
            figures = figures.or_counts_of(RlFigures.of(inner.attributes))
    legend = "".join(
        f'<li data-testid="service" data-service="{e(name)}"><span class="swatch {cls}"></span>'
        f"{clip(name, 80)}</li>"
        for name, cls in classes.items()
    )
    head = [
        '<dl class="summary" data-testid="trace-summary" '
        f'data-trace-id="{e(trace_id)}" data-spans="{len(spans)}" data-state="{e(state.state)}" '
        f'data-complete="{str(state.state == "complete").lower()}" data-errors="{errors}">',
        f"<dt>trace id</dt><dd>{e(trace_id)}</dd>",
        f"<dt>rollout</dt><dd>{clip(', '.join(rollouts) or '-')}</dd>",
        f"<dt>spans</dt><dd>{len(spans)} from {len(classes)} services</dd>",
        f"<dt>duration</dt><dd>{e(fmt_ms(total_ns / 1e6))}, started {e(when(t0))} UTC</dd>",
        f"<dt>errors</dt><dd>{errors} spans, {failed_verifies} failed verifications</dd>",
        f'<dt>reward</dt><dd data-testid="trace-reward">{e(figure(figures.reward))}</dd>',
        f'<dt>turns</dt><dd data-testid="trace-turns">{e(figure(figures.turns))}</dd>',
        '<dt>tokens in / out</dt><dd data-testid="trace-tokens">'
        f"{e(tokens_text(figures.input_tokens, figures.output_tokens))}</dd>",
        f'<dt>state</dt><dd class="state {e(state.state)}" data-testid="trace-state">'
        f"{e(state_text)}"
        f"{' (' + e('; '.join(notes)) + ')' if notes else ''}</dd>",
        "</dl>",
        f'<ul class="legend">{legend}</ul>',
    ]
    if jaeger_url:
        href = f"{jaeger_url.rstrip('/')}/trace/{seg(trace_id)}"
        head.append(
            f'<p><a class="jaeger" data-testid="jaeger-link" href="{e(href)}">this trace in '
            "Jaeger</a></p>"
        )
    toggle = url(f"/trace/{seg(trace_id)}", {"errors": "" if errors_only else "1"})
    head.append(
        f'<p class="tools"><a href="{toggle}" data-testid="errors-toggle">'
        f"{'all spans' if errors_only else 'only failed spans'}</a> · "
        f'<a href="/api/traces/{e(seg(trace_id))}">JSON (Jaeger API)</a> · '
        "click a row for the span's details; ⇢ marks a parent in another process</p>"
    )
    ticks = nice_ticks(total_ns / 1e6)
    tick_svg = "".join(
        f'<line x1="{1000 * t * 1e6 / total_ns:.1f}" y1="14" x2="{1000 * t * 1e6 / total_ns:.1f}" '
        'y2="20"/>'
        f'<text x="{min(1000 * t * 1e6 / total_ns, 960):.1f}" y="11">{e(fmt_ms(t))}</text>'
        for t in ticks
        if t * 1e6 <= total_ns
    )
    axis = (
        '<div class="axisrow"><span class="label">service · span</span><span class="dur">'
        "duration</span>"
        '<svg class="axis" viewBox="0 0 1000 20" preserveAspectRatio="none" '
        'data-testid="time-axis">'
        f"{tick_svg}</svg></div>"
    )
    body_rows = "".join(_waterfall_row(r, t0, total_ns, classes) for r in window)
    pager = []
    base = {"errors": "1" if errors_only else ""}
    if page_no > 0:
        pager.append(
            '<a rel="prev" '
            f'href="{url(f"/trace/{seg(trace_id)}", {**base, "page": page_no - 1})}">← previous</a>'
        )
    if page_no < pages - 1:
        pager.append(
            '<a rel="next" '
            f'href="{url(f"/trace/{seg(trace_id)}", {**base, "page": page_no + 1})}">next →</a>'
        )
    first = page_no * PAGE_ROWS + 1 if window else 0
    pager_html = (
        f'<p class="pager" data-testid="trace-pager" data-pages="{pages}" '
        f'data-rows="{len(window)}">'
        f"rows {first}-{page_no * PAGE_ROWS + len(window)} of {len(shown)} {' '.join(pager)}</p>"
    )
    waterfall = f'<div class="waterfall" data-testid="waterfall">{axis}{body_rows}</div>'
    refresh = 2 if state.state == "arriving" else None
    return page(
        f"Trace {trace_id[:16]}",
        "".join(head) + pager_html + waterfall + pager_html,
        refresh_s=refresh,
    )
