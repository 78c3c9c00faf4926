"""Summaries of repeated runs: medians and ranges, the rich table, the JSON and the chart."""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.sidecar_vs_rotel.runs import RunResult

FIGURES = (
    "spans_per_s",
    "cpu_s",
    "spans_per_cpu_s",
    "cpu_pct",
    "peak_rss_mib",
    "rss_end_mib",
    "out_bytes_per_span",
)


def machine() -> dict[str, Any]:
    """CPU count, load averages and versions at the time of the call."""
    with open("/proc/loadavg", encoding="ascii") as f:
        load = [float(x) for x in f.read().split()[:3]]
    return {
        "cpus": os.cpu_count(),
        "loadavg_1_5_15": load,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _stats(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _key(r: RunResult) -> tuple[str, str, str, bool]:
    return (r.path, r.protocol, r.load, r.pinned)


def _order(path: str) -> tuple[str, int]:
    collector, _, export = path.partition(":")
    rank = (
        "direct",
        "sidecar",
        "sidecar-h2",
        "sidecar-grpcio",
        "sidecar-noderive",
        "rotel",
        "otelcol",
        "otelcol-noderive",
        "jaeger",
    )
    return (export, rank.index(collector) if collector in rank else 9)


def summarise(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Per (path, protocol, load, pinned): the runs and median/min/max of every figure."""
    groups: dict[tuple[str, str, str, bool], list[RunResult]] = {}
    for r in results:
        groups.setdefault(_key(r), []).append(r)
    out = []
    for (path, protocol, load, pinned), runs in sorted(
        groups.items(), key=lambda kv: (kv[0][3], kv[0][2], kv[0][1], _order(kv[0][0]))
    ):
        row: dict[str, Any] = {
            "path": path,
            "protocol": protocol,
            "load": load,
            "pinned": pinned,
            "runs": len(runs),
        }
        for fig in FIGURES:
            row[fig] = _stats([v for r in runs if (v := getattr(r, fig)) is not None])
        row["loadavg_at_start"] = _stats([r.extra.get("loadavg_at_start", 0.0) for r in runs])
        row["lost_spans"] = sum(max(0, r.spans_sent - r.spans_delivered) for r in runs)
        row["retries"] = sum(r.retries for r in runs)
        # The sidecar's trace scanner in its runs (none for the peers).
        row["scanners"] = sorted({s for r in runs if (s := r.extra.get("scanner"))})
        out.append(row)
    return out


PEERS = ("rotel", "otelcol", "jaeger")


def ratios(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Each sidecar path's spans per CPU-second over each peer's at the same export.

    Per round, the sidecar run's figure over the peer run's of the same round (same
    load, generator protocol and pinning); median, min and max over the rounds.
    """
    by: dict[tuple[str, str, str, bool, int], float] = {}
    for r in results:
        if r.spans_per_cpu_s:
            by[(*_key(r), r.repeat)] = r.spans_per_cpu_s
    pairs: dict[tuple[str, str, str, str, bool], list[float]] = {}
    for (path, protocol, load, pinned, rnd), ours in by.items():
        collector, _, export = path.partition(":")
        if not collector.startswith("sidecar") or collector.endswith("-noderive"):
            continue
        for peer in PEERS:
            theirs = by.get((f"{peer}:{export}", protocol, load, pinned, rnd))
            if theirs:
                key = (path, f"{peer}:{export}", protocol, load, pinned)
                pairs.setdefault(key, []).append(ours / theirs)
    return [
        {
            "path": path,
            "vs": peer,
            "protocol": protocol,
            "load": load,
            "pinned": pinned,
            "rounds": len(values),
            "spans_per_cpu_s_ratio": _stats(values),
        }
        for (path, peer, protocol, load, pinned), values in sorted(
            pairs.items(), key=lambda kv: (kv[0][4], kv[0][3], kv[0][2], kv[0][1], kv[0][0])
        )
    ]


DERIVING = ("sidecar", "otelcol")
"""Collectors run with and without their derive step (``<collector>-noderive``)."""


def derive_costs(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """What deriving costs each collector per derived span, from same-round pairs.

    Per round: CPU µs per received span with the derive step minus without it (the
    ``-noderive`` run of the same export, load, protocol and pinning), divided by the
    load's share of derived spans (the generator's ``spread.derived_share``); median,
    min and max over the rounds. The sidecar's is its derive stage; the Collector's is
    its ``filter`` + ``span_metrics`` pipeline (the connector and its metrics export).
    """
    by: dict[tuple[str, str, str, bool, int], RunResult] = {}
    for r in results:
        if r.cpu_s and r.spans_sent:
            by[(*_key(r), r.repeat)] = r
    found: dict[tuple[str, str, str, bool], list[float]] = {}
    for (path, protocol, load, pinned, rnd), run in by.items():
        collector, _, export = path.partition(":")
        if collector not in DERIVING:
            continue
        bare = by.get((f"{collector}-noderive:{export}", protocol, load, pinned, rnd))
        share = (run.extra.get("spread") or {}).get("derived_share")
        if bare is None or not share or bare.cpu_s is None or run.cpu_s is None:
            continue
        per_span = run.cpu_s / run.spans_sent - bare.cpu_s / bare.spans_sent
        found.setdefault((path, protocol, load, pinned), []).append(per_span / share * 1e6)
    return [
        {
            "path": path,
            "protocol": protocol,
            "load": load,
            "pinned": pinned,
            "rounds": len(values),
            "us_per_derived_span": _stats(values),
        }
        for (path, protocol, load, pinned), values in sorted(found.items())
    ]


def derive_table(rows: Sequence[dict[str, Any]]) -> Table:
    t = Table(title="CPU µs per derived span: with the derive step minus without (per round)")
    for col in ("path", "proto", "load", "pinned", "rounds", "µs per derived span"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            r["path"],
            r["protocol"],
            r["load"],
            "yes" if r["pinned"] else "no",
            str(r["rounds"]),
            _fmt(r["us_per_derived_span"], 1, 2),
        )
    return t


def ratio_table(rows: Sequence[dict[str, Any]]) -> Table:
    t = Table(
        title="sidecar spans per CPU-second ÷ peer's, same export (per-round median, min-max)"
    )
    for col in ("sidecar path", "peer", "proto", "load", "pinned", "rounds", "ratio"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            r["path"],
            r["vs"],
            r["protocol"],
            r["load"],
            "yes" if r["pinned"] else "no",
            str(r["rounds"]),
            _fmt(r["spans_per_cpu_s_ratio"], digits=2),
        )
    return t


def _fmt(stat: dict[str, float] | None, scale: float = 1.0, digits: int = 0) -> str:
    if stat is None:
        return "-"
    med, lo, hi = (stat[k] / scale for k in ("median", "min", "max"))
    return f"{med:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"


def table(title: str, summary: Sequence[dict[str, Any]], paced: bool) -> Table:
    t = Table(title=title + "  —  median (min-max)")
    for col in ("path", "proto", "load", "pin", "runs"):
        t.add_column(col)
    cols: list[tuple[str, str, float, int]]
    if paced:
        cols = [("spans/s", "spans_per_s", 1, 0), ("CPU %", "cpu_pct", 1, 1)]
        cols += [("RSS end MiB", "rss_end_mib", 1, 1), ("peak RSS MiB", "peak_rss_mib", 1, 1)]
    else:
        cols = [("k spans/s", "spans_per_s", 1e3, 1), ("CPU s", "cpu_s", 1, 2)]
        cols += [("k spans/CPU-s", "spans_per_cpu_s", 1e3, 1)]
        cols += [("peak RSS MiB", "peak_rss_mib", 1, 1), ("out B/span", "out_bytes_per_span", 1, 0)]
    for head, *_ in cols:
        t.add_column(head, justify="right")
    t.add_column("lost", justify="right")
    for row in summary:
        cells = [_fmt(row[key], scale, digits) for _, key, scale, digits in cols]
        pinned = "yes" if row["pinned"] else "no"
        head = (row["path"], row["protocol"], row["load"], pinned, str(row["runs"]))
        t.add_row(*head, *cells, str(row["lost_spans"]))
    return t


def write_json(path: Path, doc: dict[str, Any], results: dict[str, list[RunResult]]) -> None:
    doc = dict(doc)
    doc["runs"] = {k: [asdict(r) for r in v] for k, v in results.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def _bars(ax: Any, rows: Sequence[dict[str, Any]], key: str, scale: float, label: str) -> None:
    names = [
        f"{r['path']}\n{r['protocol']} {r['load']}{' pin' if r['pinned'] else ''}"
        for r in rows
        if r[key]
    ]
    stats = [r[key] for r in rows if r[key]]
    med = [s["median"] / scale for s in stats]
    err = [
        [m - s["min"] / scale for m, s in zip(med, stats, strict=True)],
        [s["max"] / scale - m for m, s in zip(med, stats, strict=True)],
    ]
    colors = [_color(n) for n in names]
    ax.bar(range(len(names)), med, yerr=err, capsize=3, color=colors)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, fontsize=6, rotation=70, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_title(label, fontsize=10)


_COLORS = {
    "sidecar": "#4c72b0",
    "rotel": "#dd8452",
    "jaeger": "#55a868",
    "otelcol": "#c44e52",
}


def _collector(path: str) -> str:
    """``sidecar`` of ``sidecar-noderive:grpc/none`` (a path's collector, variant aside)."""
    return path.partition(":")[0].partition("-")[0]


def _color(name: str) -> str:
    """One colour per collector; its variants (``-noderive``, ``-h2``, ...) a lighter one."""
    base = _COLORS.get(_collector(name), "#999999")
    if "-" not in name.partition(":")[0]:
        return base
    r, g, b = (int(base[i : i + 2], 16) for i in (1, 3, 5))
    return "#{:02x}{:02x}{:02x}".format(*((c + 255) // 2 for c in (r, g, b)))


def chart(
    path: Path, throughput: Sequence[dict[str, Any]], paced: Sequence[dict[str, Any]]
) -> None:
    """A PNG: spans/s, spans per CPU-second, and the fixed-rate CPU % and RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(14, 15))
    grid = fig.add_gridspec(3, 2, height_ratios=(1.2, 1.2, 1))
    top, middle = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, :])
    cpu, rss = fig.add_subplot(grid[2, 0]), fig.add_subplot(grid[2, 1])
    _bars(top, throughput, "spans_per_s", 1e3, "delivered k spans/s (median, min-max)")
    _bars(middle, throughput, "spans_per_cpu_s", 1e3, "k spans per collector CPU-second")
    _bars(cpu, paced, "cpu_pct", 1, "fixed rate: collector CPU % of one core")
    _bars(rss, paced, "peak_rss_mib", 1, "fixed rate: peak RSS MiB (line: 50 MiB)")
    rss.axhline(50, color="black", linestyle="--", linewidth=1)
    kinds = sorted(
        {_collector(r["path"]) for r in [*throughput, *paced]} - {"direct"},
        key=lambda k: (k != "sidecar", k),
    )
    names = {"otelcol": "the OpenTelemetry Collector", "jaeger": "Jaeger as a collector"}
    fig.suptitle(
        " vs ".join(names.get(k, k) for k in kinds) + " (bench.sidecar_vs_rotel; "
        "lighter: a variant of the same collector, e.g. -noderive: its derive step off)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _md(stat: dict[str, float] | None, scale: float = 1.0, digits: int = 0) -> str:
    if stat is None:
        return "-"
    med, lo, hi = (stat[k] / scale for k in ("median", "min", "max"))
    return f"{med:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"


def markdown(doc: dict[str, Any]) -> str:
    """The run as Markdown tables (docs/benchmarks.md quotes them)."""
    lines = [
        f"Load average at start {doc['machine_start']['loadavg_1_5_15']}, "
        f"at end {doc['machine_end']['loadavg_1_5_15']} (1, 5, 15 min).",
        "",
        "| path | load | pinned | runs | k spans/s delivered | collector CPU s "
        "| k spans per CPU-s | peak RSS MiB | out B/span | load avg at run start |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in doc["throughput"]:
        lines.append(
            f"| {r['path']} | {r['load']} | {'yes' if r['pinned'] else 'no'} | {r['runs']} "
            f"| {_md(r['spans_per_s'], 1e3, 0)} | {_md(r['cpu_s'], 1, 2)} "
            f"| {_md(r['spans_per_cpu_s'], 1e3, 0)} | {_md(r['peak_rss_mib'])} "
            f"| {_md(r['out_bytes_per_span'])} | {_md(r['loadavg_at_start'], 1, 1)} |"
        )
    if doc["fixed_rate"]:
        lines += [
            "",
            "| path (fixed rate) | runs | spans/s delivered | CPU % of one core "
            "| RSS at end MiB | peak RSS MiB |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in doc["fixed_rate"]:
            lines.append(
                f"| {r['path']} | {r['runs']} | {_md(r['spans_per_s'])} "
                f"| {_md(r['cpu_pct'], 1, 1)} | {_md(r['rss_end_mib'], 1, 1)} "
                f"| {_md(r['peak_rss_mib'], 1, 1)} |"
            )
    lines += [
        "",
        "| sidecar path | peer | load | pinned | rounds | spans per CPU-s, sidecar ÷ peer |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in doc["ratios"]:
        lines.append(
            f"| {r['path']} | {r['vs']} | {r['load']} | {'yes' if r['pinned'] else 'no'} "
            f"| {r['rounds']} "
            f"| {_md(r['spans_per_cpu_s_ratio'], 1, 2)} |"
        )
    if doc.get("derive_costs"):
        lines += [
            "",
            "| path | load | pinned | rounds | CPU µs per derived span (with - without derive) |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in doc["derive_costs"]:
            lines.append(
                f"| {r['path']} | {r['load']} | {'yes' if r['pinned'] else 'no'} "
                f"| {r['rounds']} | {_md(r['us_per_derived_span'], 1, 2)} |"
            )
    return "\n".join(lines) + "\n"
