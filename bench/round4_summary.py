"""The round-4 targets table (issue 42), read from the result files of one ``make bench-round4``.

    uv run --frozen python -m bench.round4_summary [--dir docs/benchmarks]

Reads what the round-4 steps wrote (``bench/round4.py``) and prints, per target, the
measured figure, the load average of the runs behind it and a verdict (``met`` /
``MISSED`` / ``not run``); writes the same as ``round4_targets.md`` and, with every
number, ``round4_summary.json``. It computes nothing the steps did not measure and
asserts nothing: a verdict is a comparison printed for the reader, never a test.

- ``round4.json`` (``bench.sidecar_vs_rotel --name round4``): per load (whole rollouts,
  ``derive-heavy``) and path (gRPC/none, gRPC/gzip, HTTP/gzip) the sidecar's spans per
  collector CPU-second over rotel's and over the same-job Collector's, median of the
  per-round ratios with their range (target: 1.5x each); the bytes per span on the wire
  of both sides (measured); the same at gzip level 5 (``sidecar@5``, the peers' bytes)
  and level 6 (``sidecar@6``, the peers' level), no target; the load average at each run's start
  and over the whole run;
- ``round4_memory_<load>.json`` (``bench.sidecar_memory``): the default configuration's
  peak RSS under load at 10k spans/s (target: 50 MiB), idle and end;
- ``gym_verify_callgrind.json``, ``gym_rollout_callgrind.json`` (and ``*_cpu.json``): the
  agent's instructions against bare with the default groups (target: 1.05x per
  ``/verify`` and per ``/run``; the live events' clock factor the runs used is shown),
  the request thread's share, and the pinned process CPU beside them (its target, no
  worse than round 3's on the request thread, needs the round-3 tree in the same run:
  docs/benchmarks.md); the whole rollout with ``all`` against round 3's 1.10x;
- ``round4_callgrind_<load>_<compression>.json`` (``bench.sidecar_callgrind``):
  instructions per span of the whole sidecar, by shared object (no target: the
  profile behind the ratios).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.round3_summary import GOAL_ROLLOUT, Rows, _load, _med, _read

LOADS = {"rollouts": "whole rollouts", "derive-heavy": "derive-heavy"}
EXPORTS = ("grpc/none", "grpc/gzip", "http/gzip")
PEERS = {"rotel": "rotel", "otelcol": "same-job Collector"}
GOAL_RATIO = 1.5
GOAL_PEAK_MIB = 50.0
EQUAL_LEVEL = 6
EQUAL_BYTES_LEVEL = 5


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _span(stats: dict[str, float] | None, fmt: str = "{:.1f}") -> str:
    if not stats:
        return "?"
    lo, hi = fmt.format(stats["min"]), fmt.format(stats["max"])
    return lo if lo == hi else f"{lo}-{hi}"


class Summary:
    """The table's rows as text (``Rows``) and as numbers (``records``)."""

    def __init__(self) -> None:
        self.rows = Rows()
        self.records: list[dict[str, Any]] = []

    def add(self, record: dict[str, Any], measured: str, load: str) -> None:
        self.records.append(record)
        self.rows.add(record["target"], record["goal"], measured, load, record["verdict"])


def throughput(out: Summary, doc: dict[str, Any] | None) -> None:
    if doc is None:
        out.add(
            {
                "target": "sidecar ÷ peers, spans per CPU-second",
                "goal": "≥ 1.5x",
                "verdict": "not run",
            },
            "-",
            "-",
        )
        return
    whole = (
        f"{doc['machine_start']['loadavg_1_5_15'][0]:.1f} → "
        f"{doc['machine_end']['loadavg_1_5_15'][0]:.1f}"
    )
    rows = {(t["path"], t["load"]): t for t in doc["throughput"] if not t.get("pinned")}
    ratios = {
        (r["path"], r["vs"], r["load"]): r["spans_per_cpu_s_ratio"]
        for r in doc["ratios"]
        if not r.get("pinned")
    }
    rounds = doc["config"]["rounds"]
    variants: tuple[tuple[str, float | None, str], ...] = (
        ("sidecar", GOAL_RATIO, ""),
        (f"sidecar@{EQUAL_BYTES_LEVEL}", None, "equal bytes"),
        (f"sidecar@{EQUAL_LEVEL}", None, "equal level"),
    )
    for sidecar, goal, equal in variants:
        for peer, label in PEERS.items():
            for load, load_label in LOADS.items():
                for export in EXPORTS:
                    path, vs = f"{sidecar}:{export}", f"{peer}:{export}"
                    r = ratios.get((path, vs, load))
                    if r is None:
                        continue
                    ours, theirs = rows.get((path, load), {}), rows.get((vs, load), {})
                    starts = [
                        x
                        for row in (ours, theirs)
                        if row.get("loadavg_at_start")
                        for x in (row["loadavg_at_start"]["min"], row["loadavg_at_start"]["max"])
                    ]
                    load_text = (
                        f"runs {min(starts):.1f}-{max(starts):.1f}; whole run {whole}"
                        if starts
                        else whole
                    )
                    bytes_text = (
                        f"out {_span(ours.get('out_bytes_per_span'), '{:.0f}')} vs "
                        f"{_span(theirs.get('out_bytes_per_span'), '{:.0f}')} B/span"
                    )
                    at = sidecar.partition("@")[2]
                    level = f" (sidecar at gzip level {at}, {equal})" if equal else ""
                    record = {
                        "target": f"sidecar ÷ {label}, {load_label}, {export}{level}",
                        "goal": f"≥ {goal}x" if goal is not None else f"(no goal: {equal})",
                        "path": path,
                        "vs": vs,
                        "load": load,
                        "ratio": r,
                        "rounds": rounds,
                        "out_bytes_per_span": {
                            "sidecar": ours.get("out_bytes_per_span"),
                            "peer": theirs.get("out_bytes_per_span"),
                        },
                        "spans_per_cpu_s": {
                            "sidecar": ours.get("spans_per_cpu_s"),
                            "peer": theirs.get("spans_per_cpu_s"),
                        },
                        "loadavg_at_run_start": starts,
                        "loadavg_whole_run": [
                            doc["machine_start"]["loadavg_1_5_15"][0],
                            doc["machine_end"]["loadavg_1_5_15"][0],
                        ],
                        "verdict": _verdict(r["median"] >= goal) if goal is not None else "-",
                        "scanners": ours.get("scanners"),
                    }
                    # Which trace scanner the sidecar ran (recorded since round 4's second
                    # run; a result file from before has none): the pure-Python one costs
                    # about twice the CPU per span, so a ratio without it is not comparable.
                    scanners = ours.get("scanners")
                    scanner_text = f"; scanner {'+'.join(scanners)}" if scanners else ""
                    out.add(
                        record,
                        f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}, {rounds} rounds); "
                        f"{bytes_text}{scanner_text}",
                        load_text,
                    )
    for f in doc.get("fixed_rate") or []:
        if f.get("pinned"):
            continue
        record = {
            "target": f"{f['path']} at 10k spans/s ({f['load']}): RSS and CPU (profile)",
            "goal": "-",
            "path": f["path"],
            "load": f["load"],
            "peak_rss_mib": f.get("peak_rss_mib"),
            "cpu_pct": f.get("cpu_pct"),
            "verdict": "-",
        }
        peak, cpu = f.get("peak_rss_mib") or {}, f.get("cpu_pct") or {}
        out.add(
            record,
            f"peak RSS {peak.get('median', float('nan')):.1f} MiB ({_span(peak)}), "
            f"CPU {cpu.get('median', float('nan')):.1f} % of a core",
            f"runs {_span(f.get('loadavg_at_start'))}",
        )


def memory(out: Summary, directory: Path) -> None:
    found = False
    for path in sorted(directory.glob("round4_memory_*.json")):
        doc = _read(path)
        if doc is None:
            continue
        found = True
        fig = doc["variants"]["default"]
        peak = fig["peak"]
        med = statistics.median(peak) if peak else float("nan")
        load = f"{doc['load_start'][0]:.1f} → {doc['load_end'][0]:.1f}"
        record = {
            "target": f"peak RSS under load, default config, {doc['args']['rate']:.0f} "
            f"spans/s ({doc['args']['load']})",
            "goal": f"≤ {GOAL_PEAK_MIB:.0f} MiB",
            "peak_mib": peak,
            "idle_mib": fig["idle"],
            "end_mib": fig["end"],
            "cpu_pct": fig["cpu"],
            "loadavg": [doc["load_start"][0], doc["load_end"][0]],
            "verdict": _verdict(med <= GOAL_PEAK_MIB),
        }
        out.add(
            record,
            f"peak {med:.1f} MiB ({min(peak):.1f}-{max(peak):.1f}, {len(peak)} rounds); "
            f"idle {statistics.median(fig['idle']):.1f}, end {statistics.median(fig['end']):.1f}; "
            f"CPU {statistics.median(fig['cpu']):.1f} % of a core",
            load,
        )
    if not found:
        out.add(
            {
                "target": "peak RSS, default config, 10k spans/s",
                "goal": "≤ 50 MiB",
                "verdict": "not run",
            },
            "-",
            "-",
        )


def callgrind(out: Summary, directory: Path) -> None:
    for path in sorted(directory.glob("round4_callgrind_*.json")):
        doc = _read(path)
        if doc is None:
            continue
        objects = doc.get("objects_per_span") or {}
        top = sorted(objects.items(), key=lambda kv: -kv[1])[:4]
        record = {
            "target": f"sidecar instructions per span, {doc['load']}, gRPC in, export "
            f"{doc['compression']} (profile, no goal)",
            "goal": "-",
            "load": doc["load"],
            "compression": doc["compression"],
            "per_span": doc["per_span"],
            "objects_per_span": objects,
            "memcpy_per_span": doc.get("memcpy_per_span"),
            "verdict": "-",
        }
        shown = ", ".join(f"{name.split('.')[0]} {v:,.0f}" for name, v in top)
        out.add(record, f"{doc['per_span']:,.0f} ({shown})", f"{doc.get('loadavg', 0):.1f}")


GOAL_AGENT = 1.05
"""Issue 42: the agent's instructions per ``/verify`` and per ``/run``, default groups."""


def _clock(doc: dict[str, Any]) -> str:
    factor = float((doc.get("args") or {}).get("live_clock_x", 1.0))  # a str in some files
    return "as shipped" if factor == 1 else f"live-event clock x{factor:g} under callgrind"


def _cpu_text(cpu: dict[str, Any], variant: str, per_run: Any) -> str:
    """``; process CPU`` and the median (range) of ``variant``'s per-round ratios to bare
    (``per_run`` reads a run's process CPU), or "" without both."""
    if variant not in cpu or "bare" not in cpu:
        return ""
    ratios = [per_run(r) / per_run(b) for r, b in zip(cpu[variant], cpu["bare"], strict=True)]
    return (
        f"; process CPU x{_med(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}, "
        f"{len(ratios)} pinned interleaved rounds)"
    )


def agent_verify(rows: Rows, doc: dict[str, Any] | None, cpu_doc: dict[str, Any] | None) -> None:
    if doc is None:
        rows.add("agent, Gym /verify, default groups", f"≤ {GOAL_AGENT}x bare", "-", "-", "not run")
        return
    load = f"{_load(doc.get('load_start'))} → {_load(doc.get('load_end'))}"
    cg = {r["variant"]: r for r in doc.get("callgrind") or []}
    cpu = doc.get("cpu") or (cpu_doc or {}).get("cpu") or {}
    for variant in ("default", "all"):
        if "bare" not in cg or variant not in cg:
            continue
        bare, run = cg["bare"], cg[variant]
        ratio = run["instructions_per_request"] / bare["instructions_per_request"]
        thread = run["main_thread_per_request"] / bare["main_thread_per_request"]
        text = (
            f"instructions x{ratio:.3f} ({bare['instructions_per_request'] / 1e6:.3f}M → "
            f"{run['instructions_per_request'] / 1e6:.3f}M per request; request thread "
            f"x{thread:.3f}; {_clock(doc)}, {run.get('live_requests', 0)} heartbeats in the "
            f"window){_cpu_text(cpu, variant, lambda run: run['process_cpu_us'])}"
        )
        default = variant == "default"
        rows.add(
            f"agent, Gym /verify, {variant} groups",
            f"≤ {GOAL_AGENT}x bare instructions" if default else "(no goal: `all`)",
            text,
            load,
            _verdict(ratio <= GOAL_AGENT) if default else "-",
        )


def agent_rollout(rows: Rows, doc: dict[str, Any] | None, cpu_doc: dict[str, Any] | None) -> None:
    if doc is None:
        rows.add(
            "agent, whole rollout, default groups", f"≤ {GOAL_AGENT}x bare", "-", "-", "not run"
        )
        return
    load = f"{_load(doc.get('load_start'))} → {_load(doc.get('load_end'))}"
    cg = {r["variant"]: r for r in doc.get("callgrind") or []}
    cpu = doc.get("cpu") or (cpu_doc or {}).get("cpu") or {}

    def total(r: dict[str, Any]) -> float:
        return float(sum(s["instructions"] for s in r["servers"].values()))

    goals = {"default": GOAL_AGENT, "all": GOAL_ROLLOUT}
    for variant, goal in goals.items():
        if "bare" not in cg or variant not in cg:
            continue
        ratio = total(cg[variant]) / total(cg["bare"])
        text = (
            f"instructions x{ratio:.3f} ({total(cg['bare']) / 1e6:.2f}M → "
            f"{total(cg[variant]) / 1e6:.2f}M per rollout, three servers; {_clock(doc)})"
            f"{_cpu_text(cpu, variant, float)}"
        )
        rows.add(
            f"agent, whole rollout (/run), {variant} groups",
            f"≤ {goal}x bare instructions",
            text,
            load,
            _verdict(ratio <= goal),
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=Path("docs/benchmarks"))
    args = p.parse_args(argv)
    out = Summary()
    throughput(out, _read(args.dir / "round4.json"))
    memory(out, args.dir)
    agent = Rows()
    agent_verify(
        agent,
        _read(args.dir / "gym_verify_callgrind.json"),
        _read(args.dir / "gym_verify_cpu.json"),
    )
    agent_rollout(
        agent,
        _read(args.dir / "gym_rollout_callgrind.json"),
        _read(args.dir / "gym_rollout_cpu.json"),
    )
    for target, goal, measured, load, verdict in agent.rows:
        out.add(
            {"target": target, "goal": goal, "measured": measured, "verdict": verdict},
            measured,
            load,
        )
    callgrind(out, args.dir)
    print(f"round 4 targets (issue 42), from {args.dir}/:\n")
    print(out.rows.text())
    (args.dir / "round4_targets.md").write_text(out.rows.markdown() + "\n", encoding="utf-8")
    (args.dir / "round4_summary.json").write_text(
        json.dumps({"rows": out.records}, indent=1) + "\n", encoding="utf-8"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
