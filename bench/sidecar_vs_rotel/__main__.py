"""gym-sidecar vs rotel vs Jaeger-as-a-collector vs the bare transport (a harness, not a test).

    uv run --frozen python -m bench.sidecar_vs_rotel                  # full run
    uv run --frozen python -m bench.sidecar_vs_rotel --quick          # 1 round, short runs
    uv run --frozen python -m bench.sidecar_vs_rotel --pin-modes off,on   # both, interleaved

Paths (``procs``) are ``collector:export/compression``: the collector (``sidecar``,
``sidecar-h2`` and ``sidecar-grpcio`` (``backend.grpc_client`` forced), ``rotel``,
``jaeger``; ``sidecar@N`` is a sidecar path gzipping at level N instead of its default,
e.g. ``sidecar@6:grpc/gzip`` at the peers' level) receives the generator's load and exports with
that protocol and compression into a counting sink (gRPC or OTLP/HTTP); ``direct`` is the
generator sending straight to the gRPC sink. Every round runs every path once, with a
fresh collector, in a shuffled order; with ``--pin-modes off,on`` every round runs each
path unpinned and pinned (collector on core 1, everything else on core 0). Throughput
runs send ``--requests`` Gym-shaped requests (``bench.loadgen``, ``--loads``) over
``--protocols``; the fixed-rate runs pace ``--rate`` spans/s for ``--rate-seconds``
through ``--rate-paths``. It prints medians and ranges, each sidecar path's spans per
CPU-second over each peer's at the same export protocol and compression, the load
average at start and end, and writes ``<out>/sidecar_vs_rotel.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from gym_telemetry_demo.stopsignals import run_main
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.loadgen import LOADS
from bench.sidecar_vs_rotel import report
from bench.sidecar_vs_rotel.procs import (
    Collector,
    Direct,
    Jaeger,
    OtelCol,
    Rotel,
    Sidecar,
    jaeger_binary,
    otelcol_binary,
    pin,
)
from bench.sidecar_vs_rotel.relay import ByteCountingRelay
from bench.sidecar_vs_rotel.runs import LoadSpec, RunResult, run
from testkit.http_sink import HttpSink
from testkit.rotel import ROTEL_VERSION
from testkit.sink import RecordingSink

COLLECTORS = (
    "sidecar",
    "sidecar-h2",
    "sidecar-grpcio",
    "sidecar-noderive",
    "rotel",
    "jaeger",
    "otelcol",
    "otelcol-noderive",
)
EXPORTS = ("grpc/none", "grpc/gzip", "http/gzip", "http/none")
DEFAULT_PATHS = (
    "direct",
    *(f"{c}:{e}" for e in EXPORTS[:3] for c in ("sidecar", "rotel", "otelcol", "jaeger")),
    "sidecar-grpcio:grpc/gzip",
    "sidecar-h2:grpc/none",
)
DEFAULT_RATE_PATHS = ("sidecar:grpc/none", "rotel:grpc/none", "jaeger:grpc/none")


def split_level(collector: str) -> tuple[str, int | None]:
    """``sidecar@6`` -> (``sidecar``, 6): a sidecar path at that gzip level."""
    name, _, level = collector.partition("@")
    return name, int(level) if level.isdigit() else None


def check_path(path: str) -> None:
    if path == "direct":
        return
    collector, _, export = path.partition(":")
    collector, level = split_level(collector)
    if level is not None and (
        not collector.startswith("sidecar") or not export.endswith("/gzip") or not 1 <= level <= 9
    ):
        raise SystemExit(f"{path}: @LEVEL (1-9) is for a sidecar path with gzip")
    if collector not in COLLECTORS or export not in EXPORTS:
        raise SystemExit(
            f"unknown path {path!r}: use direct or COLLECTOR:EXPORT with COLLECTOR in "
            f"{COLLECTORS} and EXPORT in {EXPORTS}"
        )
    if collector in ("sidecar-h2", "sidecar-grpcio") and not export.startswith("grpc"):
        raise SystemExit(f"{path}: {collector} only differs in gRPC export")


def make(
    path: str,
    sink: str,
    workdir: Path,
    gzip_level: int | None,
    env: dict[str, str],
    groups: str = "all",
) -> Collector:
    if path == "direct":
        return Direct(sink)
    collector, _, export = path.partition(":")
    protocol, _, compression = export.partition("/")
    collector, level = split_level(collector)
    gzip_level = level or gzip_level
    if collector == "rotel":
        return Rotel(sink, workdir, export=protocol, compression=compression)
    if collector == "jaeger":
        return Jaeger(sink, workdir, export=protocol, compression=compression)
    if collector in ("otelcol", "otelcol-noderive"):
        derive = collector == "otelcol"
        return OtelCol(sink, workdir, protocol, compression, groups, derive=derive)
    if collector == "sidecar-noderive":
        return Sidecar(
            sink,
            compression,
            workdir,
            protocol,
            gzip_level,
            env=env or None,
            groups=groups,
            derive=False,
        )
    client = collector.partition("-")[2] or "auto"
    return Sidecar(sink, compression, workdir, protocol, gzip_level, client, env or None, groups)


def print_profiles(console: Console, directory: Path) -> None:
    """Where the sidecar spent its samples in its first gRPC-received throughput runs."""
    from bench import pyspy

    for out in sorted(directory.glob("throughput-sidecar*-0-*.txt")):
        total, frames = pyspy.top_frames(
            out, top=20, match=("gym_sidecar", "grpc/aio", "h2/", "zlib")
        )
        console.print(f"[bold]{out.name}[/]: % of {total} samples, inclusive")
        for pct, frame in frames:
            console.print(f"  {pct:5.1f}%  {frame}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", "--repeats", type=int, default=5, dest="rounds")
    p.add_argument("--spans", type=int, default=512, help="spans per (full) request")
    p.add_argument("--requests", type=int, default=800, help="requests per throughput run")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    p.add_argument("--protocols", default="grpc", help="how the generator sends: grpc,http")
    p.add_argument("--paths", default=",".join(DEFAULT_PATHS))
    p.add_argument(
        "--loads",
        default="varied",
        help=f"generator loads: {','.join(LOADS)}; LOAD:GROUPS runs the sidecar and otelcol "
        "with that span-group spec (default: all), e.g. rollouts:default",
    )
    p.add_argument("--rate", type=float, default=10_000.0, help="fixed-rate spans/s (0: skip)")
    p.add_argument("--rate-seconds", type=float, default=20.0)
    p.add_argument("--rate-spans", type=int, default=512, help="spans per request when paced")
    p.add_argument("--rate-paths", default=",".join(DEFAULT_RATE_PATHS))
    p.add_argument("--pin", action="store_true", help="same as --pin-modes on")
    p.add_argument("--pin-modes", default="off", help="off, on, or off,on (interleaved)")
    p.add_argument("--quick", action="store_true", help="1 round, short runs")
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    p.add_argument("--name", default="sidecar_vs_rotel", help="output file name (no suffix)")
    p.add_argument("--seed", type=int, default=11, help="shuffles the path order")
    p.add_argument(
        "--gzip-level",
        type=int,
        help="the sidecar's backend.compression_level (default: its own, 2)",
    )
    p.add_argument(
        "--sidecar-env",
        action="append",
        default=[],
        metavar="K=V",
        help="environment for the sidecar process (e.g. MALLOC_ARENA_MAX=2)",
    )
    p.add_argument("--profile", type=Path, help="py-spy the sidecar's runs into this directory")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.rounds, args.requests, args.rate_seconds = 1, 150, 8.0
    console = Console(width=160)
    paths = [p for p in args.paths.split(",") if p]
    rate_paths = [p for p in args.rate_paths.split(",") if p] if args.rate else []
    for path in {*paths, *rate_paths}:
        check_path(path)
    if any(p.startswith("jaeger:") for p in (*paths, *rate_paths)):
        try:
            jaeger_binary()
        except RuntimeError as err:
            console.print(f"[yellow]{err}: the jaeger paths are left out[/]")
            paths = [p for p in paths if not p.startswith("jaeger:")]
            rate_paths = [p for p in rate_paths if not p.startswith("jaeger:")]
    if any(p.startswith("otelcol:") for p in (*paths, *rate_paths)):
        try:
            console.print(f"same-job Collector: {otelcol_binary()}")
        except (RuntimeError, OSError, subprocess.CalledProcessError) as err:
            console.print(f"[yellow]{err}: the otelcol paths are left out[/]")
            paths = [p for p in paths if not p.startswith("otelcol:")]
            rate_paths = [p for p in rate_paths if not p.startswith("otelcol:")]
    loads = [tuple(x.partition(":")[::2]) for x in args.loads.split(",") if x]
    unknown = sorted({name for name, _ in loads} - set(LOADS))
    if unknown:
        raise SystemExit(f"unknown load(s) {unknown}; loads: {LOADS}")
    protocols = [p for p in args.protocols.split(",") if p]
    pin_modes = ["on"] if args.pin else [m for m in args.pin_modes.split(",") if m]
    if "on" in pin_modes and (os.cpu_count() or 1) < 2:
        raise SystemExit("pinning needs at least 2 cores")
    env = dict(kv.split("=", 1) for kv in args.sidecar_env)

    plan: list[tuple[str, str, LoadSpec, bool]] = []
    for pinned in (m == "on" for m in pin_modes):
        for load in loads:
            name, groups = load[0], load[1] or "all"
            for proto in protocols:
                for path in paths:
                    if path == "direct" and (proto != "grpc" or groups != "all"):
                        continue  # the sink speaks gRPC only; direct gates nothing
                    spec = LoadSpec(
                        proto, args.spans, args.requests, args.concurrency, load=name, groups=groups
                    )
                    plan.append(("throughput", path, spec, pinned))
            if pinned and "off" in pin_modes:
                continue  # memory and CPU share at a fixed rate: unpinned is enough
            for path in rate_paths:
                spec = LoadSpec(
                    "grpc", args.rate_spans, 0, 4, args.rate, args.rate_seconds, name, groups=groups
                )
                plan.append(("fixed_rate", path, spec, pinned))

    start_machine = report.machine()
    console.print(f"machine at start: {start_machine}")
    results: dict[str, list[RunResult]] = {"throughput": [], "fixed_rate": []}
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="bench-svr-"))
    with (
        RecordingSink(record=False) as sink,
        ByteCountingRelay(sink.endpoint) as relay,
        HttpSink() as http_sink,
        ByteCountingRelay(http_sink.endpoint) as http_relay,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress,
    ):
        overall = progress.add_task("all runs", total=len(plan) * args.rounds)
        for rnd in range(args.rounds):
            order = plan[:]
            rng.shuffle(order)
            for kind, path, spec, pinned in order:
                pin_label = " pinned" if pinned else ""
                label = f"{kind} {path} {spec.protocol} {spec.label}{pin_label} #{rnd + 1}"
                task = progress.add_task(label, total=None)

                def update(got: int, expected: int, task: Any = task) -> None:
                    progress.update(task, completed=got, total=expected)

                spy = None
                if args.profile is not None and path.startswith("sidecar"):
                    name = path.replace(":", "-").replace("/", "-")
                    spy = args.profile / f"{kind}-{name}-{spec.protocol}-{rnd}-{pinned}.txt"
                pin_cores = ({1}, {0}) if pinned else None
                pin(os.getpid(), {0} if pinned else set(range(os.cpu_count() or 1)))
                over_http = path.partition(":")[2].startswith("http")
                the_sink, the_relay = (http_sink, http_relay) if over_http else (sink, relay)
                collector = make(
                    path, the_relay.endpoint, workdir, args.gzip_level, env, spec.groups
                )
                settle = None if spec.groups == "all" else 1.5
                res = run(collector, the_sink, spec, rnd, update, pin_cores, spy, the_relay, settle)
                progress.update(task, description=label + f"  {res.spans_per_s:,.0f}/s")
                progress.remove_task(task)
                results[kind].append(res)
                progress.advance(overall)
    end_machine = report.machine()
    thr = report.summarise(results["throughput"])
    paced = report.summarise(results["fixed_rate"])
    console.print(report.table("throughput", thr, paced=False))
    if paced:
        console.print(report.table(f"fixed rate {args.rate:,.0f} spans/s", paced, paced=True))
    rat = report.ratios(results["throughput"])
    console.print(report.ratio_table(rat))
    costs = report.derive_costs(results["throughput"])
    if costs:
        console.print(report.derive_table(costs))
    if args.profile is not None:
        print_profiles(console, args.profile)
    console.print(f"machine at end: {end_machine}")
    doc = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "rotel_version": ROTEL_VERSION,
        "machine_start": start_machine,
        "machine_end": end_machine,
        "throughput": thr,
        "fixed_rate": paced,
        "ratios": rat,
        "derive_costs": costs,
    }
    name = args.name + ("_quick" if args.quick else "")
    report.write_json(args.out / f"{name}.json", doc, results)
    report.chart(args.out / f"{name}.png", thr, paced)
    (args.out / f"{name}.md").write_text(report.markdown(doc), encoding="utf-8")
    console.print(f"wrote {args.out / name}.json, .md and .png")
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
