"""Performance round 4 (issue 42) in one command: every figure of its targets table,
written as JSON for the summary (``make bench-round4`` = ``python -m bench --round4``).

    uv run --frozen python -m bench --round4 [--rounds 3] [--soak-minutes 0] [--out DIR]
        [--skip-agent] [--skip-callgrind]

Steps, each in its own processes, in this order (the load average is printed before
each and saved with each result):

1. the sidecar in instructions (callgrind; robust to the machine's load):
   ``bench.sidecar_callgrind`` per load (``rollouts``, ``derive-heavy``) and export
   compression (``gzip``, ``none``), whole process, instructions per span by shared
   object (``round4_callgrind_<load>_<compression>.json``); ``bench.pipeline_callgrind``
   per load, the pipeline's Python per span phase by phase
   (``round4_pipeline_<load>.json``); ``bench.derive_callgrind``, the derive step per
   derived span;
2. the agent (the other half of the issue): ``bench.gym_verify_callgrind`` (``/verify``,
   instructions and pinned process CPU) and ``bench.gym_rollout_callgrind`` (whole
   rollouts over the three real servers, with ``/run``), as round 3 runs them but with
   the live events' clock stretched under callgrind (``--live-clock-x``, default
   ``LIVE_CLOCK_X`` = 50; ``1``: as shipped);
3. ``bench.sidecar_vs_rotel --name round4``: the sidecar, rotel and the same-job
   Collector on the issue's two loads (whole rollouts, ``derive-heavy``) and three paths
   (gRPC/none, gRPC/gzip, HTTP/gzip), interleaved per round, plus the sidecar gzipping at
   level 5 (``sidecar@5``, zlib-ng: the peers' output bytes within 1 %) and at level 6
   (``sidecar@6``, the level number rotel's and the Collector's gzip use), so that equal
   compression is shown both ways beside the default (level 2, ISA-L, ~4 % more bytes);
   the relay in front of every sink counts the bytes;
4. ``bench.sidecar_memory``: the default configuration at 10k spans/s, 3 rounds, compiled
   bytecode as in the image, on the ``varied`` and the ``rollouts`` loads
   (``round4_memory_<load>.json``; the peak is the peak under load);
5. ``bench.soak`` when ``--soak-minutes`` > 0 (round 4 has no soak target; default 0);
6. ``bench.round4_summary``: the issue's table (every ratio with its target, the load
   average of its runs, a verdict), the RSS peak, the agent's ratios and the callgrind
   figures, printed and written as ``round4_targets.md`` and ``round4_summary.json``.

Duration on a quiet two-core machine: ~35 minutes (callgrind ~10, agent ~8, the
throughput rounds ~12, memory ~4).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gym_telemetry_demo.procs import run_passing_signals

#: How long a step gets to stop what it started once a stop signal is passed on (s).
STEP_STOP_GRACE_S = 180.0

#: The agent benches' ``--live-clock-x``: the live events' heartbeats and lag-probe ticks
#: run on the wall clock, which callgrind slows ~50x (46-83 measured: a ``/verify`` takes
#: ~30-110 ms there against ~0.6 ms natively, a rollout ~0.8-1.4 s against ~17 ms), so
#: their intervals are stretched as much under callgrind only and cost per request what
#: they cost natively (docs/benchmarks.md, "The sixth session"). ``1`` runs them as
#: shipped (charged ~50x over).
LIVE_CLOCK_X = 50.0

LOADS = ("rollouts", "derive-heavy")
"""The issue's two loads: whole rollouts (``rollouts``) and ``derive-heavy``."""
EXPORTS = ("grpc/none", "grpc/gzip", "http/gzip")
"""The issue's three paths."""
PEERS = ("rotel", "otelcol")
EQUAL_LEVEL = 6
"""The gzip level rotel's (tonic/flate2) and the Collector's (Go) gzip use by default."""
EQUAL_BYTES_LEVEL = 5
"""The sidecar's level (zlib-ng) whose output is the peers' bytes within 1 % (the default
before ISA-L; the default level 2 sends ~4 % more)."""

PATHS = ",".join(
    [
        *(f"{c}:{e}" for e in EXPORTS for c in ("sidecar", *PEERS)),
        *(
            f"sidecar@{level}:{e}"
            for level in (EQUAL_BYTES_LEVEL, EQUAL_LEVEL)
            for e in EXPORTS
            if e.endswith("gzip")
        ),
    ]
)
RATE_PATHS = ",".join(f"{c}:grpc/none" for c in ("sidecar", *PEERS))
MEMORY_LOADS = ("varied", "rollouts")


def _loadavg() -> str:
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def steps(args: argparse.Namespace) -> list[list[str]]:
    """The modules and arguments of each step (module doc), in order."""
    out = args.out
    todo: list[list[str]] = []
    if not args.skip_callgrind:
        for load in LOADS:
            for compression in ("gzip", "none"):
                name = f"round4_callgrind_{load}_{compression}.json"
                todo.append(
                    [
                        "bench.sidecar_callgrind",
                        "--load",
                        load,
                        "--compression",
                        compression,
                        "--json",
                        str(out / name),
                    ]
                )
        for load in LOADS:
            todo.append(
                [
                    "bench.pipeline_callgrind",
                    "--load",
                    load,
                    "--json",
                    str(out / f"round4_pipeline_{load}.json"),
                ]
            )
        todo.append(["bench.derive_callgrind"])
    if not args.skip_agent:
        clock = ["--live-clock-x", f"{args.live_clock_x:g}"]
        todo.append(
            [
                "bench.gym_verify_callgrind",
                *clock,
                "--json",
                str(out / "gym_verify_callgrind.json"),
            ]
        )
        todo.append(
            [
                "bench.gym_rollout_callgrind",
                *clock,
                "--cpu-rounds",
                "3",
                "--json",
                str(out / "gym_rollout_callgrind.json"),
            ]
        )
    todo.append(
        [
            "bench.sidecar_vs_rotel",
            "--rounds",
            str(args.rounds),
            "--loads",
            ",".join(LOADS),
            "--paths",
            PATHS,
            "--rate-paths",
            RATE_PATHS,
            "--rate-seconds",
            "15",
            "--requests",
            "400",
            "--name",
            "round4",
            "--out",
            str(out),
        ]
    )
    for load in MEMORY_LOADS:
        todo.append(
            [
                "bench.sidecar_memory",
                "--rounds",
                "3",
                "--seconds",
                "15",
                "--bytecode",
                "--load",
                load,
                "--json",
                str(out / f"round4_memory_{load}.json"),
            ]
        )
    if args.soak_minutes > 0:
        todo.append(["bench.soak", "--minutes", str(args.soak_minutes)])
    todo.append(["bench.round4_summary", "--dir", str(out)])
    return todo


def round4(args: argparse.Namespace) -> int:
    """Run every step (module doc); 1 if any failed (the later ones still run)."""
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    failures = 0
    for step in steps(args):
        print(f"\n== {' '.join(step)} (load average {_loadavg()})", flush=True)
        done = run_passing_signals([sys.executable, "-m", *step], STEP_STOP_GRACE_S)
        failures += done.returncode != 0
    print(f"\nround 4: {time.monotonic() - t0:.0f} s, load average {_loadavg()}; in {args.out}/")
    return 1 if failures else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``python -m bench``'s round-4 options (the shared ``--out`` and ``--rounds`` too)."""
    p.add_argument("--skip-agent", action="store_true", help="--round4: no agent steps")
    p.add_argument("--skip-callgrind", action="store_true", help="--round4: no callgrind steps")
    p.add_argument(
        "--live-clock-x",
        type=float,
        default=LIVE_CLOCK_X,
        help="--round4: the agent benches' live-event clock factor under callgrind (module doc)",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--soak-minutes", type=float, default=0.0)
    add_arguments(p)
    return round4(p.parse_args(argv))


if __name__ == "__main__":
    from gym_telemetry_demo.stopsignals import run_main

    run_main(main)
