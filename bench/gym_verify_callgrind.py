"""The agent's cost on a real Gym ``/verify`` in instructions (callgrind) and in process CPU
(pinned, interleaved), from the same child (a benchmark harness; it asserts nothing).

    uv run --frozen python -m bench.gym_verify_callgrind [--variants bare,default,all]
        [--requests 200] [--warmup 200] [--gc on|off|freeze] [--cpu-rounds 5]
        [--cpu-requests 1500] [--core 1] [--no-callgrind] [--no-cpu] [--export queue|sink]

The child (``bench/gym_verify_callgrind_child.py``, run by the cached Gym env's python,
``scripts/gym_env.py install-agent``) serves the real ``example_single_tool_call``
``/verify`` in process through ASGI, bare or with the agent activated with a span-group
spec (``default``: the SERVER span and ``gym.verify`` in ``metrics`` mode; ``all``).

- **Instructions**: each variant once under ``valgrind --tool=callgrind`` with
  ``PYTHONHASHSEED=0``, start-up and warm-up uninstrumented (``--instr-atstart=no``; the
  child switches instrumentation on with ``callgrind_control -i on`` and waits for its
  OK), counters zeroed right before the measured loop and dumped right
  after it (``--zero-before=getpgrp --dump-before=getsid``; the child calls those two
  libc functions around the loop), every thread counted (``--separate-threads=yes``, so
  the main thread's share is printed too). Instructions per request and the ratio to
  bare. The variants run at the same time (instruction counts do not depend on load).
- **Process CPU**: ``--cpu-rounds`` rounds, each running every variant once in a fresh
  process pinned to ``--core`` with ``taskset`` (order rotated per round), process CPU
  (all threads) and main-thread CPU per request over ``--cpu-requests`` after the
  warm-up; medians, ranges, and the median of the per-round ratios to bare.

``--export sink`` exports spans to a counting OTLP sink (production's batch processor)
instead of queueing them unexported (``queue``, the default, as
``bench/gym_verify_inprocess.py`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHILD = REPO / "bench" / "gym_verify_callgrind_child.py"
sys.path.insert(0, str(REPO))

from gym_telemetry_demo.ports import wait_listening  # noqa: E402

from bench.callgrind_support import TOTALS, valgrind_command  # noqa: E402
from bench.gym_verify_throughput import (  # noqa: E402
    BAGGAGE,
    TRACEPARENT,
    gym_python,
    start_sink,
    verify_body,
)


def _opts(args: argparse.Namespace, variant: str, requests: int, export: str) -> str:
    return json.dumps(
        {
            "variant": variant,
            "requests": requests,
            "warmup": args.warmup,
            "gc": args.gc,
            "export": export,
            "body": json.dumps(verify_body()),
            "traceparent": TRACEPARENT,
            "baggage": BAGGAGE,
        }
    )


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["PYTHONHASHSEED"] = "0"
    return env


def callgrind(python: str, variant: str, args: argparse.Namespace, export: str) -> dict[str, Any]:
    """Instructions of the measured loop, per thread, for one variant."""
    out_dir = Path(tempfile.mkdtemp(prefix=f"cg-{variant}-"))
    cmd = [
        *valgrind_command(out_dir, "--separate-threads=yes"),
        python,
        str(CHILD),
        _opts(args, variant, args.requests, export),
    ]
    t0 = time.monotonic()
    done = subprocess.run(
        cmd,
        env=_env() | {"BENCH_CALLGRIND": "1"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=7200,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"callgrind {variant}: {done.stderr.strip()[-1500:]}")
    child = json.loads(done.stdout.strip().splitlines()[-1])
    threads = []
    for f in sorted(out_dir.glob("cg.*.1*")):  # the dump at getsid, one file per thread
        m = TOTALS.search(f.read_text(errors="replace"))
        if m:
            threads.append(int(m.group(1)))
    shutil.rmtree(out_dir, ignore_errors=True)
    if not threads:
        raise SystemExit(f"callgrind {variant}: no dump of the measured loop")
    return {
        "variant": variant,
        "instructions_per_request": sum(threads) / args.requests,
        "main_thread_per_request": threads[0] / args.requests,
        "threads": [t / args.requests for t in threads],
        "gc_collections": child["gc_collections"],
        "seconds": time.monotonic() - t0,
    }


def cpu_run(python: str, variant: str, args: argparse.Namespace, export: str) -> dict[str, Any]:
    cmd = ["taskset", "-c", str(args.core), python, str(CHILD)]
    cmd.append(_opts(args, variant, args.cpu_requests, export))
    done = subprocess.run(
        cmd, env=_env(), cwd="/", capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode:
        raise SystemExit(f"cpu {variant}: {done.stderr.strip()[-1500:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _range(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="bare,default,all")
    p.add_argument("--requests", type=int, default=200, help="requests under callgrind")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--gc", choices=["on", "off", "freeze"], default="on")
    p.add_argument("--cpu-rounds", type=int, default=5)
    p.add_argument("--cpu-requests", type=int, default=1500)
    p.add_argument("--core", type=int, default=1)
    p.add_argument("--no-callgrind", action="store_true")
    p.add_argument("--no-cpu", action="store_true")
    p.add_argument("--export", choices=["queue", "sink"], default="queue")
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if "bare" not in variants:
        variants.insert(0, "bare")
    python = str(gym_python())
    sink = None
    export = "queue"
    if args.export == "sink":
        sink, port = start_sink()
        wait_listening(port, timeout_s=60)
        export = f"sink:127.0.0.1:{port}"
    load0 = os.getloadavg()
    doc: dict[str, Any] = {"args": vars(args) | {"json": str(args.json)}, "load_start": load0}
    print(
        f"Gym /verify in process (example_single_tool_call), gc {args.gc}, export "
        f"{args.export}; load average {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}",
        flush=True,
    )
    try:
        if not args.no_callgrind:
            with ThreadPoolExecutor(len(variants)) as pool:
                cg = list(pool.map(lambda v: callgrind(python, v, args, export), variants))
            doc["callgrind"] = cg
            base = cg[0]["instructions_per_request"]
            base_main = cg[0]["main_thread_per_request"]
            print(f"callgrind, {args.requests} requests after {args.warmup} warm-up:")
            for r in cg:
                print(
                    f"  {r['variant']:>8}: {r['instructions_per_request'] / 1e6:8.3f}M instr/req "
                    f"(x{r['instructions_per_request'] / base:.3f} bare), main thread "
                    f"{r['main_thread_per_request'] / 1e6:8.3f}M "
                    f"(x{r['main_thread_per_request'] / base_main:.3f}), other threads "
                    f"{(r['instructions_per_request'] - r['main_thread_per_request']) / 1e6:.3f}M,"
                    f" gc collections {r['gc_collections']}",
                    flush=True,
                )
        if not args.no_cpu:
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
            for rnd in range(args.cpu_rounds):
                order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
                for v in order:
                    runs[v].append(cpu_run(python, v, args, export))
            doc["cpu"] = runs
            load1 = os.getloadavg()
            print(
                f"process CPU, {args.cpu_rounds} rounds x {args.cpu_requests} requests, pinned "
                f"to core {args.core}, interleaved; load average at end {load1[0]:.1f}:"
            )
            for v in variants:
                cpu = [r["process_cpu_us"] for r in runs[v]]
                main_t = [r["main_thread_cpu_us"] for r in runs[v]]
                ratios = [
                    r["process_cpu_us"] / b["process_cpu_us"]
                    for r, b in zip(runs[v], runs["bare"], strict=True)
                ]
                gcs = runs[v][0]["gc_collections"]
                print(
                    f"  {v:>8}: process {_range(cpu)} us/req, main thread {_range(main_t)}, "
                    f"x{statistics.median(ratios):.3f} bare ({min(ratios):.3f}-{max(ratios):.3f})"
                    f", gc collections {gcs}",
                    flush=True,
                )
    finally:
        if sink is not None:
            sink.terminate()
            sink.wait(timeout=30)
    doc["load_end"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
