"""The agent's cost on a real Gym ``/verify`` in instructions (callgrind) and in process CPU
(pinned, interleaved), from the same child (a benchmark harness; it asserts nothing).

    uv run --frozen python -m bench.gym_verify_callgrind [--variants bare,default,all]
        [--requests 200] [--warmup 200] [--gc on|pending|off|freeze] [--cpu-rounds 5]
        [--cpu-requests 1500] [--core 1] [--no-callgrind] [--no-cpu]
        [--export queue|sink|both] [--before AGENT_SRC] [--profile] [--garbage] [--cache-sim]
        [--keep-dumps DIR] [--fixed-ids] [--agent AGENT_SRC] [--live-clock-x K] [--json FILE]

The child (``bench/gym_verify_callgrind_child.py``, run by the cached Gym env's python)
serves the real ``example_single_tool_call`` ``/verify`` in process through ASGI, bare or
with the agent activated with a span-group spec (``default``: the SERVER span and
``gym.verify`` in ``metrics`` mode; ``all``; ``none``: activated, nothing recorded), or
``fastapi-builtin`` (no agent, a global SDK provider set: FastAPI's own telemetry on).

Which agent runs: this tree's ``agent/src`` and ``semconv/src``, first on the child's
``PYTHONPATH`` (the Gym env is shared and is not reinstalled). ``--before SRC`` adds, for
every agent variant ``V``, a variant ``V@before`` running the agent source tree ``SRC``
(e.g. ``git archive <commit> agent/src | tar -x -C /tmp/before`` and
``--before /tmp/before/agent/src``) in the same run; ``--agent SRC`` runs the other
variants from the source tree ``SRC`` instead of this tree's (a snapshot, so that the tree
can change while a run is under way).

- **Hash seed** (``--hash-seed N``, default 0): every child's ``PYTHONHASHSEED``. Dict
  layouts and the order of allocations move with it, and with them the collisions in
  CPython's method cache, so a figure moves by a few thousand instructions per request
  from seed to seed (docs/benchmarks.md): run several seeds to see the spread.
- **Instructions**: each variant once under ``valgrind --tool=callgrind`` with
  ``PYTHONHASHSEED`` fixed, start-up and warm-up uninstrumented (``--instr-atstart=no``; the
  child switches instrumentation on with ``callgrind_control -i on`` and waits for its
  OK), counters zeroed right before the measured loop and dumped right
  after it (``--zero-before=getpgrp --dump-before=getsid``; the child calls those two
  libc functions around the loop), every thread counted (``--separate-threads=yes``;
  ``callgrind_support.window_events``: a function-triggered dump holds the calling
  thread only, so the other threads are read from the dump at exit, which covers them
  from the moment instrumentation was switched on, right before the window, to the
  exit right after it). Instructions per request and the ratio to
  bare. The variants run at the same time (instruction counts do not depend on load).
- **Export** (``--export``): ``queue`` keeps the loop's spans queued and never exported
  (what the agent costs the request path alone); ``sink`` exports them over OTLP/gRPC to
  a counting sink process with the production batch processor, the flush of the loop's
  spans *inside* the measured window (the batch thread's encoding and the gRPC export
  are counted, on their own threads): what the agent costs the process. ``both`` runs
  every agent variant both ways (``V`` and ``V+export``).
- **Live events** (issue 41): the activated agent sends one OTLP-logs request (the
  heartbeat) every ``GYM_TELEMETRY_LIVE_INTERVAL_S`` (2 s) of wall clock, whatever the
  requests; the child reports how many it sent in the window. Under callgrind a request
  takes ~50x its native wall time, so as shipped the window holds ~50x the heartbeats
  per request that a native run does. ``--live-clock-x K`` multiplies the live-event and
  lag-probe intervals by ``K`` under callgrind only (``K`` = the callgrind wall time per
  request ÷ the native one, both printed), so the heartbeats cost per request what they
  cost natively; the default ``1`` runs them as shipped.
- **Caches** (``--cache-sim``): the same runs with callgrind's cache simulation: L1 and
  last-level misses per request and cycles estimated from them
  (``callgrind_support.estimated_cycles``): what a larger heap, the cyclic GC's
  traversals and allocation add in cycles that an instruction count does not show, as a
  model free of the machine's noise.
- **Process CPU**: ``--cpu-rounds`` rounds, each running every variant once in a fresh
  process pinned to ``--core`` with ``taskset`` (order rotated per round), process CPU
  (all threads) and main-thread CPU per request over ``--cpu-requests`` after the
  warm-up; medians, ranges, and the median of the per-round ratios to bare.
- **Garbage** (``--garbage``): natively, the objects ``--requests`` requests leave to
  the cyclic GC (unreachable but for reference cycles: ``gc.DEBUG_SAVEALL`` with the
  collector off, then one collection), per request and type, the differences from bare,
  the names of the tasks among them, and the growth of the generation-0 count
  that paces the collections.
- **Profile** (``--profile``): natively, the bytecodes executed and calls made per
  Python function on the loop's main thread, per request
  (``callgrind_support.OpcodeProfile``), and the functions whose counts differ most from
  bare: where an agent's instructions go, function by function.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHILD = REPO / "bench" / "gym_verify_callgrind_child.py"
sys.path.insert(0, str(REPO))

from gym_telemetry_demo.ports import wait_listening  # noqa: E402
from gym_telemetry_demo.stopsignals import run_main  # noqa: E402

from bench.callgrind_support import (  # noqa: E402
    agent_path,
    estimated_cycles,
    gym_env_python,
    live_clock_env,
    print_profile_diff,
    valgrind_command,
    window_events,
)
from bench.gym_verify_throughput import (  # noqa: E402
    BAGGAGE,
    TRACEPARENT,
    start_sink,
    verify_body,
)


@dataclass(frozen=True)
class Variant:
    """One measured configuration: a span-group spec (``bare``: no agent), the agent
    source tree on the path, and where spans go (``queue`` or ``sink:HOST:PORT``)."""

    name: str
    spec: str
    agent_src: str | None
    export: str
    hash_seed: int = 0


def _opts(
    args: argparse.Namespace,
    v: Variant,
    requests: int,
    profile: bool = False,
    garbage: bool = False,
) -> str:
    return json.dumps(
        {
            "variant": v.spec,
            "requests": requests,
            "warmup": args.warmup,
            "gc": args.gc,
            "export": v.export,
            "body": json.dumps(verify_body()),
            "traceparent": TRACEPARENT,
            "baggage": BAGGAGE,
            "profile": profile,
            "garbage": garbage,
            "vary_ids": not args.fixed_ids,
        }
    )


def _env(v: Variant) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = agent_path(v.agent_src)
    env["PYTHONHASHSEED"] = str(v.hash_seed)
    return env


def _last_json(stdout: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


def callgrind(python: str, v: Variant, args: argparse.Namespace) -> dict[str, Any]:
    """Instructions of the measured loop, per thread, for one variant."""
    out_dir = Path(tempfile.mkdtemp(prefix=f"cg-{v.name.replace('@', '-')}-"))
    cmd = [
        *valgrind_command(
            out_dir, "--separate-threads=yes", *(["--cache-sim=yes"] if args.cache_sim else [])
        ),
        python,
        str(CHILD),
        _opts(args, v, args.requests),
    ]
    t0 = time.monotonic()
    live_env = live_clock_env(args.live_clock_x)  # heartbeats per request as natively
    child = _child_json("callgrind", cmd, v, {"BENCH_CALLGRIND": "1", **live_env}, timeout_s=7200)
    events = window_events(out_dir)
    threads = [e.get("Ir", 0) for e in events]
    if args.keep_dumps is not None:  # for callgrind_annotate: the window is cg.<pid>.1-01
        args.keep_dumps.mkdir(parents=True, exist_ok=True)
        shutil.move(str(out_dir), args.keep_dumps / v.name.replace("@", "-"))
    else:
        shutil.rmtree(out_dir, ignore_errors=True)
    if not threads:
        raise SystemExit(f"callgrind {v.name}: no dump of the measured loop")
    return {
        "variant": v.name,
        "agent": child.get("agent"),
        "instructions_per_request": sum(threads) / args.requests,
        # every event summed over the threads, per request (cache misses with --cache-sim)
        "events_per_request": {
            name: sum(e.get(name, 0) for e in events) / args.requests for name in events[0]
        },
        "main_thread_per_request": threads[0] / args.requests,
        "threads": [t / args.requests for t in threads],
        "gc_collections": child["gc_collections"],
        "lean": child.get("lean"),
        "live_requests": child.get("live_requests", 0),
        "wall_us": child.get("wall_us"),
        "seconds": time.monotonic() - t0,
    }


def _child_json(
    what: str,
    cmd: list[str],
    v: Variant,
    extra_env: dict[str, str] | None = None,
    timeout_s: float = 1800,
) -> dict[str, Any]:
    """Run the child ``cmd`` for variant ``v`` (its environment plus ``extra_env``) and
    return the last JSON line it printed; exit naming ``what`` and the end of its stderr
    when it fails."""
    done = subprocess.run(
        cmd,
        env=_env(v) | (extra_env or {}),
        cwd="/",
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"{what} {v.name}: {done.stderr.strip()[-1500:]}")
    return _last_json(done.stdout)


def cpu_run(python: str, v: Variant, args: argparse.Namespace) -> dict[str, Any]:
    cmd = ["taskset", "-c", str(args.core), python, str(CHILD)]
    cmd.append(_opts(args, v, args.cpu_requests))
    return _child_json("cpu", cmd, v)


def profile_run(python: str, v: Variant, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [python, str(CHILD), _opts(args, v, args.requests, profile=True)]
    profile: dict[str, Any] = _child_json("profile", cmd, v)["profile"]
    return profile


def garbage_run(python: str, v: Variant, args: argparse.Namespace) -> dict[str, Any]:
    """What the requests leave to the cyclic GC, natively (the child's ``garbage``)."""
    cmd = [python, str(CHILD), _opts(args, v, args.requests, garbage=True)]
    return _child_json("garbage", cmd, v)


def print_garbage(census: dict[str, dict[str, Any]]) -> None:
    """Each variant's per-request garbage and its types' differences from bare."""
    bare = census["bare"]["by_type"]
    for name, c in census.items():
        print(
            f"  {name:>16}: unreachable {c['unreachable_per_request']:.2f} per request, "
            f"generation-0 count +{c['gen0_growth_per_request']:.2f}; tasks {c['tasks']}"
        )
        if name == "bare":
            continue
        for kind in sorted(set(bare) | set(c["by_type"])):
            diff = c["by_type"].get(kind, 0.0) - bare.get(kind, 0.0)
            if abs(diff) >= 0.005:
                print(f"{'':20}{diff:+6.2f} {kind}")


def _range(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} ({min(values):.1f}-{max(values):.1f})"


def build_variants(args: argparse.Namespace, sink: str | None) -> list[Variant]:
    specs = [v for v in args.variants.split(",") if v and v != "bare"]
    exports = {"queue": ["queue"], "sink": ["sink"], "both": ["queue", "sink"]}[args.export]
    trees: list[tuple[str, str | None]] = [("", str(args.agent.resolve()) if args.agent else None)]
    if args.before:
        trees.append(("@before", str(args.before.resolve())))
    seed = args.hash_seed
    out = [Variant("bare", "bare", None, "queue", seed)]
    if "fastapi-builtin" in specs:  # no agent: one variant, whatever the trees and exports
        specs.remove("fastapi-builtin")
        out.append(Variant("fastapi-builtin", "fastapi-builtin", None, "queue", seed))
    for spec in specs:
        for suffix, src in trees:
            for export in exports:
                tag = "+export" if export == "sink" and args.export == "both" else ""
                target = export if export == "queue" else str(sink)
                out.append(Variant(f"{spec}{tag}{suffix}", spec, src, target, seed))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="bare,default,all")
    p.add_argument("--requests", type=int, default=200, help="requests under callgrind")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--gc", choices=["on", "pending", "off", "freeze"], default="on")
    p.add_argument("--cpu-rounds", type=int, default=5)
    p.add_argument("--cpu-requests", type=int, default=1500)
    p.add_argument("--core", type=int, default=1)
    p.add_argument("--no-callgrind", action="store_true")
    p.add_argument("--no-cpu", action="store_true")
    p.add_argument("--export", choices=["queue", "sink", "both"], default="sink")
    p.add_argument("--before", type=Path, help="another agent source tree (module doc)")
    p.add_argument(
        "--agent",
        type=Path,
        help="the agent source tree of the other variants (default: this tree's)",
    )
    p.add_argument(
        "--fixed-ids",
        action="store_true",
        help="the same traceparent and rollout baggage on every request (the child's vary_ids)",
    )
    p.add_argument("--profile", action="store_true", help="bytecodes per function (module doc)")
    p.add_argument("--profile-top", type=int, default=40)
    p.add_argument(
        "--garbage",
        action="store_true",
        help="what the requests leave to the cyclic GC, per type (module doc)",
    )
    p.add_argument(
        "--cache-sim",
        action="store_true",
        help="simulate the caches too (--cache-sim=yes): L1 and last-level misses and "
        "estimated cycles per request (module doc)",
    )
    p.add_argument(
        "--keep-dumps",
        type=Path,
        help="keep each variant's callgrind files in DIR/<variant> (the function view: "
        "callgrind_annotate DIR/<variant>/cg.<pid>.1-01)",
    )
    p.add_argument(
        "--live-clock-x",
        type=float,
        default=1.0,
        help="under callgrind, the live-event and lag-probe intervals times K (module doc)",
    )
    p.add_argument(
        "--hash-seed",
        type=int,
        default=0,
        help="PYTHONHASHSEED of every child (module doc: the figures move with it)",
    )
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args(argv)
    python = str(gym_env_python())
    sink = None
    target = None
    if args.export != "queue":
        sink, port = start_sink()
        wait_listening(port, timeout_s=60)
        target = f"sink:127.0.0.1:{port}"
    variants = build_variants(args, target)
    load0 = os.getloadavg()
    doc: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "load_start": load0,
    }
    print(
        f"Gym /verify in process (example_single_tool_call), gc {args.gc}, export "
        f"{args.export}; load average {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}",
        flush=True,
    )
    try:
        if args.profile:
            profiles = {v.name: profile_run(python, v, args) for v in variants}
            doc["profile"] = profiles
            print("bytecodes and calls per request, main thread, against bare:")
            for name, prof in profiles.items():
                if name != "bare":
                    print(f"  {name}:")
                    print_profile_diff(profiles["bare"], prof, args.profile_top, "request")
        if args.garbage:
            census = {v.name: garbage_run(python, v, args) for v in variants}
            doc["garbage"] = census
            print(f"left to the cyclic GC, {args.requests} requests (natively, GC off):")
            print_garbage(census)
        if not args.no_callgrind:
            with ThreadPoolExecutor(len(variants)) as pool:
                cg = list(pool.map(lambda v: callgrind(python, v, args), variants))
            doc["callgrind"] = cg
            base = cg[0]["instructions_per_request"]
            base_main = cg[0]["main_thread_per_request"]
            print(
                f"callgrind, {args.requests} requests after {args.warmup} warm-up "
                f"(load average now {os.getloadavg()[0]:.1f}):"
            )
            for r in cg:
                other = r["instructions_per_request"] - r["main_thread_per_request"]
                print(
                    f"  {r['variant']:>16}: {r['instructions_per_request'] / 1e6:8.3f}M instr/req "
                    f"(x{r['instructions_per_request'] / base:.3f} bare), main thread "
                    f"{r['main_thread_per_request'] / 1e6:8.3f}M "
                    f"(x{r['main_thread_per_request'] / base_main:.3f}), other threads "
                    f"{other / 1e6:.3f}M, gc collections {r['gc_collections']}, lean {r['lean']}",
                    flush=True,
                )
                print(
                    f"  {'':>16}  wall {r['wall_us'] / 1e3:.1f} ms per request under callgrind; "
                    f"live-event requests in the window {r['live_requests']} (intervals "
                    f"x{args.live_clock_x:g})",
                    flush=True,
                )
            if args.cache_sim:
                print("simulated caches, per request (all threads):")
                base_cycles = estimated_cycles(cg[0]["events_per_request"])
                for r in cg:
                    ev = r["events_per_request"]
                    l1 = ev.get("I1mr", 0) + ev.get("D1mr", 0) + ev.get("D1mw", 0)
                    ll = ev.get("ILmr", 0) + ev.get("DLmr", 0) + ev.get("DLmw", 0)
                    cycles = estimated_cycles(ev)
                    print(
                        f"  {r['variant']:>16}: L1 misses {l1 / 1e3:8.1f}k, last-level misses "
                        f"{ll / 1e3:7.2f}k, estimated cycles {cycles / 1e6:8.3f}M "
                        f"(x{cycles / base_cycles:.3f} bare)",
                        flush=True,
                    )
        if not args.no_cpu:
            runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
            for rnd in range(args.cpu_rounds):
                order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
                for v in order:
                    runs[v.name].append(cpu_run(python, v, args))
            doc["cpu"] = runs
            load1 = os.getloadavg()
            print(
                f"process CPU, {args.cpu_rounds} rounds x {args.cpu_requests} requests, pinned "
                f"to core {args.core}, interleaved; load average at end {load1[0]:.1f}:"
            )
            for v in variants:
                cpu = [r["process_cpu_us"] for r in runs[v.name]]
                main_t = [r["main_thread_cpu_us"] for r in runs[v.name]]
                ratios = [
                    r["process_cpu_us"] / b["process_cpu_us"]
                    for r, b in zip(runs[v.name], runs["bare"], strict=True)
                ]
                gcs = runs[v.name][0]["gc_collections"]
                print(
                    f"  {v.name:>16}: process {_range(cpu)} us/req, main thread {_range(main_t)}"
                    f", x{statistics.median(ratios):.3f} bare ({min(ratios):.3f}-"
                    f"{max(ratios):.3f}), gc collections {gcs}",
                    flush=True,
                )
                print(
                    f"  {'':>16}  user {_range([r['user_us'] for r in runs[v.name]])}, "
                    f"system {_range([r['system_us'] for r in runs[v.name]])} us/req; per "
                    f"run: minor faults {_range([r['minor_faults'] for r in runs[v.name]])}, "
                    "context switches voluntary "
                    f"{_range([r['voluntary_switches'] for r in runs[v.name]])}, involuntary "
                    f"{_range([r['involuntary_switches'] for r in runs[v.name]])}",
                    flush=True,
                )
    finally:
        if sink is not None:
            sink.terminate()
            out, _err = sink.communicate(timeout=30)
            received = out.strip().splitlines()[-1] if out.strip() else ""
            doc["sink"] = received
            print(f"sink: {received}")
    doc["load_end"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
