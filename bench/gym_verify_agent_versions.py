"""Two versions of the agent on a real NeMo Gym resources server's ``/verify``, one run.

Same servers, client and sink as ``bench/gym_verify_throughput.py`` (whose pieces it
imports), with the agent of the working tree ("after") against another agent source tree
("before", e.g. a ``git archive`` of an older commit), put first on the servers'
``PYTHONPATH`` so that Gym's activation imports it instead of the installed wheel.
Variants, interleaved over rounds:

- ``bare``: no ``GYM_TELEMETRY``;
- ``default_before`` / ``default_after``: the ``default`` preset (the SERVER span);
- ``all_before`` / ``all_after``: every group (SERVER span and ``gym.verify``).

``--gc-freeze`` adds ``bare_gc_frozen`` and ``all_after_gc_frozen``: the same servers
calling ``gc.freeze()`` once started (what Gym itself could do; the agent does not), to
show how much of the cost is the cyclic GC traversing Gym's heap.

Prints per round and as medians: req/s and its ratio to ``bare``, server CPU µs per
request and requests per CPU-second as a ratio to ``bare``, the server's cyclic-GC time
per request (``gc.callbacks``, installed through a ``sitecustomize`` on the servers'
path) and the load average. Only figures of the same run compare.

    git archive <commit> agent/src | tar -x -C /tmp/before
    uv run python bench/gym_verify_agent_versions.py --before /tmp/before/agent/src \\
        [--duration 3] [--rounds 5] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gym_telemetry_demo.ports import wait_listening  # noqa: E402

from bench.gym_verify_throughput import (  # noqa: E402
    SERVER,
    cpu_seconds,
    gym_python,
    measure,
    start_sink,
)
from testkit.gym_stack import GymStack, load_configs  # noqa: E402

# Installed on the servers' path: cyclic-GC time and counts, dumped to a JSON file every 0.5 s.
_GC_PROBE = """
import gc, json, os, threading, time
_path = os.environ.get("BENCH_GC_LOG")
if _path:
    _state = {"gc_s": 0.0, "full_gc": 0, "collections": 0, "cpu_s": 0.0}
    _started = [0.0]
    def _callback(phase, info):
        if phase == "start":
            _started[0] = time.perf_counter()
        else:
            _state["gc_s"] += time.perf_counter() - _started[0]
            _state["collections"] += 1
            _state["full_gc"] += info["generation"] == 2
    gc.callbacks.append(_callback)
    def _dump():
        while True:
            time.sleep(0.5)
            _state["cpu_s"] = time.process_time()
            with open(_path + ".tmp", "w") as fh:
                json.dump(_state, fh)
            os.replace(_path + ".tmp", _path)
    threading.Thread(target=_dump, name="bench-gc-probe", daemon=True).start()
    _freeze_after = float(os.environ.get("BENCH_GC_FREEZE_AFTER_S") or 0)
    if _freeze_after:  # move everything alive after start-up out of the GC's reach
        threading.Timer(_freeze_after, gc.freeze).start()
"""


def _variants(before: Path, gc_freeze: bool, specs: list[str]) -> dict[str, dict[str, str]]:
    on = {"GYM_TELEMETRY": "1"}
    old = {"PYTHONPATH": str(before)}
    variants: dict[str, dict[str, str]] = {"bare": {}}
    for spec in specs:
        label = spec.replace(",", "+")
        variants[f"{label}_before"] = {**on, "GYM_TELEMETRY_SPAN_GROUPS": spec, **old}
        variants[f"{label}_after"] = {**on, "GYM_TELEMETRY_SPAN_GROUPS": spec}
    if gc_freeze:
        last = specs[-1].replace(",", "+")
        frozen = {"BENCH_GC_FREEZE_AFTER_S": str(FREEZE_AFTER_S)}
        variants["bare_gc_frozen"] = frozen
        variants[f"{last}_after_gc_frozen"] = {**variants[f"{last}_after"], **frozen}
    return variants


#: With --gc-freeze: seconds after a server's start when the probe calls gc.freeze().
FREEZE_AFTER_S = 8.0


def _gc_state(path: Path) -> dict[str, float]:
    state: dict[str, float] = json.loads(path.read_text())
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="agent source tree (src)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="add bare and <last spec>_after variants whose servers call gc.freeze() after "
        "start-up",
    )
    parser.add_argument(
        "--groups",
        default="default;all",
        help="span-group specs (GYM_TELEMETRY_SPAN_GROUPS), ';'-separated, each run with the "
        "before and the after agent (default: %(default)s; 'default,verify' is the default "
        "preset with the verify spans the sidecar derives metrics from)",
    )
    parser.add_argument(
        "--simultaneous",
        action="store_true",
        help="measure all variants at the same time in each round (one client each), so "
        "that other load on the machine hits them alike; CPU per request is then the "
        "figure to read",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=5.0,
        help="seconds of no load before and after the rounds over which each server's idle "
        "CPU is measured (0: skip)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="after the rounds, sample each variant's server with py-spy (bench.pyspy) "
        "during one more measurement and print the share of gym_telemetry frames",
    )
    args = parser.parse_args()
    if not (args.before / "gym_telemetry" / "__init__.py").is_file():
        raise SystemExit(f"{args.before}: no gym_telemetry package there")

    python = gym_python()
    workdir = Path(tempfile.mkdtemp(prefix="gym-agent-versions-"))
    probe_dir = workdir / "probe"
    probe_dir.mkdir()
    (probe_dir / "sitecustomize.py").write_text(_GC_PROBE)
    sink, sink_port = start_sink()
    stacks: dict[str, GymStack] = {}
    variants = _variants(args.before.resolve(), args.gc_freeze, args.groups.split(";"))
    load_start = os.getloadavg()
    rows: dict[str, dict[str, list[float]]] = {
        name: {"rps": [], "cpu_us": [], "gc_us": [], "gc_per_kreq": [], "full_per_kreq": []}
        for name in variants
    }
    try:
        wait_listening(sink_port)
        for name, extra in variants.items():
            path = ":".join(p for p in (extra.get("PYTHONPATH"), str(probe_dir)) if p)
            env = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"127.0.0.1:{sink_port}",
                "GYM_TELEMETRY_POLL_INTERVAL_S": "0",
                "BENCH_GC_LOG": str(workdir / f"gc-{name}.json"),
                **extra,
                "PYTHONPATH": path,
            }
            stacks[name] = GymStack(
                python, load_configs("stack.yaml"), [SERVER], env, workdir / name
            ).start()
        urls = {name: stack.url(SERVER) + "/verify" for name, stack in stacks.items()}
        pids = {}
        for name, stack in stacks.items():
            proc = stack.processes[SERVER].proc
            assert proc is not None
            pids[name] = proc.pid
        # first GC probe files written (and, with --gc-freeze, the heap frozen)
        time.sleep(FREEZE_AFTER_S + 1.0 if args.gc_freeze else 1.0)
        idle_start = _idle_cpu(pids, args.idle)
        for round_no in range(args.rounds):
            groups = [list(urls)] if args.simultaneous else [[name] for name in urls]
            for group in groups:
                gc_before = {n: _gc_state(workdir / f"gc-{n}.json") for n in group}
                cpu_before = {n: cpu_seconds(pids[n]) for n in group}
                with ThreadPoolExecutor(len(group)) as pool:
                    futures = {
                        n: pool.submit(measure, urls[n], args.duration, args.concurrency)
                        for n in group
                    }
                    results = {n: f.result() for n, f in futures.items()}
                cpu_used = {n: cpu_seconds(pids[n]) - cpu_before[n] for n in group}
                time.sleep(0.6)  # the probe's next dump covers the whole measurement
                for name in group:
                    result = results[name]
                    gc_after = _gc_state(workdir / f"gc-{name}.json")
                    gc_used = gc_after["gc_s"] - gc_before[name]["gc_s"]
                    if result["errors"]:
                        raise SystemExit(f"{name}: {result['errors']} failed requests")
                    # every request the server answered during the CPU window
                    requests = result.get("total") or result["rps"] * (args.duration + 0.5)
                    row = rows[name]
                    row["rps"].append(result["rps"])
                    row["cpu_us"].append(1e6 * cpu_used[name] / requests)
                    row["gc_us"].append(1e6 * gc_used / requests)
                    collections = gc_after["collections"] - gc_before[name]["collections"]
                    row["gc_per_kreq"].append(1e3 * collections / requests)
                    row["full_per_kreq"].append(
                        1e3 * (gc_after["full_gc"] - gc_before[name]["full_gc"]) / requests
                    )
                    print(
                        f"round {round_no + 1} {name:>15}: {result['rps']:7.1f} req/s "
                        f"{row['cpu_us'][-1]:6.0f} CPU-us/req {row['gc_us'][-1]:5.0f} GC-us/req "
                        f"(load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
        idle_end = _idle_cpu(pids, args.idle)
        if args.profile:
            _profile(args.profile, urls, pids, args.duration, args.concurrency)
    finally:
        for stack in stacks.values():
            stack.stop()
        sink.terminate()
        sink.communicate(timeout=30)
    load_end = os.getloadavg()
    med = {name: {k: statistics.median(v) for k, v in row.items()} for name, row in rows.items()}
    bare = med["bare"]
    print(
        f"\n/verify of {SERVER}, {args.concurrency} connections, "
        f"{args.rounds} x {args.duration:g}s per variant (medians); load average "
        f"{load_start[0]:.1f}/{load_start[1]:.1f} at start, {load_end[0]:.1f}/{load_end[1]:.1f} "
        "at end (1/5 min):"
    )
    for name, m in med.items():
        print(
            f"  {name:>15}: {m['rps']:7.1f} req/s (ratio {m['rps'] / bare['rps']:.3f})  "
            f"{m['cpu_us']:6.0f} CPU-us/req (req per CPU-second, ratio to bare "
            f"{bare['cpu_us'] / m['cpu_us']:.3f})  {m['gc_us']:5.0f} GC-us/req, collections "
            f"per 1000 req {m['gc_per_kreq']:5.0f} (full {m['full_per_kreq']:.1f})"
        )
    if args.idle:
        print(f"\nserver CPU while idle (no requests, {args.idle:g} s, all at once), ms per s:")
        for name in variants:
            print(f"  {name:>15}: {idle_start[name]:6.2f} at start, {idle_end[name]:6.2f} at end")
    # Per-round ratios: each variant against bare of the same round (interleaved).
    print("\nper-round ratios to bare of the same round: min / median / max")
    for name, row in rows.items():
        if name == "bare":
            continue
        rps = [r / b for r, b in zip(row["rps"], rows["bare"]["rps"], strict=True)]
        cpu = [b / c for c, b in zip(row["cpu_us"], rows["bare"]["cpu_us"], strict=True)]
        print(
            f"  {name:>15}: req/s {min(rps):.3f} / {statistics.median(rps):.3f} / "
            f"{max(rps):.3f}   req per CPU-second {min(cpu):.3f} / "
            f"{statistics.median(cpu):.3f} / {max(cpu):.3f}"
        )


def _idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each server's CPU ms per second over ``seconds`` with no requests, all measured
    over the same window (background threads: export worker, gRPC, Gym's own)."""
    if not seconds:
        return {name: 0.0 for name in pids}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: 1e3 * (cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}


#: Frames of the agent's own work (not the layers that only wrap Gym's handling), in
#: this tree's layout and in the one before the lean path moved to ``_lean/`` (older
#: agents compared side by side).
_AGENT_WORK = (
    "gym_telemetry/_lean/",
    "gym_telemetry/recording.py",
    "gym_telemetry/_export/",
    "gym_telemetry/autoinstrument/propagation.py",
    "_finish (gym_telemetry/autoinstrument/server_span.py",
    "start (gym_telemetry/_engine.py",
    "finish (gym_telemetry/_engine.py",
    "_end (gym_telemetry/_engine.py",
    "start (gym_telemetry/endpoints.py",
    "finish (gym_telemetry/endpoints.py",
    "_end (gym_telemetry/endpoints.py",
)


def _profile(
    out: Path, urls: dict[str, str], pids: dict[str, int], duration: float, concurrency: int
) -> None:
    """One more measurement per variant under py-spy (Python frames, not pausing the
    server): the share of samples in the agent's own work (``_AGENT_WORK``: recording,
    encoding, export, header parsing; not the wrappers' frames around Gym's handling)
    and its top frames."""
    from bench import pyspy

    print("\npy-spy, one more measurement per variant (share of samples):")
    for name, url in urls.items():
        path = out / f"{name}.folded"
        spy = pyspy.start(pids[name], duration, path)
        measure(url, duration, concurrency)
        spy.wait(timeout=60)
        if not path.is_file():
            print(f"  {name}: no profile (py-spy needs ptrace rights)")
            continue
        total = agent = 0
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if count.isdigit():
                total += int(count)
                if any(m in stack for m in _AGENT_WORK):
                    agent += int(count)
        _, frames = pyspy.top_frames(path, top=5, match=_AGENT_WORK)
        print(f"  {name}: {total} samples, agent's own work {100.0 * agent / max(total, 1):.1f}%")
        for pct, frame in frames:
            print(f"      {pct:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
