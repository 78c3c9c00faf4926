"""The derive step's cost per derived span, in instructions (callgrind) and in CPU time
(a benchmark harness; it asserts nothing).

    uv run --frozen python -m bench.derive_callgrind [--loads rollouts,derive-heavy]
        [--repeats 3] [--no-callgrind]

The requests are ``bench.loadgen``'s (512-span Gym-shaped requests, 56 distinct, parsed
once): ``rollouts`` (2 of 18 spans derived from), ``derive-heavy`` (half). For each
load the child runs the derive step the sidecar runs per trace request,
``SpanDeriver.extract`` (read the rollout/verify spans) and ``SpanDeriver.record``
(add the points to the store), over every request, after one warm-up pass:

- under ``valgrind --tool=callgrind`` (``PYTHONHASHSEED=0``; start-up uninstrumented,
  instrumentation switched on by ``callgrind_control`` before the step): counters zeroed before
  each step (``os.getpgrp()``) and dumped after it (``os.getsid(0)``); instructions per
  derived span for extract and for record;
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
    from gym_sidecar.metrics.config import MetricsConfig
    from gym_sidecar.metrics.derived import DerivedMetrics
    from gym_sidecar.metrics.spans import SpanDeriver
    from gym_sidecar.selfmetrics import SelfMetrics
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    reqs = [ExportTraceServiceRequest.FromString(b) for b in _read_bodies(bodies)]
    derived = sum(
        len(ss.spans)
        for r in reqs
        for rs in r.resource_spans
        for ss in rs.scope_spans
        if ss.scope.name.endswith((".rollout", ".verify"))
    )
    total = sum(len(ss.spans) for r in reqs for rs in r.resource_spans for ss in rs.scope_spans)
    deriver = SpanDeriver(DerivedMetrics(MetricsConfig(), SelfMetrics()))
    for r in reqs:  # warm-up: every series exists afterwards
        p = deriver.extract(r)
        if p is not None:
            deriver.record(p)
    best_extract = best_record = float("inf")
    instrument_on()
    for _ in range(repeats):
        os.getpgrp()
        t0 = time.perf_counter()
        pending = [deriver.extract(r) for r in reqs]
        t1 = time.perf_counter()
        os.getsid(0)
        os.getpgrp()
        t2 = time.perf_counter()
        for p in pending:
            if p is not None:
                deriver.record(p)
        t3 = time.perf_counter()
        os.getsid(0)
        best_extract = min(best_extract, t1 - t0)
        best_record = min(best_record, t3 - t2)
    print(
        json.dumps(
            {
                "derived": derived,
                "spans": total,
                "extract_us": 1e6 * best_extract / derived,
                "record_us": 1e6 * best_record / derived,
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
        res["extract_instr"] = counts[0] / res["derived"]
        res["record_instr"] = counts[1] / res["derived"]
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
            f"  {load:>12}: {native['derived']}/{native['spans']} spans derived; extract "
            f"{native['extract_us']:.2f} us, record {native['record_us']:.2f} us per derived span"
        )
        if not args.no_callgrind:
            cg = _run(bodies, True, 1, args.sidecar_src)
            both = cg["extract_instr"] + cg["record_instr"]
            line += (
                f"; instructions per derived span: extract {cg['extract_instr']:,.0f}, record "
                f"{cg['record_instr']:,.0f}, together {both:,.0f}"
            )
        print(line, flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
