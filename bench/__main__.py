"""Every headline benchmark in one command (``make bench``); results under docs/benchmarks/.

    uv run --frozen python -m bench            # ~10 min on 2 shared cores
    uv run --frozen python -m bench --quick    # ~2 min, rough figures, *_quick files

Runs, in order, each in its own processes:

1. ``bench.agent_overhead``: per-call cost of the agent's wrappers against the bare
   handler and one stock SDK span (its output is saved as ``agent_overhead.txt``);
2. ``bench.server_throughput``: FastAPI requests/s bare, with gym_telemetry, with the
   stock instrumentor, with both (``server_throughput.json``), once with a trivial
   handler and once with a handler that burns 1 ms of CPU
   (``server_throughput_handler1000.json``);
3. ``bench.sidecar_vs_rotel``: the sidecar against rotel, Jaeger as a collector and the
   bare transport (``sidecar_vs_rotel.json``, ``.md`` and ``.png``).

``--round3`` runs the performance round 3 set instead (issue 26; docs/benchmarks.md,
"Round 3"), every figure of its targets table in one run:

1. ``bench.gym_verify_callgrind``: the real Gym ``/verify`` in process, bare vs the agent
   (``default``, ``all``), instructions per request under callgrind and process CPU
   pinned and interleaved; ``bench.gym_rollout_callgrind`` the same for a whole rollout
   over the three real Gym server processes (agent, model, resources);
2. ``bench.derive_callgrind``: the derive step per derived span (instructions, µs), and
   ``bench.pipeline_callgrind`` on ``rollouts`` and ``derive-heavy``: the pipeline's
   Python per span, phase by phase (instructions);
3. ``bench.sidecar_vs_rotel`` on the three loads (``rollouts``, ``rollouts:default``,
   ``derive-heavy``) with the sidecar, rotel and the same-job Collector on gRPC/gzip,
   HTTP/gzip and gRPC/none, plus the fixed-rate memory runs;
4. ``bench.sidecar_memory``: the default configuration at 10k spans/s;
5. ``bench.soak`` (``--soak-minutes``, default 30; 0 skips it);
6. ``bench.round3_summary``: the targets table, every figure above beside its goal, the
   load average of its run and a verdict (also written as ``round3_targets.md``).

``--round4`` runs performance round 4's set instead (issue 42): the sidecar in
instructions per span (callgrind, both loads, gzip and none), the agent's callgrind
steps, the sidecar, rotel and the same-job Collector on the issue's two loads and three
paths (and the sidecar at the peers' gzip level), the default configuration's memory at
10k spans/s, then ``bench.round4_summary``: every ratio of the issue's table with its
target and load average (``bench/round4.py`` has the steps and their durations).

The load average before and after is printed and saved with each result, because on a
machine shared with other work it decides how far the figures can be trusted.

Ctrl-C, SIGTERM and SIGHUP stop it alike: the running step gets the signal (each step
stops the servers it started, ``gym_telemetry_demo.stopsignals.run_main``), the steps
after it do not run, and it dies by the signal.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gym_telemetry_demo.procs import run_passing_signals
from gym_telemetry_demo.stopsignals import run_main

from bench import round4 as round4_options

#: How long a step gets to stop what it started once a stop signal is passed on (s).
STEP_STOP_GRACE_S = 180.0


def _loadavg() -> str:
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short runs, rough figures")
    p.add_argument("--pin", action="store_true", help="pin the measured process to core 1")
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    p.add_argument("--round3", action="store_true", help="the round-3 set (module doc)")
    p.add_argument("--round4", action="store_true", help="the round-4 set (bench/round4.py)")
    p.add_argument("--rounds", type=int, default=3, help="--round3/4: sidecar_vs_rotel rounds")
    p.add_argument(
        "--soak-minutes", type=float, help="--round3 (default 30) / --round4 (default 0); 0 skips"
    )
    round4_options.add_arguments(p)
    args = p.parse_args(argv)
    if args.round4:
        args.soak_minutes = 0.0 if args.soak_minutes is None else args.soak_minutes
        return round4_options.round4(args)
    if args.round3:
        args.soak_minutes = 30.0 if args.soak_minutes is None else args.soak_minutes
        return round3(args)
    args.out.mkdir(parents=True, exist_ok=True)
    common = ["--out", str(args.out)] + (["--quick"] if args.quick else [])
    pin = ["--pin"] if args.pin else []
    failures = 0
    t0 = time.monotonic()

    print(f"== agent per-call overhead (load average {_loadavg()})", flush=True)
    cmd = [sys.executable, "-m", "bench.agent_overhead"] + (["--quick"] if args.quick else [])
    done = run_passing_signals(cmd, STEP_STOP_GRACE_S, capture=True)
    sys.stdout.write(done.stdout + done.stderr)
    suffix = "_quick" if args.quick else ""
    (args.out / f"agent_overhead{suffix}.txt").write_text(
        f"$ {' '.join(cmd[1:])}\nload average before: {_loadavg()}\n\n{done.stdout}",
        encoding="utf-8",
    )
    failures += done.returncode != 0

    # The second server run gives the handler 1 ms of CPU, about what a real Gym /verify
    # costs (docs/nemo-gym.md), so the ratio shows what a real server keeps.
    handler = ["--handler-us", "1000", "--tag", "handler1000"]
    if not args.quick:
        handler += ["--repeats", "2", "--seconds", "6"]  # keeps `make bench` near 10 min
    runs = (
        ("bench.server_throughput", pin),
        ("bench.server_throughput", [*pin, *handler]),
        ("bench.sidecar_vs_rotel", pin),
    )
    for module, extra in runs:
        print(f"\n== {module} {' '.join(extra)} (load average {_loadavg()})", flush=True)
        cmd = [sys.executable, "-m", module, *common, *extra]
        failures += run_passing_signals(cmd, STEP_STOP_GRACE_S).returncode != 0

    print(
        f"\nall benchmarks: {time.monotonic() - t0:.0f} s, load average {_loadavg()}; "
        f"results in {args.out}/"
    )
    return 1 if failures else 0


ROUND3_PATHS = ",".join(
    [
        *(
            f"{c}:{e}"
            for e in ("grpc/gzip", "http/gzip", "grpc/none")
            for c in ("sidecar", "rotel", "otelcol")
        ),
        # without their derive step, for what deriving costs each per derived span
        "sidecar-noderive:grpc/none",
        "otelcol-noderive:grpc/none",
    ]
)


def round3(args: argparse.Namespace) -> int:
    """The round-3 set (module doc), each step in its own processes."""
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    steps: list[list[str]] = [
        ["bench.gym_verify_callgrind", "--json", str(args.out / "gym_verify_callgrind.json")],
        [
            "bench.gym_rollout_callgrind",
            "--cpu-rounds",
            "3",
            "--json",
            str(args.out / "gym_rollout_callgrind.json"),
        ],
        ["bench.derive_callgrind"],
        ["bench.pipeline_callgrind", "--load", "rollouts"],
        ["bench.pipeline_callgrind", "--load", "derive-heavy"],
        [
            "bench.sidecar_vs_rotel",
            "--rounds",
            str(args.rounds),
            "--loads",
            "rollouts,rollouts:default,derive-heavy",
            "--paths",
            ROUND3_PATHS,
            "--rate-paths",
            "sidecar:grpc/none,rotel:grpc/none,otelcol:grpc/none",
            "--rate-seconds",
            "15",
            "--requests",
            "400",
            "--name",
            "round3",
            "--out",
            str(args.out),
        ],
        [
            "bench.sidecar_memory",
            "--rounds",
            "3",
            "--seconds",
            "15",
            "--bytecode",
            "--json",
            str(args.out / "sidecar_memory.json"),
        ],
    ]
    if args.soak_minutes > 0:
        steps.append(["bench.soak", "--minutes", str(args.soak_minutes)])
    steps.append(
        [
            "bench.round3_summary",
            "--dir",
            str(args.out),
            "--md",
            str(args.out / "round3_targets.md"),
        ]
    )
    failures = 0
    for step in steps:
        print(f"\n== {' '.join(step)} (load average {_loadavg()})", flush=True)
        step_cmd = [sys.executable, "-m", *step]
        failures += run_passing_signals(step_cmd, STEP_STOP_GRACE_S).returncode != 0
    print(f"\nround 3: {time.monotonic() - t0:.0f} s, load average {_loadavg()}; in {args.out}/")
    return 1 if failures else 0


if __name__ == "__main__":
    run_main(main)
