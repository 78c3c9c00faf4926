"""The round-3 targets table (issue 26), read from the result files of one ``make bench-round3``.

    uv run --frozen python -m bench.round3_summary [--dir docs/benchmarks] [--md FILE]

Reads what the round-3 steps wrote (``bench/__main__.py``, ``--round3``) and prints, per
target, the measured figure, the load average of the run that produced it and a verdict
(``met`` / ``missed`` / ``not run``). It computes nothing the steps did not measure and
asserts nothing: a verdict is a comparison printed for the reader, never a test.

Files (each optional; a missing one prints ``not run``):

- ``round3.json`` (``bench.sidecar_vs_rotel --name round3``): per path and load, the
  sidecar's spans per CPU-second over rotel's and over the same-job Collector's (median
  of the per-round ratios), peak RSS of every collector, bytes per span on the wire;
- ``sidecar_memory.json`` (``bench.sidecar_memory --json``): peak RSS of the default
  configuration at 10k spans/s;
- ``gym_verify_callgrind.json`` and ``gym_rollout_callgrind.json``: the agent's
  instructions per ``/verify`` and per whole rollout, bare and instrumented, and process
  CPU pinned and interleaved;
- ``soak.json`` (``bench.soak``): RSS at minute 5 and at the end, spans delivered.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

LOADS = ("rollouts", "rollouts:default", "derive-heavy")
PATHS = ("grpc/gzip", "http/gzip", "grpc/none")
GOAL_RATIO = 1.5
GOAL_PEAK_MIB = 50.0
GOAL_VERIFY = 1.05
GOAL_ROLLOUT = 1.10
GOAL_SOAK_GROWTH = 0.05


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return doc if isinstance(doc, dict) else None


def _load(values: Iterable[float] | None) -> str:
    first = next(iter(values), None) if values else None
    return "?" if first is None else f"{first:.1f}"


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class Rows:
    """Target rows: (target, goal, measured, load average, verdict)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str]] = []

    def add(self, target: str, goal: str, measured: str, load: str, verdict: str) -> None:
        self.rows.append((target, goal, measured, load, verdict))

    def text(self) -> str:
        head = ("target", "goal", "measured", "load avg", "verdict")
        widths = [max(len(r[i]) for r in [head, *self.rows]) for i in range(5)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
        lines.append("  ".join("-" * w for w in widths))
        for r in self.rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
        return "\n".join(lines)

    def markdown(self) -> str:
        out = ["| target | goal | measured | load average | verdict |", "| --- " * 5 + "|"]
        out += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(out)


def throughput(rows: Rows, doc: dict[str, Any] | None) -> None:
    if doc is None:
        rows.add("sidecar ÷ peers, spans per CPU-second", "≥ 1.5x", "-", "-", "not run")
        return
    load = (
        f"{_load(doc['machine_start']['loadavg_1_5_15'])} → "
        f"{_load(doc['machine_end']['loadavg_1_5_15'])}"
    )
    ratios = {
        (r["path"], r["vs"].partition(":")[0], r["load"]): r["spans_per_cpu_s_ratio"]
        for r in doc["ratios"]
        if r["path"].startswith("sidecar:") and not r.get("pinned")
    }
    for peer, label in (("rotel", "rotel"), ("otelcol", "same-job Collector")):
        for load_name in LOADS:
            for path in PATHS:
                r = ratios.get((f"sidecar:{path}", peer, load_name))
                if r is None:
                    continue
                rows.add(
                    f"sidecar ÷ {label}, {load_name}, {path}",
                    f"≥ {GOAL_RATIO}x",
                    f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}, "
                    f"{doc['config']['rounds']} rounds)",
                    load,
                    _verdict(r["median"] >= GOAL_RATIO),
                )
    # per (export path, load): the sidecar's peak against each peer's on the same work
    peaks: dict[tuple[str, str], dict[str, float]] = {}
    for t in doc["throughput"]:
        collector, _, export = t["path"].partition(":")
        if collector in ("sidecar", "rotel", "otelcol") and not t.get("pinned"):
            peaks.setdefault((export, t["load"]), {})[collector] = t["peak_rss_mib"]["max"]
    cells = [p for p in peaks.values() if len(p) == 3]
    if cells:

        def span(name: str) -> str:
            values = [c[name] for c in cells]
            return f"{min(values):.0f}-{max(values):.0f}"

        below = sum(c["sidecar"] < min(c["rotel"], c["otelcol"]) for c in cells)
        rows.add(
            "peak RSS at full load below both peers",
            "below rotel and the Collector on every path and load",
            f"sidecar {span('sidecar')} MiB, rotel {span('rotel')}, Collector "
            f"{span('otelcol')} (highest round each); below both on {below} of {len(cells)}",
            load,
            _verdict(below == len(cells)),
        )
    for c in doc.get("derive_costs") or []:
        if c.get("pinned"):
            continue
        s = c["us_per_derived_span"]
        rows.add(
            f"derive step, {c['path']}, {c['load']} (profile, no goal)",
            "-",
            f"{s['median']:.2f} µs CPU per derived span ({s['min']:.2f}-{s['max']:.2f})",
            load,
            "-",
        )


def memory(rows: Rows, doc: dict[str, Any] | None) -> None:
    if doc is None:
        rows.add("peak RSS, default config, 10k spans/s", "≤ 50 MiB", "-", "-", "not run")
        return
    fig = doc["variants"]["default"]
    peak = fig["peak"]
    rows.add(
        f"peak RSS, default config, {doc['args']['rate']:.0f} spans/s ({doc['args']['load']})",
        f"≤ {GOAL_PEAK_MIB:.0f} MiB",
        f"peak {_med(peak):.1f} MiB ({min(peak):.1f}-{max(peak):.1f}, {len(peak)} rounds); "
        f"idle {_med(fig['idle']):.1f}, end {_med(fig['end']):.1f}",
        f"{_load(doc['load_start'])} → {_load(doc['load_end'])}",
        _verdict(_med(peak) <= GOAL_PEAK_MIB),
    )


def agent_verify(rows: Rows, doc: dict[str, Any] | None, cpu_doc: dict[str, Any] | None) -> None:
    if doc is None:
        rows.add("agent /verify, default groups", "≤ 1.05x bare", "-", "-", "not run")
        return
    load = f"{_load(doc.get('load_start'))} → {_load(doc.get('load_end'))}"
    cg = {r["variant"]: r for r in doc.get("callgrind") or []}
    cpu = doc.get("cpu") or (cpu_doc or {}).get("cpu") or {}
    if not doc.get("cpu") and cpu_doc:
        load += f" (CPU: {_load(cpu_doc.get('load_start'))} → {_load(cpu_doc.get('load_end'))})"
    for variant in ("default", "all"):
        if "bare" not in cg or variant not in cg:
            continue
        ratio = cg[variant]["instructions_per_request"] / cg["bare"]["instructions_per_request"]
        text = (
            f"instructions x{ratio:.3f} ({cg['bare']['instructions_per_request'] / 1e6:.3f}M → "
            f"{cg[variant]['instructions_per_request'] / 1e6:.3f}M per request)"
        )
        ok = ratio <= GOAL_VERIFY
        if variant in cpu and "bare" in cpu:
            cpu_ratios = [
                r["process_cpu_us"] / b["process_cpu_us"]
                for r, b in zip(cpu[variant], cpu["bare"], strict=True)
            ]
            text += (
                f"; process CPU x{_med(cpu_ratios):.3f} ({min(cpu_ratios):.3f}-"
                f"{max(cpu_ratios):.3f}, {len(cpu_ratios)} pinned interleaved rounds)"
            )
            ok = ok and _med(cpu_ratios) <= GOAL_VERIFY
        goal = f"≤ {GOAL_VERIFY}x bare" if variant == "default" else "(no goal: `all`)"
        rows.add(
            f"agent, Gym /verify, {variant} groups",
            goal,
            text,
            load,
            _verdict(ok) if variant == "default" else "-",
        )


def agent_rollout(rows: Rows, doc: dict[str, Any] | None, cpu_doc: dict[str, Any] | None) -> None:
    if doc is None:
        rows.add("agent, whole rollout, `all`", "≤ 1.10x bare", "-", "-", "not run")
        return
    load = f"{_load(doc.get('load_start'))} → {_load(doc.get('load_end'))}"
    cg = {r["variant"]: r for r in doc.get("callgrind") or []}
    cpu = doc.get("cpu") or (cpu_doc or {}).get("cpu") or {}
    if not doc.get("cpu") and cpu_doc:
        load += f" (CPU: {_load(cpu_doc.get('load_start'))} → {_load(cpu_doc.get('load_end'))})"

    def total(r: dict[str, Any]) -> float:
        return float(sum(s["instructions"] for s in r["servers"].values()))

    for variant in ("default", "all"):
        parts: list[str] = []
        ok = True
        if "bare" in cg and variant in cg:
            ratio = total(cg[variant]) / total(cg["bare"])
            parts.append(
                f"instructions x{ratio:.3f} ({total(cg['bare']) / 1e6:.2f}M → "
                f"{total(cg[variant]) / 1e6:.2f}M per rollout, three servers)"
            )
            ok = ratio <= GOAL_ROLLOUT
        if variant in cpu and "bare" in cpu:
            ratios = [v / b for v, b in zip(cpu[variant], cpu["bare"], strict=True)]
            parts.append(
                f"process CPU x{_med(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}, "
                f"{len(ratios)} pinned interleaved rounds)"
            )
            ok = ok and _med(ratios) <= GOAL_ROLLOUT
        if not parts:
            continue
        rows.add(
            f"agent, whole rollout, {variant} groups",
            f"≤ {GOAL_ROLLOUT}x bare" if variant == "all" else "(no goal: default)",
            "; ".join(parts),
            load,
            _verdict(ok) if variant == "all" else "-",
        )


def soak(rows: Rows, doc: dict[str, Any] | None) -> None:
    if doc is None:
        rows.add("soak, 30 min at 10k spans/s", "RSS growth ≤ 5 %", "-", "-", "not run")
        return
    args = doc["args"]
    growth = doc["rss_growth"]
    lost = doc["missing"]
    rows.add(
        f"soak, {args['minutes']:.0f} min at {args['rate']:.0f} spans/s, backend stopped "
        f"{args['outage_s']:.0f} s every {args['outage_every_s'] / 60:.0f} min",
        "RSS growth minute 5 → end ≤ 5 %; every span answered OK delivered",
        f"RSS {doc['rss_minute_5_mib']:.1f} → {doc['rss_end_mib']:.1f} MiB "
        f"({100 * growth:+.1f} %); delivered {doc['delivered']:,} of "
        f"{doc['expected_forwarded']:,} forwardable, missing {lost}, extra "
        f"{doc['duplicates_or_extra']}",
        f"{_load(doc['load_average_start'])} → {_load(doc['load_average_end'])}",
        _verdict(growth <= GOAL_SOAK_GROWTH and lost == 0 and doc["duplicates_or_extra"] == 0),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=Path("docs/benchmarks"))
    p.add_argument("--md", type=Path, help="also write the table as Markdown")
    args = p.parse_args(argv)
    rows = Rows()
    throughput(rows, _read(args.dir / "round3.json"))
    memory(rows, _read(args.dir / "sidecar_memory.json"))
    # CPU passes run apart from the callgrind ones are read from *_cpu.json
    agent_verify(
        rows, _read(args.dir / "gym_verify_callgrind.json"), _read(args.dir / "gym_verify_cpu.json")
    )
    agent_rollout(
        rows,
        _read(args.dir / "gym_rollout_callgrind.json"),
        _read(args.dir / "gym_rollout_cpu.json"),
    )
    soak(rows, _read(args.dir / "soak.json"))
    print(f"round 3 targets (issue 26), from {args.dir}/:\n")
    print(rows.text())
    if args.md:
        args.md.write_text(rows.markdown() + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
