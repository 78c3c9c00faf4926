"""The derive step's cost per derived span, in instructions (callgrind) and in CPU time
(a benchmark harness; it asserts nothing).

    uv run --frozen python -m bench.derive_callgrind [--loads rollouts,derive-heavy]
        [--repeats 3] [--no-callgrind]

The requests are ``bench.loadgen``'s (512-span Gym-shaped requests, 56 distinct):
``rollouts`` (2 of 18 spans derived from), ``derive-heavy`` (half). For each load the
child runs the derive step the sidecar runs per trace request over every request, after
one warm-up pass. Since the pipeline works on a request's wire view
(``gym_sidecar.core.traces``), the step has three parts:

- ``scan``: the share of the receiver's scan that the derive stage causes, i.e. the
  pure-Python scanner (``wire.protobuf.scan.scan_python``) asked for the derive stage's
  ``SCAN_SPEC`` minus the same scan asked for nothing (it then reads the rollout/verify
  spans' fields from the parsed request);
- ``extract``: ``SpanDeriver.extract`` (the points, from those fields);
- ``record``: ``SpanDeriver.record`` (add the points to the store).

A sidecar from before the wire view (``--sidecar-src`` of an older tree) has no scan:
its ``extract`` reads the parsed upb request itself, so the sums compare. Measured:

- under ``valgrind --tool=callgrind`` (``PYTHONHASHSEED=0``; start-up uninstrumented,
  instrumentation switched on by ``callgrind_control`` before the steps): counters
  zeroed before each step (``os.getpgrp()``) and dumped after it (``os.getsid(0)``);
  instructions per derived span for each part;
- natively: best of ``--repeats`` passes, µs per derived span (wall clock; on a loaded
  machine only the instruction counts are comparable between runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gym_telemetry_demo.stopsignals import run_main

from bench.callgrind_support import TOTALS, instrument_on, valgrind_command

REPO = Path(__file__).resolve().parents[1]


def _write_bodies(load: str, path: Path) -> None:
    from bench.loadgen import build_requests

    with path.open("wb") as f:
        for body, _ in build_requests(512, 56, 1, load):
            f.write(len(body).to_bytes(4, "big") + body)


def _read_bodies(path: Path) -> list[bytes]:
    data, out, i = path.read_bytes(), [], 0
    while i < len(data):
        n = int.from_bytes(data[i : i + 4], "big")
        out.append(data[i + 4 : i + 4 + n])
        i += 4 + n
    return out


def child(bodies: Path, repeats: int) -> None:
    from gym_sidecar.metrics import spans as derive_spans
    from gym_sidecar.metrics.config import MetricsConfig
    from gym_sidecar.metrics.derived import DerivedMetrics
    from gym_sidecar.selfmetrics import SelfMetrics
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    raw = _read_bodies(bodies)
    parsed = [ExportTraceServiceRequest.FromString(b) for b in raw]
    derived = sum(
        len(ss.spans)
        for r in parsed
        for rs in r.resource_spans
        for ss in rs.scope_spans
        if ss.scope.name.endswith((".rollout", ".verify"))
    )
    total = sum(len(ss.spans) for r in parsed for rs in r.resource_spans for ss in rs.scope_spans)
    spec = getattr(derive_spans, "SCAN_SPEC", None)

    def scan(derive: bool) -> list[Any]:
        if spec is None:  # before the wire view: extract reads the parsed request
            return parsed if derive else []
        from gym_sidecar.wire.protobuf.scan import scan_python

        # what the receivers pass (a tree from before sparse scopes has no such fields)
        extra: dict[str, Any] = {}
        if derive:
            extra["event_keys"] = spec.event_keys
            if getattr(spec, "sparse_scopes", None):
                extra["sparse_scopes"] = spec.sparse_scopes
                extra["sparse_keys"] = spec.sparse_keys
        return [
            scan_python(
                b,
                max_depth=100,
                max_messages=1_000_000,
                derive_scopes=spec.derive_scopes if derive else frozenset(),
                attr_keys=spec.attr_keys if derive else (),
                **extra,
            )
            for b in raw
        ]

    deriver = derive_spans.SpanDeriver(DerivedMetrics(MetricsConfig(), SelfMetrics()))
    for r in scan(True):  # warm-up: every series exists afterwards
        p = deriver.extract(r)
        if p is not None:
            deriver.record(p)
    best = {"scan_plain": float("inf"), "scan": float("inf"), "extract": float("inf")}
    best["record"] = float("inf")
    instrument_on()
    for _ in range(repeats):
        os.getpgrp()
        t0 = time.perf_counter()
        scan(False)
        t1 = time.perf_counter()
        os.getsid(0)
        os.getpgrp()
        t2 = time.perf_counter()
        views = scan(True)
        t3 = time.perf_counter()
        os.getsid(0)
        os.getpgrp()
        t4 = time.perf_counter()
        pending = [deriver.extract(r) for r in views]
        t5 = time.perf_counter()
        os.getsid(0)
        os.getpgrp()
        t6 = time.perf_counter()
        for p in pending:
            if p is not None:
                deriver.record(p)
        t7 = time.perf_counter()
        os.getsid(0)
        for key, seconds in (
            ("scan_plain", t1 - t0),
            ("scan", t3 - t2),
            ("extract", t5 - t4),
            ("record", t7 - t6),
        ):
            best[key] = min(best[key], seconds)
    print(
        json.dumps(
            {
                "derived": derived,
                "spans": total,
                "scan_us": 1e6 * max(0.0, best["scan"] - best["scan_plain"]) / derived,
                "extract_us": 1e6 * best["extract"] / derived,
                "record_us": 1e6 * best["record"] / derived,
            }
        ),
        flush=True,
    )


def _run(
    bodies: Path, callgrind: bool, repeats: int, sidecar_src: Path | None = None
) -> dict[str, float]:
    path = [str(sidecar_src)] if sidecar_src else []
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=os.pathsep.join([*path, str(REPO)]))
    cmd = [sys.executable, "-m", "bench.derive_callgrind", "--child", str(bodies)]
    out_dir = None
    if callgrind:
        out_dir = Path(tempfile.mkdtemp(prefix="cg-derive-"))
        env["BENCH_CALLGRIND"] = "1"
        cmd = [
            *valgrind_command(out_dir),
            *cmd,
            "--repeats",
            "1",
        ]
    else:
        cmd += ["--repeats", str(repeats)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=REPO)
    if done.returncode:
        raise SystemExit(done.stderr[-1500:])
    res: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    if out_dir is not None:
        dumps = sorted(out_dir.glob("cg.*.[0-9]*"), key=lambda f: int(f.name.rsplit(".", 1)[1]))
        counts = [int(m.group(1)) for f in dumps if (m := TOTALS.search(f.read_text()))]
        shutil.rmtree(out_dir, ignore_errors=True)
        res["scan_instr"] = (counts[1] - counts[0]) / res["derived"]
        res["extract_instr"] = counts[2] / res["derived"]
        res["record_instr"] = counts[3] / res["derived"]
        # the same, per span of the load (every span, derived or not): what the derive
        # step adds to a span on average, comparable when the derived set changes
        per = res["derived"] / res["spans"]
        res["per_span_instr"] = per * (
            res["scan_instr"] + res["extract_instr"] + res["record_instr"]
        )
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loads", default="rollouts,derive-heavy")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-callgrind", action="store_true")
    p.add_argument(
        "--sidecar-src",
        type=Path,
        help="another gym_sidecar source tree (its src/) first on the path: a before run",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(Path(args.child), args.repeats)
        return 0
    print(f"derive step per derived span; load average {os.getloadavg()[0]:.1f}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="derive-bodies-"))
    for load in (x for x in args.loads.split(",") if x):
        bodies = tmp / f"{load}.bin"
        _write_bodies(load, bodies)
        native = _run(bodies, False, args.repeats, args.sidecar_src)
        line = (
            f"  {load:>12}: {native['derived']}/{native['spans']} spans derived; scan "
            f"{native['scan_us']:.2f} us, extract {native['extract_us']:.2f} us, record "
            f"{native['record_us']:.2f} us per derived span"
        )
        if not args.no_callgrind:
            cg = _run(bodies, True, 1, args.sidecar_src)
            parts = ("scan_instr", "extract_instr", "record_instr")
            line += (
                f"; instructions per derived span: scan {cg['scan_instr']:,.0f}, extract "
                f"{cg['extract_instr']:,.0f}, record {cg['record_instr']:,.0f}, together "
                f"{sum(cg[k] for k in parts):,.0f}; per span of the load "
                f"{cg['per_span_instr']:,.0f}"
            )
        print(line, flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
