"""The pages, as functions from what the store returned to a whole HTML document.

Nothing here reads the store (see :mod:`.app`); every value that came from a span is
escaped by :func:`~.html.e` / :func:`~.html.clip`. Elements the browser tests look for
carry ``data-testid`` (and ``data-*`` values) attributes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from gym_sidecar.store.queries import RolloutSummary
from gym_sidecar.store.stats import Stats
from gym_sidecar.webui import svg
from gym_sidecar.webui.html import clip, e, fmt_ms, page, seg, table, url

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
    env: str = ""
    """An environment: the exact service of the rollout span (the agent server)."""

    def params(self) -> dict[str, object]:
        return {
            "failed": "1" if self.failed else "",
            "server": self.server,
            "slower_than": self.slower_than,
            "faster_than": self.faster_than,
            "since": self.since,
            "rollout": self.rollout,
            "env": self.env,
        }


def message_page(title: str, message: str, *, active: str = "") -> str:
    return page(title, f'<p class="message" data-testid="message">{e(message)}</p>', active=active)


def not_found_page(message: str) -> str:
    return page(
        "Not found",
        f'<p class="message" data-testid="not-found">{e(message)}</p>'
        '<p><a href="/rollouts">All rollouts</a></p>',
    )


def figure(value: float | None) -> str:
    """An RL figure for a cell: ``-`` when the span had none."""
    return "-" if value is None else f"{value:.4g}"


def tokens_text(input_tokens: int | None, output_tokens: int | None) -> str:
    """``34 / 13`` (input / output), ``-`` when neither is known."""
    if input_tokens is None and output_tokens is None:
        return "-"
    return f"{figure(input_tokens)} / {figure(output_tokens)}"


def _rollout_row(r: RolloutSummary) -> str:
    cls = "failed" if r.failed else ""
    verify = f'<span class="verify {e(r.verify)}">{e(r.verify)}</span>'
    status = '<span class="badge error">error</span>' if r.error else "ok"
    return (
        f'<tr class="{cls}" data-testid="rollout-row" data-rollout="{e(r.rollout_id)}" '
        f'data-trace="{e(r.trace_id)}" data-failed="{str(r.failed).lower()}" '
        f'data-env="{e(r.service)}" data-reward="{e(figure(r.reward))}" '
        f'data-turns="{e(figure(r.turns))}" data-tokens="{e(figure(r.tokens))}">'
        f'<td><a href="/trace/{e(seg(r.trace_id))}">{clip(r.rollout_id, 80)}</a></td>'
        f'<td>{e(when(r.start_ns))}</td><td class="num">{e(fmt_ms(r.duration_ms))}</td>'
        f'<td>{status}</td><td>{verify}</td><td class="num">{e(figure(r.reward))}</td>'
        f'<td class="num">{e(figure(r.turns))}</td>'
        f'<td class="num">{e(tokens_text(r.input_tokens, r.output_tokens))}</td>'
        f'<td class="num">{r.span_count}</td>'
        f"<td>{clip(r.service, 80)}</td>"
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
        f'<label>environment <input name="env" size="16" value="{e(filters.env)}" '
        'placeholder="any"></label>'
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
            [
                "rollout",
                "start (UTC)",
                "duration",
                "status",
                "verify",
                "reward",
                "turns",
                "tokens in / out",
                "spans",
                "environment",
                "services",
            ],
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
    series: str = "",
) -> str:
    """Percentiles, two histograms (rollout buckets link to their rollouts), the verify
    success fraction over time, and ``series`` (the RL time series, already rendered:
    ``rl_pages.series_section``)."""
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
        series,
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
