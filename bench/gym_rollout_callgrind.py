"""The agent's cost on whole Gym rollouts: instructions (callgrind) and process CPU summed
over the three real server processes a rollout crosses (a benchmark harness; it asserts
nothing).

    uv run --frozen python -m bench.gym_rollout_callgrind [--variants bare,default,all]
        [--rollouts 50] [--warmup 10] [--before AGENT_SRC] [--agent AGENT_SRC] [--cpu-rounds 0]
        [--cpu-rollouts 200] [--core 1] [--no-callgrind] [--profile] [--keep-dumps DIR]
        [--live-clock-x K] [--json FILE]

What runs: the stub model (``examples/gym_stack``), the shipped
``example_single_tool_call`` resources server and the shipped ``simple_agent``, each its
own ``python app.py`` process started the way Gym's launcher starts it
(``testkit.gym_stack.GymStack``), bare or with the agent activated by ``GYM_TELEMETRY=1``
and a span-group spec, exporting OTLP/gRPC to a counting sink process. The harness
drives ``--rollouts`` agent ``/run`` requests one after the other (no caller trace
context, as a trainer without one sends them); each is a whole rollout: the agent's
``/run`` and its own ``/v1/responses``, two model calls, ``/seed_session``,
``/get_weather`` and ``/verify`` on the resources server (7 requests served, 6 HTTP hops
made by the agent).

Why three processes and not three apps in one process: that is what a Gym fleet pays. Each
server has its own interpreter, heap, cyclic GC and export thread, and every hop goes
through aiohttp and uvicorn; in one process the hops would bypass the HTTP client and
server (part of the bare cost, and where the agent injects and reads trace context) and
one heap and one batch queue would be shared, so neither the denominator nor the agent's
own work would be the fleet's.

How the window is bracketed in each server: ``bench/callgrind_support.py`` and a
``sitecustomize`` (``PROBE``) go first on the servers' ``PYTHONPATH``; the probe
installs two signal handlers. ``SIGUSR1``, after the warm-up rollouts: flush the spans
recorded so far (they are exported before the window), ``gc.collect()``, switch
callgrind's instrumentation on (start-up and warm-up ran uninstrumented) and zero the
counters (``os.getpgrp()``; ``--zero-before=getpgrp``). ``SIGUSR2``, after the measured
rollouts: flush the window's spans (encoded and exported over gRPC inside the window),
dump the main thread (``os.getsid(0)``; ``--dump-before=getsid``), then dump every thread
(``callgrind_control -d``: the batch worker's and gRPC's threads, counted from the moment
instrumentation was switched on). Per server the probe also writes the window's process
CPU, main-thread CPU and cyclic-GC collections.

**The live events are paced by the wall clock, not by the rollouts** (issue 41: one
OTLP-logs request per process every ``GYM_TELEMETRY_LIVE_INTERVAL_S``, default 2 s, and
an event-loop lag probe tick every 0.5 s). Under callgrind a rollout takes ~50x its
native wall time, so as shipped the window holds ~50x more heartbeats per rollout than a
native run does, and their instructions are charged to the rollouts ~50x over (the
window's count of live requests is printed; it also grows with the machine's load,
which slows callgrind further). ``--live-clock-x K`` multiplies both intervals by ``K``
for the agent variants under callgrind only (``K`` = the callgrind window per rollout ÷
the native one, both printed: the callgrind table and ``--cpu-rounds``), so that the
live events cost per rollout what they cost natively; the default ``1`` runs them as
shipped. Natively (``--cpu-rounds``, ``--profile``) they always run as shipped.

Reported: instructions per rollout per server and summed over the three, the ratio to
bare, and with ``--cpu-rounds N`` the same window's process CPU per rollout natively
(all three servers pinned to ``--core`` with ``taskset``, variants interleaved per round,
fresh processes each time). ``--profile`` runs every variant natively once more with
``callgrind_support.OpcodeProfile`` on each server's main thread over the window and
prints, per server, the functions whose bytecode counts differ most from bare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gym_telemetry_demo.ports import wait_listening  # noqa: E402
from gym_telemetry_demo.stopsignals import run_main  # noqa: E402

from bench.callgrind_support import (  # noqa: E402
    TOTALS,
    agent_path,
    gym_env_python,
    live_clock_env,
    print_profile_diff,
    valgrind_command,
)
from bench.gym_verify_throughput import start_sink  # noqa: E402
from testkit.gym_stack import (  # noqa: E402
    AGENT,
    MODEL,
    RESOURCES,
    GymStack,
    load_configs,
    post_json,
    run_body,
)

SERVERS = (MODEL, RESOURCES, AGENT)
#: Column labels of the servers (their config names share a long prefix).
LABELS = {MODEL: "model", RESOURCES: "resources", AGENT: "agent"}

#: The servers' ``sitecustomize``: the window's signal handlers (module doc).
PROBE = r"""
import os

if os.environ.get("BENCH_ROLLOUT_PROBE"):
    import gc
    import json
    import signal
    import subprocess
    import sys
    import time

    from callgrind_support import (
        OpcodeProfile,
        instrument_on,
        kernel_counters,
        live_requests_sent,
        rusage,
    )

    _out = os.environ["BENCH_ROLLOUT_PROBE"]
    _profile = OpcodeProfile() if os.environ.get("BENCH_PROBE_PROFILE") == "1" else None
    _name = os.environ.get("NEMO_GYM_CONFIG_PATH") or str(os.getpid())
    _state = {}

    def _flush():
        trace = sys.modules.get("opentelemetry.trace")
        if trace is None:
            return
        flush = getattr(trace.get_tracer_provider(), "force_flush", None)
        if flush is not None:
            flush(60000)

    def _write(suffix, text):
        tmp = os.path.join(_out, f"{_name}.{suffix}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(_out, f"{_name}.{suffix}"))

    def _zero(signum, frame):
        _flush()
        gc.collect()
        instrument_on()
        _state["gc"] = [s["collections"] for s in gc.get_stats()]
        _state["cpu"] = time.process_time()
        _state["rusage"] = rusage()
        _state["thread"] = time.thread_time()
        _state["live"] = live_requests_sent()
        os.getpgrp()  # callgrind: --zero-before=getpgrp
        if _profile is not None:
            _profile.start()
        _write("zeroed", "1")

    def _dump(signum, frame):
        _flush()
        if _profile is not None:
            _profile.stop()
        os.getsid(0)  # callgrind: --dump-before=getsid (this thread)
        cpu, thread = time.process_time(), time.thread_time()
        kernel = kernel_counters(_state["rusage"], rusage())
        gcs = [s["collections"] for s in gc.get_stats()]
        if os.environ.get("BENCH_CALLGRIND") == "1":  # every thread
            subprocess.run(
                ["callgrind_control", "-d", str(os.getpid())], capture_output=True, timeout=600
            )
        agent = sys.modules.get("gym_telemetry")
        _write(
            "json",
            json.dumps(
                {
                    "process_cpu_s": cpu - _state["cpu"],
                    "main_thread_cpu_s": thread - _state["thread"],
                    **kernel,
                    "gc_collections": [b - a for a, b in zip(_state["gc"], gcs)],
                    "agent": getattr(agent, "__file__", None),
                    # live-event requests sent in the window (one per interval: their
                    # cost follows the window's wall time, not the rollouts)
                    "live_requests": live_requests_sent() - _state["live"],
                    "profile": _profile.result(1) if _profile is not None else None,
                }
            ),
        )

    signal.signal(signal.SIGUSR1, _zero)
    signal.signal(signal.SIGUSR2, _dump)
"""


def _launcher(work: Path, python: str, prefix: list[str]) -> Path:
    """A ``python`` for ``GymStack``: runs server scripts under ``prefix`` (valgrind,
    taskset), and Gym's config resolution (``python -c``) plainly."""
    script = work / "python"
    quoted = " ".join(f"'{p}'" for p in prefix)
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-c" ]; then exec \'{python}\' "$@"; fi\n'
        f"exec {quoted} '{python}' \"$@\"\n"
    )
    script.chmod(0o755)
    return script


def _probe_dir(work: Path) -> Path:
    probe = work / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE)
    shutil.copy(REPO / "bench" / "callgrind_support.py", probe / "callgrind_support.py")
    return probe


def _wait_files(paths: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            missing = [p.name for p in paths if not p.exists()]
            raise SystemExit(f"servers did not answer the probe signal: {missing}")
        time.sleep(0.2)


def _rollouts(stack: GymStack, first: int, count: int, timeout_s: float) -> None:
    url = stack.url(AGENT) + "/run"
    for i in range(first, first + count):
        status, body = post_json(url, run_body(i, 0), timeout_s=timeout_s)
        if status != 200 or not isinstance(body, dict) or body.get("reward") != 1.0:
            raise SystemExit(f"rollout {i}: HTTP {status}: {str(body)[:500]}")


def run_variant(
    python: str,
    variant: str,
    agent_src: str | None,
    args: argparse.Namespace,
    sink: str | None,
    *,
    mode: str,
    rollouts: int,
) -> dict[str, Any]:
    """One variant's three servers, warm-up, window and figures (module doc). ``mode``:
    ``callgrind`` (instructions), ``cpu`` (natively, pinned) or ``profile`` (natively,
    bytecodes per function)."""
    under_callgrind = mode == "callgrind"
    work = Path(tempfile.mkdtemp(prefix=f"rollout-{variant.replace('@', '-')}-"))
    out = work / "out"
    out.mkdir()
    probe = _probe_dir(work)
    if under_callgrind:
        prefix = valgrind_command(out, "--separate-threads=yes")
        prefix[-1] = f"--callgrind-out-file={out}/cg.%q{{NEMO_GYM_CONFIG_PATH}}.%p"
    elif mode == "cpu":
        prefix = ["taskset", "-c", str(args.core)]
    else:
        prefix = []
    env = {
        "PYTHONPATH": os.pathsep.join([str(probe), agent_path(agent_src)]),
        "PYTHONHASHSEED": "0",
        "BENCH_ROLLOUT_PROBE": str(out),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    if under_callgrind:
        env["BENCH_CALLGRIND"] = "1"
    if mode == "profile":
        env["BENCH_PROBE_PROFILE"] = "1"
    if variant != "bare":
        env |= {
            "GYM_TELEMETRY": "1",
            "GYM_TELEMETRY_SPAN_GROUPS": variant.split("@", maxsplit=1)[0],
            "GYM_TELEMETRY_POLL_INTERVAL_S": "0",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{sink}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            # Batches leave when full (512 spans) or at the window's flushes, as on a busy
            # server; not on the schedule's clock, which under callgrind would tick ~50x
            # more often per rollout.
            "OTEL_BSP_SCHEDULE_DELAY": "100000000",
        }
        if under_callgrind:
            # the live events at the rate per rollout a native run pays (module doc)
            env |= live_clock_env(args.live_clock_x)
    stack = GymStack(
        python=_launcher(work, python, prefix),
        config=load_configs("stack.yaml"),
        start_names=list(SERVERS),
        env=env,
        workdir=work / "gym",
    )
    scale = 60.0 if under_callgrind else 1.0
    t0 = time.monotonic()
    try:
        stack.start(timeout_s=120 * scale)
        _rollouts(stack, 0, args.warmup, timeout_s=60 * scale)
        for name in SERVERS:
            proc = stack.processes[name].proc
            assert proc is not None
            proc.send_signal(signal.SIGUSR1)
        _wait_files([out / f"{n}.zeroed" for n in SERVERS], 60 * scale)
        t1 = time.monotonic()
        _rollouts(stack, args.warmup, rollouts, timeout_s=60 * scale)
        window_s = time.monotonic() - t1
        for name in SERVERS:
            proc = stack.processes[name].proc
            assert proc is not None
            proc.send_signal(signal.SIGUSR2)
        _wait_files([out / f"{n}.json" for n in SERVERS], 60 * scale)
    except BaseException:
        for name, process in stack.processes.items():
            tail = process.log_path.read_text(errors="replace")[-1500:]
            print(f"--- {variant} {name} log:\n{tail}", file=sys.stderr)
        raise
    finally:
        stack.stop()
    result: dict[str, Any] = {
        "variant": variant,
        "rollouts": rollouts,
        "window_s": window_s,
        "seconds": time.monotonic() - t0,
        "servers": {},
    }
    for name in SERVERS:
        probe_out = json.loads((out / f"{name}.json").read_text())
        server: dict[str, Any] = {
            "process_cpu_us": 1e6 * probe_out["process_cpu_s"] / rollouts,
            "main_thread_cpu_us": 1e6 * probe_out["main_thread_cpu_s"] / rollouts,
            "user_us": 1e6 * probe_out["user_s"] / rollouts,
            "system_us": 1e6 * probe_out["system_s"] / rollouts,
            "switches_per_rollout": (
                probe_out["voluntary_switches"] + probe_out["involuntary_switches"]
            )
            / rollouts,
            "gc_collections": probe_out["gc_collections"],
            "live_requests": probe_out.get("live_requests", 0),
            "agent": probe_out["agent"],
        }
        if probe_out.get("profile"):
            prof = probe_out["profile"]
            server["profile"] = {
                kind: {k: v / rollouts for k, v in counts.items()} for kind, counts in prof.items()
            }
        if under_callgrind:
            threads = _window_threads(out, name)
            server["threads"] = [t / rollouts for t in threads]
            server["instructions"] = sum(threads) / rollouts
        result["servers"][name] = server
    if under_callgrind and args.keep_dumps is not None:
        # for callgrind_annotate: per server, the main thread's window is
        # cg.<server>.<pid>.1-01, the other threads' cg.<server>.<pid>.2-NN
        args.keep_dumps.mkdir(parents=True, exist_ok=True)
        shutil.move(str(out), args.keep_dumps / variant.replace("@", "-"))
    shutil.rmtree(work, ignore_errors=True)
    return result


def _window_threads(out: Path, name: str) -> list[int]:
    """The window's instructions per thread of server ``name``, main thread first: the
    main thread from the dump at ``getsid`` (part 1), the others from the
    ``callgrind_control -d`` dump (part 2), which counts them from the moment
    instrumentation was switched on."""

    def total(path: Path) -> int:
        m = TOTALS.search(path.read_text(errors="replace"))
        return int(m.group(1)) if m else 0

    files = [f for f in out.iterdir() if f.name.startswith(f"cg.{name}.")]
    main = [f for f in files if f.name.endswith(".1-01")]
    if not main:
        raise SystemExit(f"{name}: no dump of the window")
    others = sorted(f for f in files if ".2-" in f.name and not f.name.endswith(".2-01"))
    return [total(main[0]), *(total(f) for f in others)]


def _fmt(x: float) -> str:
    return f"{x / 1e6:8.3f}M"


def print_callgrind(results: list[dict[str, Any]]) -> None:
    base = results[0]
    bare_total = sum(s["instructions"] for s in base["servers"].values())
    print("callgrind, instructions per rollout (window: measured rollouts + their export):")
    header = "".join(f"{LABELS[n]:>26}" for n in SERVERS)
    print(f"  {'variant':>16}{header}{'sum':>12}  vs bare")
    for r in results:
        cells = ""
        for n in SERVERS:
            s = r["servers"][n]
            other = s["instructions"] - s["threads"][0]
            cells += f"{_fmt(s['instructions'])} (+{other / 1e3:5.0f}k thr)".rjust(26)
        total = sum(s["instructions"] for s in r["servers"].values())
        print(f"  {r['variant']:>16}{cells}{_fmt(total)}  x{total / bare_total:.3f}", flush=True)
    for r in results:
        gcs = {LABELS[n]: r["servers"][n]["gc_collections"] for n in SERVERS}
        print(f"  {r['variant']:>16}: gc collections in the window {gcs}")
    for r in results:
        live = {LABELS[n]: r["servers"][n].get("live_requests", 0) for n in SERVERS}
        print(
            f"  {r['variant']:>16}: window {r['window_s']:.1f} s, "
            f"{1e3 * r['window_s'] / r['rollouts']:.0f} ms per rollout; live-event requests "
            f"in it {live} (one per interval, whatever the rollouts)"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="bare,default,all")
    p.add_argument("--rollouts", type=int, default=50, help="measured rollouts under callgrind")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--before", type=Path, help="another agent source tree: adds V@before")
    p.add_argument("--agent", type=Path, help="the agent source tree of the other variants")
    p.add_argument("--cpu-rounds", type=int, default=0)
    p.add_argument("--cpu-rollouts", type=int, default=200)
    p.add_argument("--core", type=int, default=1)
    p.add_argument("--no-callgrind", action="store_true")
    p.add_argument("--profile", action="store_true", help="bytecodes per function, natively")
    p.add_argument("--profile-rollouts", type=int, default=10)
    p.add_argument("--profile-top", type=int, default=40)
    p.add_argument(
        "--keep-dumps",
        type=Path,
        help="keep each variant's callgrind files in DIR/<variant> (callgrind_annotate)",
    )
    p.add_argument(
        "--live-clock-x",
        type=float,
        default=1.0,
        help="under callgrind, the live-event and lag-probe intervals times K (module doc)",
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    python = str(gym_env_python())
    specs = [v for v in args.variants.split(",") if v and v != "bare"]
    variants: list[tuple[str, str | None]] = [("bare", None)]
    agent_src = str(args.agent.resolve()) if args.agent else None
    for spec in specs:
        variants.append((spec, agent_src))
        if args.before:
            variants.append((f"{spec}@before", str(args.before.resolve())))
    sink_proc, port = start_sink()
    wait_listening(port, timeout_s=60)
    sink = f"127.0.0.1:{port}"
    load0 = os.getloadavg()
    doc: dict[str, Any] = {"load_start": load0, "args": {k: str(v) for k, v in vars(args).items()}}
    print(
        f"whole Gym rollouts (stub model, example_single_tool_call, simple_agent), three "
        f"processes; load average {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}",
        flush=True,
    )
    try:
        if args.profile:
            profiled = {
                name: run_variant(
                    python, name, src, args, sink, mode="profile", rollouts=args.profile_rollouts
                )
                for name, src in variants
            }
            doc["profile"] = profiled
            print("bytecodes and calls per rollout, main thread of each server, against bare:")
            for name, r in profiled.items():
                if name == "bare":
                    continue
                for server in SERVERS:
                    print(f"  {name}, {LABELS[server]}:")
                    print_profile_diff(
                        profiled["bare"]["servers"][server]["profile"],
                        r["servers"][server]["profile"],
                        args.profile_top,
                        "rollout",
                    )
        if not args.no_callgrind:
            with ThreadPoolExecutor(len(variants)) as pool:
                cg = list(
                    pool.map(
                        lambda v: run_variant(
                            python,
                            v[0],
                            v[1],
                            args,
                            sink,
                            mode="callgrind",
                            rollouts=args.rollouts,
                        ),
                        variants,
                    )
                )
            doc["callgrind"] = cg
            print(
                f"{args.rollouts} rollouts after {args.warmup} warm-up; load now "
                f"{os.getloadavg()[0]:.1f}; live-event intervals x{args.live_clock_x:g}"
            )
            print_callgrind(cg)
        if args.cpu_rounds:
            runs: dict[str, list[float]] = {v[0]: [] for v in variants}
            # user and system µs and context switches per rollout, three servers summed
            detail: dict[str, list[dict[str, float]]] = {v[0]: [] for v in variants}
            walls: dict[str, list[float]] = {v[0]: [] for v in variants}  # ms per rollout
            for rnd in range(args.cpu_rounds):
                order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
                for name, src in order:
                    r = run_variant(
                        python,
                        name,
                        src,
                        args,
                        sink,
                        mode="cpu",
                        rollouts=args.cpu_rollouts,
                    )
                    runs[name].append(sum(s["process_cpu_us"] for s in r["servers"].values()))
                    walls[name].append(1e3 * r["window_s"] / r["rollouts"])
                    detail[name].append(
                        {
                            k: sum(s[k] for s in r["servers"].values())
                            for k in ("user_us", "system_us", "switches_per_rollout")
                        }
                    )
            doc["cpu"] = runs
            doc["cpu_detail"] = detail
            doc["cpu_wall_ms_per_rollout"] = walls
            print(
                f"process CPU per rollout, three servers summed, {args.cpu_rounds} rounds x "
                f"{args.cpu_rollouts} rollouts, pinned to core {args.core}, interleaved; load "
                f"average at end {os.getloadavg()[0]:.1f}:"
            )
            for name, values in runs.items():
                ratios = [v / b for v, b in zip(values, runs["bare"], strict=True)]
                print(
                    f"  {name:>16}: {statistics.median(values):9.1f} us ({min(values):.1f}-"
                    f"{max(values):.1f}), x{statistics.median(ratios):.3f} bare "
                    f"({min(ratios):.3f}-{max(ratios):.3f})",
                    flush=True,
                )
                parts = {
                    k: statistics.median(d[k] for d in detail[name])
                    for k in ("user_us", "system_us", "switches_per_rollout")
                }
                print(
                    f"  {'':>16}  user {parts['user_us']:.1f} us, system "
                    f"{parts['system_us']:.1f} us, {parts['switches_per_rollout']:.1f} "
                    "context switches per rollout (medians); wall "
                    f"{statistics.median(walls[name]):.1f} ms per rollout",
                    flush=True,
                )
    finally:
        sink_proc.terminate()
        text, _ = sink_proc.communicate(timeout=30)
        doc["sink"] = text.strip().splitlines()[-1] if text.strip() else ""
        print(f"sink: {doc['sink']}")
    doc["load_end"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
