"""The pictures, as inline SVG (presentation attributes and CSS classes only: no inline
style, which the Content-Security-Policy forbids). Labels from span data are escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gym_sidecar.webui.html import e, fmt_ms


@dataclass(frozen=True)
class Bucket:
    lower_ms: float
    upper_ms: float
    count: int
    href: str | None = None
    """Escaped same-site link of the bucket's bar (its rollouts), or None."""


def nice_bounds(values: Sequence[float], max_buckets: int = 16) -> list[float]:
    """Bucket bounds at 1-2-5 steps covering ``values`` (ms), at most ``max_buckets``:
    the first bound is at or below the smallest value, the last above the largest."""
    if not values:
        return []
    low, high = max(min(values), 1e-3), max(*values, 1e-3)
    exp = math.floor(math.log10(low))
    ladder: list[float] = []
    while not ladder or ladder[-1] <= high:
        ladder.extend(m * 10.0**exp for m in (1, 2, 5))
        exp += 1
    start = max(i for i, b in enumerate(ladder) if b <= low)
    end = min(i for i, b in enumerate(ladder) if b > high)
    bounds = ladder[start : end + 1]
    if len(bounds) < 6:
        # a narrow range: linear buckets of a 1-2-5 width instead
        step = nice_step((high - low) / 8 if high > low else low / 8)
        first = math.floor(low / step) * step
        count = math.floor((high - first) / step) + 1
        return [first + i * step for i in range(count + 1)]
    while len(bounds) > max_buckets + 1:
        bounds = bounds[::2] if (len(bounds) - 1) % 2 == 0 else [*bounds[::2], bounds[-1]]
    return bounds


def nice_step(raw: float) -> float:
    """The smallest 1-2-5 step at least ``raw``."""
    step = 10.0 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for mult in (1, 2, 5, 10):
        if step * mult >= raw:
            return step * mult
    return step * 10


def bucketize(values: Sequence[float], bounds: Sequence[float]) -> list[tuple[float, float, int]]:
    """(lower, upper, count) per bucket [lower, upper); the last one includes its upper."""
    out = []
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        last = i == len(bounds) - 2
        n = sum(1 for v in values if lo <= v < hi or (last and v == hi) or (i == 0 and v < lo))
        out.append((lo, hi, n))
    return out


def histogram(buckets: Sequence[Bucket], label: str, testid: str) -> str:
    """A bar per bucket (count on top, bounds below); bars with ``href`` are links."""
    if not buckets:
        return f'<p class="empty" data-testid="{e(testid)}">no {e(label)} in this window</p>'
    width, height, pad = 720, 220, 30
    bar_w = (width - 2 * pad) / len(buckets)
    top = max(b.count for b in buckets) or 1
    parts = [
        f'<svg class="chart" data-testid="{e(testid)}" viewBox="0 0 {width} {height + 40}" '
        f'role="img" aria-label="{e(label)}">'
    ]
    for i, b in enumerate(buckets):
        h = (height - pad) * b.count / top
        x = pad + i * bar_w
        y = height - h
        title = f"{b.count} between {fmt_ms(b.lower_ms)} and {fmt_ms(b.upper_ms)}"
        bar = (
            f'<rect class="bar" x="{x + 2:.1f}" y="{y:.1f}" width="{bar_w - 4:.1f}" '
            f'height="{h:.1f}"><title>{e(title)}</title></rect>'
            f'<text class="count" x="{x + bar_w / 2:.1f}" y="{y - 4:.1f}">{b.count}</text>'
        )
        attrs = (
            f'data-bucket="{i}" data-count="{b.count}" data-lower-ms="{b.lower_ms:g}" '
            f'data-upper-ms="{b.upper_ms:g}"'
        )
        if b.href is not None and b.count:
            parts.append(f'<a href="{b.href}" {attrs}>{bar}</a>')
        else:
            parts.append(f"<g {attrs}>{bar}</g>")
        parts.append(
            f'<text class="axis" x="{x:.1f}" y="{height + 16}">{e(fmt_ms(b.lower_ms))}</text>'
        )
    parts.append(
        f'<text class="axis end" x="{width - pad:.1f}" y="{height + 16}">'
        f"{e(fmt_ms(buckets[-1].upper_ms))}</text>"
    )
    parts.append(
        f'<line class="axis" x1="{pad}" y1="{height}" x2="{width - pad}" y2="{height}"/></svg>'
    )
    return "".join(parts)


def fraction_chart(points: Sequence[tuple[str, float, int]], testid: str) -> str:
    """(label, fraction 0..1, n) per time bin as a line with a dot per bin."""
    if not points:
        return f'<p class="empty" data-testid="{e(testid)}">no verifications in this window</p>'
    width, height, pad = 720, 200, 36
    step = (width - 2 * pad) / max(1, len(points) - 1)
    coords = [
        (pad + i * step, pad + (height - 2 * pad) * (1 - frac))
        for i, (_, frac, _) in enumerate(points)
    ]
    parts = [
        f'<svg class="chart" data-testid="{e(testid)}" viewBox="0 0 {width} {height + 24}" '
        'role="img" aria-label="verify success fraction over time">'
    ]
    for frac in (0.0, 0.5, 1.0):
        y = pad + (height - 2 * pad) * (1 - frac)
        parts.append(
            f'<line class="grid" x1="{pad}" y1="{y:.1f}" x2="{width - pad}" y2="{y:.1f}"/>'
            f'<text class="axis" x="2" y="{y + 4:.1f}">{frac:.0%}</text>'
        )
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
    parts.append(f'<polyline class="line" points="{line}"/>')
    for (label, frac, n), (x, y) in zip(points, coords, strict=True):
        parts.append(
            f'<circle class="dot" cx="{x:.1f}" cy="{y:.1f}" r="4" data-fraction="{frac:.4f}" '
            f'data-n="{n}"><title>{e(label)}: {frac:.1%} of {n}</title></circle>'
        )
    parts.append(
        f'<text class="axis" x="{pad}" y="{height + 18}">{e(points[0][0])}</text>'
        f'<text class="axis end" x="{width - pad}" y="{height + 18}">{e(points[-1][0])}</text>'
        "</svg>"
    )
    return "".join(parts)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    calls: int
    errors: int

    @property
    def error_fraction(self) -> float:
        return self.errors / self.calls if self.calls else 0.0


def service_map(nodes: dict[str, tuple[int, int]], edges: Sequence[Edge]) -> str:
    """Services (name -> (spans, errors)) in columns by call depth, arrows for calls."""
    if not nodes:
        return '<p class="empty" data-testid="service-map">no traces in this window</p>'
    incoming: dict[str, set[str]] = {n: set() for n in nodes}
    for edge in edges:
        incoming.setdefault(edge.target, set()).add(edge.source)
    depth: dict[str, int] = {}
    for _ in range(len(incoming) + 1):  # longest path from a root, cycles cut
        for node in sorted(incoming):
            sources = [depth.get(s, 0) for s in incoming[node] if s != node]
            depth[node] = min(len(incoming), 1 + max(sources)) if sources else 0
    columns: dict[int, list[str]] = {}
    for node in sorted(incoming):
        columns.setdefault(depth[node], []).append(node)
    box_w, box_h, gap_x, gap_y = 340, 54, 250, 36
    rows = max(len(c) for c in columns.values())
    width = len(columns) * (box_w + gap_x) + 20
    height = rows * (box_h + gap_y) + 20
    pos: dict[str, tuple[float, float]] = {}
    for col, names in sorted(columns.items()):
        for row, name in enumerate(names):
            pos[name] = (10 + col * (box_w + gap_x), 10 + row * (box_h + gap_y))
    parts = [
        f'<svg class="map" data-testid="service-map" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="service map"><defs><marker id="arrow" viewBox="0 0 10 10" refX="10" '
        'refY="5" markerWidth="8" markerHeight="8" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" class="arrowhead"/></marker></defs>'
    ]
    for edge in edges:
        (x1, y1), (x2, y2) = pos[edge.source], pos[edge.target]
        sx, sy, tx, ty = x1 + box_w, y1 + box_h / 2, x2, y2 + box_h / 2
        if edge.source == edge.target or tx <= sx:
            sx, tx = x1 + box_w / 2, x2 + box_w / 2
            sy, ty = y1 + box_h, y2
        cls = "edge error" if edge.errors else "edge"
        label = f"{edge.calls} calls, {edge.error_fraction:.0%} errors"
        # near the callee: edges leaving one caller fan out there, so labels do not meet
        lx, ly = sx + (tx - sx) * 0.68, sy + (ty - sy) * 0.68 - 6
        parts.append(
            f'<g class="{cls}"><line x1="{sx:.0f}" y1="{sy:.0f}" x2="{tx:.0f}" y2="{ty:.0f}" '
            f'marker-end="url(#arrow)"/><text x="{lx:.0f}" y="{ly:.0f}">{e(label)}</text></g>'
        )
    for name, (x, y) in pos.items():
        spans, errors = nodes.get(name, (0, 0))
        cls = "node error" if errors else "node"
        short = name if len(name) <= 40 else name[:39] + "…"
        parts.append(
            f'<g class="{cls}"><rect x="{x:.0f}" y="{y:.0f}" width="{box_w}" height="{box_h}" '
            f'rx="6"/><text x="{x + 10:.0f}" y="{y + 22:.0f}">{e(short)}</text>'
            f'<text class="small" x="{x + 10:.0f}" y="{y + 42:.0f}">{spans} spans, {errors} errors'
            f"</text><title>{e(name)}</title></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


@dataclass(frozen=True)
class SeriesPoint:
    """One time bin of a series chart."""

    label: str
    """The bin's start (``HH:MM:SS`` UTC)."""
    value: float | None
    """None: nothing in this bin (a gap in a line)."""
    n: int
    """How many rollouts the value is of."""


def series_chart(
    points: Sequence[SeriesPoint],
    testid: str,
    label: str,
    unit: str,
    *,
    bars: bool = False,
    empty: str = "no rollouts in this window",
) -> str:
    """A value per time bin: bars (``bars``, counts from 0) or a line with a dot per bin
    (its axis from the smallest value, or 0, to the largest). Every bin carries its value
    and ``n`` as ``data-*`` attributes and a tooltip."""
    shown = [p for p in points if p.value is not None]
    if not shown:
        return f'<p class="empty" data-testid="{e(testid)}">{e(empty)}</p>'
    width, height, pad = 720, 200, 44
    values = [p.value for p in shown if p.value is not None]
    low = 0.0 if bars else min(0.0, *values)
    high = max(*values, low + 1e-9)
    span = high - low or 1.0

    def y(v: float) -> float:
        return pad + (height - 2 * pad) * (1 - (v - low) / span)

    step = (width - 2 * pad) / max(1, len(points))
    parts = [
        f'<svg class="chart series" data-testid="{e(testid)}" '
        f'viewBox="0 0 {width} {height + 24}" role="img" aria-label="{e(label)}">'
    ]
    for v in sorted({low, (low + high) / 2, high}):
        parts.append(
            f'<line class="grid" x1="{pad}" y1="{y(v):.1f}" x2="{width - pad}" y2="{y(v):.1f}"/>'
            f'<text class="axis" x="2" y="{y(v) + 4:.1f}">{e(_short(v))}</text>'
        )
    coords: list[str] = []
    marks: list[str] = []
    for i, p in enumerate(points):
        if p.value is None:
            continue
        x = pad + step * (i + 0.5)
        attrs = f'data-bin="{i}" data-n="{p.n}" data-value="{p.value:.6g}"'
        title = f"{p.label}: {_short(p.value)} {unit} ({p.n} rollouts)"
        if bars:
            top = y(p.value)
            marks.append(
                f'<rect class="bar" x="{x - step * 0.4:.1f}" y="{top:.1f}" '
                f'width="{step * 0.8:.1f}" height="{y(low) - top:.1f}" {attrs}>'
                f"<title>{e(title)}</title></rect>"
            )
        else:
            coords.append(f"{x:.1f},{y(p.value):.1f}")
            marks.append(
                f'<circle class="dot" cx="{x:.1f}" cy="{y(p.value):.1f}" r="4" {attrs}>'
                f"<title>{e(title)}</title></circle>"
            )
    if coords:
        parts.append(f'<polyline class="line" points="{" ".join(coords)}"/>')
    parts += marks
    parts.append(
        f'<text class="axis" x="{pad}" y="{height + 18}">{e(points[0].label)}</text>'
        f'<text class="axis end" x="{width - pad}" y="{height + 18}">{e(points[-1].label)}</text>'
        f'<text class="axis end" x="{width - pad}" y="14">{e(unit)}</text></svg>'
    )
    return "".join(parts)


def _short(value: float) -> str:
    """A chart label: ``0.75``, ``12``, ``3.4k``, ``1.2M``."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.3g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}"
