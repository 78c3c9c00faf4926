"""The trace pipeline's Python cost per request and per span, in process, phase by
phase (a benchmark harness; it asserts nothing).

    uv run --frozen python -m bench.pipeline_callgrind [--load rollouts] [--requests 112]
        [--calls] [--cprofile N] [--no-callgrind] [--sidecar-src OTHER_TREE/sidecar/src]

What runs: the pipeline ``assemble.build_pipeline`` builds for the whole-sidecar
harness's configuration (``bench.sidecar_callgrind``: span groups ``all``, derive on,
two static enrich attributes, gRPC export without compression; ``--no-derive``: derive
off), in this process, with
the exporter replaced by one that accepts every payload at once (the gRPC client is not
the pipeline's Python). ``bench.loadgen``'s requests of ``--load`` (512 spans at most,
56 distinct, cycled to ``--requests``) go through it in three phases, each over every
request:

- ``scan``: the receiver's ``decode_batch`` (the pure-Python scanner: upb's parse, the
  walk of the two top wire levels, the derive fields read from the parsed spans);
  ``upb parse`` is that parse alone (``ParseFromString``), so ``scan - upb parse`` is
  the walk, which the native scanner replaces too;
- ``pipeline``: per request what the gRPC receiver does once it has the batch
  (``receiver.request.submit``: ``head.consume`` and its counters; the response): enrich,
  derive (extract, and record once accepted), gate, and the queue stage (serialize,
  ``ExportQueue.put``);
- ``send``: the sender's workers drain the queue (lease, payload, export, ack).

One warm-up pass runs first (every series, cache and connection exists afterwards).
Under ``valgrind --tool=callgrind`` (start-up uninstrumented, ``PYTHONHASHSEED=0``,
counters zeroed before each phase and dumped after it) it prints instructions per
request and per span of each phase. ``--calls`` (no valgrind) prints Python calls per
request of each phase, by function (``sys.setprofile``: Python functions and builtins
called); ``--cprofile N`` the top N functions of the pipeline and send phases by own
time under cProfile. ``--sidecar-src`` puts another tree's ``sidecar/src`` first on the
path (a before/after pair from one environment). ``--native`` scans with the native
scanner (``gym_sidecar_native``) where it imports: ``scan`` is then its scan, and
``upb parse`` is still upb's, for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gym_telemetry_demo.stopsignals import run_main

from bench.callgrind_support import TOTALS, instrument_on, valgrind_command

REPO = Path(__file__).resolve().parents[1]
ENRICH_ATTRIBUTES = {"deployment.environment.name": "bench", "k8s.cluster.name": "gym-bench"}
PHASES = ("upb parse", "scan", "pipeline", "send")


def _bodies(load: str, requests: int) -> list[bytes]:
    from bench.loadgen import build_requests

    distinct = [body for body, _ in build_requests(512, 56, 1, load)]
    return [distinct[i % len(distinct)] for i in range(requests)]


class _Accept:
    """An exporter that accepts every payload (the sender's side of the pipeline only)."""

    name = "accept"

    def __init__(self) -> None:
        self.payloads = 0
        self.items = 0
        self.expected = 0
        self.done = asyncio.Event()

    async def export(self, signal: Any, payload: bytes, items: int) -> Any:
        from gym_sidecar.core.exporter import ExportResult

        self.payloads += 1
        self.items += items
        if self.items >= self.expected:
            self.done.set()
        return ExportResult.success()

    async def export_parts(self, signal: Any, parts: Any, items: int) -> Any:
        # What the sender calls since the batches leave as pieces (export/body.py); the
        # real exporters send or compress the pieces without joining them, so neither
        # does this one.
        return await self.export(signal, b"", items)

    async def close(self) -> None:
        pass


async def _child(
    load: str, requests: int, mode: str, top: int, derive: bool, native: bool
) -> dict[str, Any]:
    from gym_sidecar.assemble import build_pipeline
    from gym_sidecar.config import SidecarConfig
    from gym_sidecar.core.signals import SPECS
    from gym_sidecar.core.stage import Signal, pipeline_trace_scan
    from gym_sidecar.receiver.request import build_response, decode_batch, submit
    from gym_sidecar.selfmetrics import SelfMetrics
    from gym_sidecar.wire.protobuf.scan import active_scanner, pure_python
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    cfg = SidecarConfig.model_validate(
        {
            "backend": {"url": "http://127.0.0.1:9", "compression": "none"},
            "span_groups": {"spec": "all", "watch_interval_s": 0},
            "enrich": {"attributes": ENRICH_ATTRIBUTES},
            "metrics": {"enabled": derive, "interval_s": 3600},
        }
    )
    metrics = SelfMetrics()
    pipeline = build_pipeline(cfg, metrics)
    stages = pipeline.stages
    queue_stage: Any = stages[-1]
    exporter = _Accept()
    await queue_stage.sender.exporter.close()
    queue_stage.sender.exporter = exporter
    for stage in stages:
        await stage.start()
    head = pipeline.head
    scan = pipeline_trace_scan(head)
    spec = SPECS[Signal.TRACES]
    bodies = _bodies(load, requests)
    queue = queue_stage.queue

    def parse() -> None:
        for body in bodies:
            ExportTraceServiceRequest.FromString(body)

    def decode() -> list[Any]:
        return [
            decode_batch(
                spec,
                body,
                json=False,
                max_depth=100,
                max_messages=1_000_000,
                scan=scan,
                peer="127.0.0.1:40000",
            )
            for body in bodies
        ]

    async def consume(batches: list[Any]) -> None:
        for batch in batches:  # as the gRPC receiver hands a batch on and answers
            await submit(head, batch, "grpc", metrics)
            build_response(spec, batch).SerializeToString()

    async def drained() -> None:
        """Until the exporter has taken every span consumed so far (the sender acks a
        lease before it next waits, so before this wakes up)."""
        await exporter.done.wait()
        exporter.done.clear()
        assert not queue.used_bytes

    spans = 0
    with contextlib.nullcontext() if native else pure_python():
        warm = decode()
        spans = sum(b.items for b in warm)
        exporter.expected = spans
        await consume(warm)
        await drained()
        del warm
        result: dict[str, Any] = {"requests": requests, "spans": spans}
        result["scanner"] = active_scanner()
        exporter.expected = 2 * spans  # the measured pass's
        if mode == "callgrind":
            instrument_on()
            os.getpgrp()
            parse()
            os.getsid(0)
            os.getpgrp()
            batches = decode()
            os.getsid(0)
            os.getpgrp()
            await consume(batches)
            os.getsid(0)
            del batches
            os.getpgrp()
            await drained()
            os.getsid(0)
        elif mode == "calls":
            result["calls"] = {}
            for phase, run in (("scan", None), ("pipeline", None), ("send", None)):
                counts: collections.Counter[str] = collections.Counter()

                def count(frame: Any, event: str, arg: Any, counts: Any = counts) -> None:
                    if event == "call":
                        code = frame.f_code
                        counts[f"{Path(code.co_filename).name}:{code.co_qualname}"] += 1
                    elif event == "c_call":
                        counts[f"<builtin>:{getattr(arg, '__qualname__', arg)}"] += 1

                if phase == "scan":
                    sys.setprofile(count)
                    batches = decode()
                    sys.setprofile(None)
                elif phase == "pipeline":
                    sys.setprofile(count)
                    await consume(batches)
                    sys.setprofile(None)
                else:
                    del batches
                    sys.setprofile(count)
                    await drained()
                    sys.setprofile(None)
                del run
                result["calls"][phase] = {
                    "total": sum(counts.values()) / requests,
                    "by_function": [(k, n / requests) for k, n in counts.most_common(top)],
                }
        elif mode == "cprofile":
            import cProfile
            import io
            import pstats

            batches = decode()
            prof = cProfile.Profile()
            prof.enable()
            await consume(batches)
            del batches
            await drained()
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
            result["cprofile"] = out.getvalue()
    for stage in stages:
        await stage.shutdown(5.0)
    result["exported_payloads"] = exporter.payloads
    return result


def child(load: str, requests: int, mode: str, top: int, derive: bool, native: bool) -> None:
    result = asyncio.run(_child(load, requests, mode, top, derive, native))
    print(json.dumps(result), flush=True)


def _run(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    path = [str(args.sidecar_src.resolve())] if args.sidecar_src else []
    env = dict(
        os.environ,
        PYTHONHASHSEED="0",
        GYM_SIDECAR_NATIVE="1" if args.native else "0",
        PYTHONPATH=os.pathsep.join(
            [*path, str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    )
    cmd = [
        sys.executable,
        "-m",
        "bench.pipeline_callgrind",
        "--child",
        mode,
        "--load",
        args.load,
        "--requests",
        str(args.requests),
        "--top",
        str(args.top),
        *(["--no-derive"] if args.no_derive else []),
        *(["--native"] if args.native else []),
    ]
    out_dir = None
    if mode == "callgrind":
        out_dir = Path(tempfile.mkdtemp(prefix="cg-pipeline-"))
        env["BENCH_CALLGRIND"] = "1"
        cmd = [*valgrind_command(out_dir), *cmd]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=REPO)
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if out_dir is not None:
        dumps = sorted(out_dir.glob("cg.*.[0-9]*"), key=lambda f: int(f.name.rsplit(".", 1)[1]))
        counts = [int(m.group(1)) for f in dumps if (m := TOTALS.search(f.read_text()))]
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            for f in dumps:
                shutil.copy(f, args.keep / f.name)
        shutil.rmtree(out_dir, ignore_errors=True)
        result["instructions"] = dict(zip(PHASES, counts, strict=True))
    return result


def _print_callgrind(args: argparse.Namespace, res: dict[str, Any]) -> None:
    n, spans = res["requests"], res["spans"]
    counts: dict[str, int] = res["instructions"]
    print(
        f"{args.load}{'' if not args.no_derive else ', derive off'}, scanner "
        f"{res['scanner']}: {n} requests, {spans} "
        f"spans ({spans / n:.0f} per request), "
        f"{res['exported_payloads']} export payloads; instructions per request / per span:"
    )
    rows: list[tuple[str, float]] = [(k, float(v)) for k, v in counts.items()]
    if res["scanner"] == "python":
        rows.append(("scan - upb parse", float(counts["scan"] - counts["upb parse"])))
    rows.append(("pipeline + send", float(counts["pipeline"] + counts["send"])))
    for name, total in rows:
        print(f"  {name:>18}: {total / n:>12,.0f} {total / spans:>10,.0f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--load", default="rollouts")
    p.add_argument("--requests", type=int, default=112)
    p.add_argument("--calls", action="store_true", help="Python calls per request")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="cProfile's top N")
    p.add_argument("--no-callgrind", action="store_true")
    p.add_argument("--no-derive", action="store_true", help="metrics.enabled: false")
    p.add_argument(
        "--native", action="store_true", help="the native scanner, where it is installed"
    )
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--sidecar-src", type=Path, help="another tree's sidecar/src, first")
    p.add_argument("--keep", type=Path, help="keep the callgrind dumps in this directory")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.load, args.requests, args.child, args.top, not args.no_derive, args.native)
        return 0
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    out: dict[str, Any] = {"load": args.load}
    runs: list[tuple[str, Callable[[dict[str, Any]], None]]] = []
    if not args.no_callgrind:
        runs.append(("callgrind", lambda r: _print_callgrind(args, r)))
    if args.calls:

        def show_calls(r: dict[str, Any]) -> None:
            for phase, data in r["calls"].items():
                print(f"  Python calls per request, {phase}: {data['total']:,.1f}")
                for name, per in data["by_function"]:
                    print(f"    {per:>10,.1f}  {name}")

        runs.append(("calls", show_calls))
    if args.cprofile:
        runs.append(("cprofile", lambda r: print(r["cprofile"])))
        args.top = args.cprofile
    for mode, show in runs:
        res = _run(args, mode)
        out[mode] = res
        show(res)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
