"""The pages, as functions from what the store returned to a whole HTML document.

Nothing here reads the store (see :mod:`.app`); every value that came from a span is
escaped by :func:`~.html.e` / :func:`~.html.clip`. Elements the browser tests look for
carry ``data-testid`` (and ``data-*`` values) attributes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gym_sidecar.store.queries import RolloutSummary, SpanRecord
from gym_sidecar.store.stats import Stats
from gym_sidecar.webui import svg
from gym_sidecar.webui.html import clip, e, fmt_ms, kv_table, page, seg, table, url
from gym_sidecar.webui.waterfall import (
    MAX_DEPTH_CLASS,
    PAGE_ROWS,
    Completeness,
    Row,
    nice_ticks,
    service_classes,
    tree_rows,
)

KIND_LABELS = {
    0: "unspecified",
    1: "internal",
    2: "server",
    3: "client",
    4: "producer",
    5: "consumer",
}
STATUS_LABELS = {0: "unset", 1: "ok", 2: "error"}
REFRESH_S = 5


def when(ns: int) -> str:
    """UTC wall time of a nanosecond timestamp."""
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


@dataclass(frozen=True)
class RolloutFilters:
    failed: bool = False
    server: str = ""
    slower_than: str = ""
    faster_than: str = ""
    since: str = ""
    rollout: str = ""

    def params(self) -> dict[str, object]:
        return {
            "failed": "1" if self.failed else "",
            "server": self.server,
            "slower_than": self.slower_than,
            "faster_than": self.faster_than,
            "since": self.since,
            "rollout": self.rollout,
        }


def message_page(title: str, message: str, *, active: str = "") -> str:
    return page(title, f'<p class="message" data-testid="message">{e(message)}</p>', active=active)


def not_found_page(message: str) -> str:
    return page(
        "Not found",
        f'<p class="message" data-testid="not-found">{e(message)}</p>'
        '<p><a href="/rollouts">All rollouts</a></p>',
    )


def _rollout_row(r: RolloutSummary) -> str:
    cls = "failed" if r.failed else ""
    verify = f'<span class="verify {e(r.verify)}">{e(r.verify)}</span>'
    status = '<span class="badge error">error</span>' if r.error else "ok"
    return (
        f'<tr class="{cls}" data-testid="rollout-row" data-rollout="{e(r.rollout_id)}" '
        f'data-trace="{e(r.trace_id)}" data-failed="{str(r.failed).lower()}">'
        f'<td><a href="/trace/{e(seg(r.trace_id))}">{clip(r.rollout_id, 80)}</a></td>'
        f'<td>{e(when(r.start_ns))}</td><td class="num">{e(fmt_ms(r.duration_ms))}</td>'
        f'<td>{status}</td><td>{verify}</td><td class="num">{r.span_count}</td>'
        f"<td>{clip(', '.join(r.services))}</td></tr>"
    )


def rollouts_page(
    rows: Sequence[RolloutSummary],
    filters: RolloutFilters,
    *,
    page_no: int,
    has_more: bool,
    services: Sequence[str],
    error: str = "",
) -> str:
    """The rollouts list: the filter form, a page of rows, newer/older links."""
    checked = " checked" if filters.failed else ""
    options = "".join(f'<option value="{e(s)}">' for s in services)
    form = (
        '<form class="filters" method="get" action="/rollouts" data-testid="filters">'
        f'<label><input type="checkbox" name="failed" value="1"{checked}> failed only</label>'
        f'<label>server <input name="server" list="services" value="{e(filters.server)}" '
        'placeholder="any"></label>'
        f'<datalist id="services">{options}</datalist>'
        f'<label>slower than <input name="slower_than" size="6" value="{e(filters.slower_than)}" '
        'placeholder="2s"></label>'
        f'<label>faster than <input name="faster_than" size="6" value="{e(filters.faster_than)}" '
        'placeholder="10s"></label>'
        f'<label>since <input name="since" size="6" value="{e(filters.since)}" '
        'placeholder="15m"></label>'
        f'<label>rollout id <input name="rollout" size="12" value="{e(filters.rollout)}"></label>'
        '<button type="submit">Filter</button> <a href="/rollouts">clear</a></form>'
    )
    body = [form]
    if error:
        body.append(f'<p class="message error" data-testid="filter-error">{e(error)}</p>')
    body.append(
        '<p class="hint">Newest first. A rollout is failed when its rollout span is an error '
        "or its verification failed. The first page refreshes every few seconds.</p>"
    )
    refreshing = page_no == 0
    region = (
        f'<div data-testid="rollouts" data-refresh="{REFRESH_S if refreshing else 0}" '
        f'id="rollouts-region">'
    )
    if rows:
        region += table(
            ["rollout", "start (UTC)", "duration", "status", "verify", "spans", "services"],
            (_rollout_row(r) for r in rows),
            "rollouts",
        )
    else:
        region += '<p class="empty" data-testid="no-rollouts">No rollouts match.</p>'
    pager = []
    params = filters.params()
    if page_no > 0:
        pager.append(
            f'<a rel="prev" href="{url("/rollouts", {**params, "page": page_no - 1 or ""})}">← '
            "newer</a>"
        )
    if has_more:
        pager.append(
            f'<a rel="next" href="{url("/rollouts", {**params, "page": page_no + 1})}">older →</a>'
        )
    region += f'<p class="pager" data-testid="pager">page {page_no + 1} {" ".join(pager)}</p></div>'
    body.append(region)
    return page(
        "Rollouts", "".join(body), active="/rollouts", refresh_s=REFRESH_S if refreshing else None
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


def _dist_row(label: str, count: int, quantiles: Sequence[float | None]) -> str:
    cells = "".join(f'<td class="num">{e(fmt_ms(q))}</td>' for q in quantiles)
    return (
        f'<tr data-testid="quantiles" data-what="{e(label)}" data-count="{count}"><th>'
        f'{e(label)}</th><td class="num">{count}</td>{cells}</tr>'
    )


def stats_page(  # noqa: PLR0917 (one argument per part of the page)
    result: Stats,
    rollout_buckets: Sequence[svg.Bucket],
    verify_buckets: Sequence[svg.Bucket],
    success: Sequence[tuple[str, float, int]],
    since: str,
    error: str = "",
) -> str:
    """Percentiles, two histograms (rollout buckets link to their rollouts), the verify
    success fraction over time."""
    form = (
        '<form class="filters" method="get" action="/stats"><label>since '
        f'<input name="since" size="6" value="{e(since)}" placeholder="all"></label>'
        '<button type="submit">Show</button></form>'
    )
    rows = [
        _dist_row("rollout (spans)", result.rollout_spans.count, result.rollout_spans.quantiles),
        _dist_row("verify (spans)", result.verify_spans.count, result.verify_spans.quantiles),
        _dist_row(
            "rollout (gym.rollout.duration_ms)",
            result.rollout_points.count,
            result.rollout_points.quantiles,
        ),
        _dist_row(
            "verify (gym.verify.duration_ms)",
            result.verify_points.count,
            result.verify_points.quantiles,
        ),
    ]
    ok, total = result.verify_span_success
    pok, ptotal = result.verify_point_success
    fraction = (
        f'<p data-testid="verify-success" data-completed="{ok}" data-total="{total}" '
        f'data-metric-succeeded="{pok}" data-metric-total="{ptotal}">verify success: '
        f"{ok}/{total} spans completed{f' ({ok / total:.1%})' if total else ''}; "
        f"gym.verify.count succeeded=true {pok}/{ptotal}</p>"
    )
    body = [form]
    if error:
        body.append(f'<p class="message error">{e(error)}</p>')
    body += [
        table(["", "count", "p50", "p95", "p99"], rows, "quantiles"),
        fraction,
        '<h2>Rollout durations</h2><p class="hint">Click a bar for its rollouts.</p>',
        svg.histogram(rollout_buckets, "rollout durations", "rollout-histogram"),
        "<h2>Verify durations</h2>",
        svg.histogram(verify_buckets, "verify durations", "verify-histogram"),
        "<h2>Verify success fraction over time</h2>",
        svg.fraction_chart(success, "success-chart"),
    ]
    return page("Stats", "".join(body), active="/stats")


def map_page(
    nodes: dict[str, tuple[int, int]],
    edges: Sequence[svg.Edge],
    traces_read: int,
    limit: int,
    since: str,
) -> str:
    form = (
        '<form class="filters" method="get" action="/map"><label>since '
        f'<input name="since" size="6" value="{e(since)}" placeholder="all"></label>'
        '<button type="submit">Show</button></form>'
    )
    edge_rows = (
        f'<tr data-testid="edge" data-source="{e(x.source)}" data-target="{e(x.target)}" '
        f'data-calls="{x.calls}" data-errors="{x.errors}"><td>{clip(x.source)}</td><td>→</td>'
        f'<td>{clip(x.target)}</td><td class="num">{x.calls}</td><td class="num">'
        f"{x.error_fraction:.1%}</td></tr>"
        for x in edges
    )
    node_rows = (
        f'<tr data-testid="node" data-service="{e(n)}" data-spans="{s}" data-errors="{er}"><td>'
        f"{clip(n)}</td>"
        f'<td class="num">{s}</td><td class="num">{er}</td></tr>'
        for n, (s, er) in sorted(nodes.items())
    )
    note = (
        f'<p class="hint" data-testid="map-scope" data-traces="{traces_read}">From the '
        f"{traces_read} most "
        f"recently stored traces (at most {limit}). A call is a span whose parent span is in "
        "another "
        "service; its error fraction is the share of those spans with status ERROR.</p>"
    )
    body = [
        form,
        note,
        svg.service_map(nodes, edges),
        "<h2>Calls</h2>",
        table(["caller", "", "callee", "calls", "errors"], edge_rows, "edges"),
        "<h2>Services</h2>",
        table(["service", "spans", "error spans"], node_rows, "nodes"),
    ]
    return page("Service map", "".join(body), active="/map")
