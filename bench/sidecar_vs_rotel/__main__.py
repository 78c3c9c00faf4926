"""gym-sidecar vs rotel vs the bare transport (a benchmark harness, not a test).

    uv run --frozen python -m bench.sidecar_vs_rotel              # full run, ~5 min
    uv run --frozen python -m bench.sidecar_vs_rotel --quick      # ~1 min, rough
    uv run --frozen python -m bench.sidecar_vs_rotel --pin        # collector on core 1

Paths (``procs``): ``direct`` (generator -> sink), ``sidecar-gzip`` and ``sidecar-none``
(full pipeline, gRPC export compressed or not), ``rotel`` (gRPC export, gzip), and the
OTLP/HTTP export twins ``sidecar-http-gzip`` and ``rotel-http`` (into an HTTP sink).
Each repeat starts a fresh collector per path, in a shuffled order. Throughput runs send
``--requests`` x ``--spans`` Gym-shaped spans (``bench.loadgen``) over gRPC and over
HTTP protobuf; the fixed-rate runs pace ``--rate`` spans/s for ``--rate-seconds``
through the sidecar (gzip) and rotel. It prints a table and writes
``<out>/sidecar_vs_rotel.json`` and ``.png`` (default ``docs/benchmarks/``).
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.sidecar_vs_rotel import report
from bench.sidecar_vs_rotel.procs import Collector, Direct, Rotel, Sidecar, pin
from bench.sidecar_vs_rotel.relay import ByteCountingRelay
from bench.sidecar_vs_rotel.runs import LoadSpec, RunResult, run
from tests.support.http_sink import HttpSink
from tests.support.rotel import ROTEL_VERSION
from tests.support.sink import RecordingSink

PATHS = ("direct", "sidecar-gzip", "sidecar-none", "rotel", "sidecar-http-gzip", "rotel-http")
HTTP_EXPORT_PATHS = ("sidecar-http-gzip", "rotel-http")
"""Paths whose collector exports over OTLP/HTTP (into the HTTP sink)."""


def make(path: str, sink: str, workdir: Path, gzip_level: int | None = None) -> Collector:
    if path == "direct":
        return Direct(sink)
    if path == "rotel":
        return Rotel(sink, workdir)
    if path == "rotel-http":
        return Rotel(sink, workdir, export="http")
    if path == "sidecar-http-gzip":
        return Sidecar(sink, "gzip", workdir, export="http", gzip_level=gzip_level)
    return Sidecar(sink, path.removeprefix("sidecar-"), workdir)


def print_profiles(console: Console, directory: Path) -> None:
    """Where the sidecar spent its samples in the first gRPC throughput run of each path."""
    from bench import pyspy

    for path in ("sidecar-gzip", "sidecar-none"):
        out = directory / f"throughput-{path}-grpc-0.txt"
        if not out.exists():
            continue
        total, frames = pyspy.top_frames(out, top=20, match=("gym_sidecar", "grpc/aio"))
        console.print(f"[bold]{path}[/] (gRPC): % of {total} samples, inclusive")
        for pct, frame in frames:
            console.print(f"  {pct:5.1f}%  {frame}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--spans", type=int, default=512, help="spans per request")
    p.add_argument("--requests", type=int, default=800, help="requests per throughput run")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    p.add_argument("--protocols", default="grpc,http")
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--rate", type=float, default=10_000.0, help="fixed-rate spans/s (0: skip)")
    p.add_argument("--rate-seconds", type=float, default=20.0)
    p.add_argument("--rate-spans", type=int, default=512, help="spans per request when paced")
    p.add_argument("--pin", action="store_true", help="collector on core 1, the rest on core 0")
    p.add_argument("--quick", action="store_true", help="1 repeat, short runs")
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    p.add_argument("--seed", type=int, default=11, help="shuffles the path order")
    p.add_argument(
        "--gzip-level",
        type=int,
        help="the sidecar's backend.compression_level for HTTP export (default: its own)",
    )
    p.add_argument("--profile", type=Path, help="py-spy the sidecar's runs into this directory")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.repeats, args.requests, args.rate_seconds = 1, 150, 8.0
    console = Console(width=150)
    paths = [p for p in args.paths.split(",") if p]
    unknown = set(paths) - set(PATHS)
    if unknown:
        raise SystemExit(f"unknown path(s) {sorted(unknown)}; paths: {', '.join(PATHS)}")
    protocols = [p for p in args.protocols.split(",") if p]
    pin_cores = None
    if args.pin:
        if (os.cpu_count() or 1) < 2:
            raise SystemExit("--pin needs at least 2 cores")
        pin_cores = ({1}, {0})
        pin(os.getpid(), {0})  # the harness, its sink threads and (inherited) the generator

    plan: list[tuple[str, str, LoadSpec]] = []
    for proto in protocols:
        for path in paths:
            if path == "direct" and proto != "grpc":
                continue  # the sink speaks gRPC only
            plan.append(
                ("throughput", path, LoadSpec(proto, args.spans, args.requests, args.concurrency))
            )
    if args.rate:
        for path in ("sidecar-gzip", "rotel", *HTTP_EXPORT_PATHS):
            if path in paths:
                spec = LoadSpec("grpc", args.rate_spans, 0, 4, args.rate, args.rate_seconds)
                plan.append(("fixed_rate", path, spec))

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
        overall = progress.add_task("all runs", total=len(plan) * args.repeats)
        for repeat in range(args.repeats):
            order = plan[:]
            rng.shuffle(order)
            for kind, path, spec in order:
                label = f"{kind} {path} {spec.protocol} #{repeat + 1}"
                task = progress.add_task(label, total=None)

                def update(got: int, expected: int, task: Any = task) -> None:
                    progress.update(task, completed=got, total=expected)

                spy = None
                if args.profile is not None and path.startswith("sidecar"):
                    spy = args.profile / f"{kind}-{path}-{spec.protocol}-{repeat}.txt"
                if path in HTTP_EXPORT_PATHS:
                    collector = make(path, http_relay.endpoint, workdir, args.gzip_level)
                    res = run(
                        collector, http_sink, spec, repeat, update, pin_cores, spy, http_relay
                    )
                else:
                    collector = make(path, relay.endpoint, workdir)
                    res = run(collector, sink, spec, repeat, update, pin_cores, spy, relay)
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
    rat = report.ratios(thr)
    for r in rat:
        console.print(
            f"{r['path']} {r['protocol']}: spans per CPU-second = "
            f"{r['spans_per_cpu_s_vs_rotel']:.2f}x {r['vs']}'s"
        )
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
        "sidecar_vs_rotel": rat,
    }
    name = "sidecar_vs_rotel" + ("_quick" if args.quick else "")
    report.write_json(args.out / f"{name}.json", doc, results)
    report.chart(args.out / f"{name}.png", thr, paced)
    console.print(f"wrote {args.out / name}.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
