"""The native trace scanner against upb, in instructions per span (callgrind) and in CPU
time (a benchmark harness; it asserts nothing).

    uv run --frozen --group native python -m bench.native_scan [--loads rollouts,derive-heavy]
        [--repeats 5] [--no-callgrind]

The requests are ``bench.loadgen``'s, as the derive bench uses them: 56 distinct 512-span
Gym-shaped requests per load (``build_requests(512, 56, 1, load)``): ``rollouts`` (2 of
18 spans in the derived scopes) and ``derive-heavy`` (half). Per load, over all 56
requests, after one warm-up pass:

- ``upb parse``: ``ExportTraceServiceRequest.ParseFromString``, what the receivers did
  before the wire view (validation included: it is what upb accepts);
- ``upb parse + derive reads``: the same, then what the pure-Python scanner reads through
  the upb objects: each block's scope name and, in the rollout and verify scopes, each
  span's derive tuple (name, times, ids, status code, the derive stage's three attribute
  values), built the way ``core.traces.DerivedSpan`` has it;
- ``native scan``: ``gym_sidecar_native.scan_traces`` with the same derive scopes and
  keys (validation, limits, the index and the derive tuples);
- ``native, no derive``: the same with no derive scope (validation and index only).

Under ``valgrind --tool=callgrind`` (``PYTHONHASHSEED=0``; start-up uninstrumented,
instrumentation switched on around the loops, counters zeroed before each step at
``os.getpgrp()`` and dumped after it at ``os.getsid(0)``, as bench/callgrind_support.py
does it): instructions per span (all spans) and per derived span. Natively: the best of
``--repeats`` passes, ns per span (wall clock; only the instruction counts compare
between runs on a loaded machine).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gym_telemetry_demo.stopsignals import run_main

from bench.callgrind_support import TOTALS, instrument_on, valgrind_command

REPO = Path(__file__).resolve().parents[1]
STEPS = ("upb parse", "upb parse + derive reads", "native scan", "native, no derive")


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


def _steps() -> tuple[list[Callable[[bytes], object]], frozenset[str], tuple[str, ...]]:
    """The four steps, each a function of one request's bytes."""
    import gym_sidecar_native
    import gym_telemetry_semconv as semconv
    from gym_sidecar.core.traces import ResourceBlock, ScopeBlock
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    scopes = frozenset(
        {semconv.scope_name(semconv.GROUP_ROLLOUT), semconv.scope_name(semconv.GROUP_VERIFY)}
    )
    keys = (semconv.ROLLOUT_NESTED, semconv.VERIFY_SUCCEEDED, semconv.ERROR_TYPE)
    scan = gym_sidecar_native.scan_traces

    def upb_parse(data: bytes) -> object:
        return ExportTraceServiceRequest.FromString(data)

    def upb_derive(data: bytes) -> object:
        request = ExportTraceServiceRequest.FromString(data)
        out: list[object] = []
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                if ss.scope.name not in scopes:
                    continue
                for span in ss.spans:
                    values: list[Any] = [None] * len(keys)
                    for kv in span.attributes:
                        key = kv.key
                        if key in keys:
                            case = kv.value.WhichOneof("value")
                            scalar = case not in (None, "array_value", "kvlist_value")
                            value = getattr(kv.value, case) if scalar and case else None
                            values[keys.index(key)] = value
                    out.append(
                        (
                            span.name,
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                            span.trace_id,
                            span.span_id,
                            span.status.code,
                            tuple(values),
                        )
                    )
        return out

    def native(data: bytes) -> object:
        return scan(data, 100, 1_000_000, scopes, keys, ResourceBlock, ScopeBlock)

    def native_no_derive(data: bytes) -> object:
        return scan(data, 100, 1_000_000, frozenset(), (), ResourceBlock, ScopeBlock)

    return [upb_parse, upb_derive, native, native_no_derive], scopes, keys


def child(bodies_path: Path, repeats: int) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    bodies = _read_bodies(bodies_path)
    steps, scopes, _ = _steps()
    parsed = [ExportTraceServiceRequest.FromString(b) for b in bodies]
    spans = sum(len(ss.spans) for r in parsed for rs in r.resource_spans for ss in rs.scope_spans)
    derived = sum(
        len(ss.spans)
        for r in parsed
        for rs in r.resource_spans
        for ss in rs.scope_spans
        if ss.scope.name in scopes
    )
    del parsed
    for step in steps:  # warm-up
        for body in bodies:
            step(body)
    best = [float("inf")] * len(steps)
    instrument_on()
    for _ in range(repeats):
        for i, step in enumerate(steps):
            os.getpgrp()
            t0 = time.perf_counter()
            for body in bodies:
                step(body)
            elapsed = time.perf_counter() - t0
            os.getsid(0)
            best[i] = min(best[i], elapsed)
    print(
        json.dumps(
            {
                "spans": spans,
                "derived": derived,
                "bytes": sum(len(b) for b in bodies),
                "ns_per_span": [1e9 * t / spans for t in best],
            }
        ),
        flush=True,
    )


def _run(bodies: Path, callgrind: bool, repeats: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "bench.native_scan", "--child", str(bodies)]
    out_dir = None
    if callgrind:
        out_dir = Path(tempfile.mkdtemp(prefix="cg-native-"))
        env["BENCH_CALLGRIND"] = "1"
        cmd = [*valgrind_command(out_dir), *cmd, "--repeats", "1"]
    else:
        cmd += ["--repeats", str(repeats)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=REPO)
    if done.returncode:
        raise SystemExit(done.stderr[-1500:])
    res: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if out_dir is not None:
        dumps = sorted(out_dir.glob("cg.*.[0-9]*"), key=lambda f: int(f.name.rsplit(".", 1)[1]))
        res["instructions"] = [
            int(m.group(1)) for f in dumps if (m := TOTALS.search(f.read_text()))
        ]
        shutil.rmtree(out_dir, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loads", default="rollouts,derive-heavy")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-callgrind", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(Path(args.child), args.repeats)
        return 0
    try:
        import gym_sidecar_native  # noqa: F401
    except ImportError:
        print("gym_sidecar_native is not installed: uv sync --frozen --group native")
        return 1
    print(f"trace scan per span; load average {os.getloadavg()[0]:.1f}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="native-bodies-"))
    for load in (x for x in args.loads.split(",") if x):
        bodies = tmp / f"{load}.bin"
        _write_bodies(load, bodies)
        wall = _run(bodies, False, args.repeats)
        spans, derived = wall["spans"], wall["derived"]
        print(
            f"  {load}: {spans} spans in 56 requests, {derived} in derived scopes, "
            f"{wall['bytes'] / spans:.0f} bytes per span",
            flush=True,
        )
        cg = None if args.no_callgrind else _run(bodies, True, 1)
        for i, step in enumerate(STEPS):
            line = f"    {step:>26}: {wall['ns_per_span'][i]:7.0f} ns per span"
            if cg is not None:
                total = cg["instructions"][i]
                line += (
                    f", {total / spans:8,.0f} instructions per span"
                    f" ({total / derived:8,.0f} per derived span)"
                )
            print(line, flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
