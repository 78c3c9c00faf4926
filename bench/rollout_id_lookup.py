"""Cost of ``rollout_correlation.current_rollout_id()``, the read every span start does.

Cases, each timed with ``timeit`` in a fresh child process:

- ``own``: no NeMo Gym, the id in gym_telemetry's own ContextVar;
- ``gym``: a stand-in ``nemo_gym.rollout_correlation`` module, the id in Gym's var;
- ``gym+fallback``: the same with the Gym integration's fallback bound
  (``rollout_correlation.bind_fallback()``), the id only in telemetry's var (the path a
  Gym server without rollout capture takes on every span).

``--before <agent src>`` runs another agent tree (for example a ``git archive`` of
main's ``agent/src``) in the same run, alternating rounds. Only same-run ratios carry
over.

    uv run python bench/rollout_id_lookup.py [--before /tmp/old/agent/src] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from gym_telemetry_demo.stopsignals import run_main

CHILD = r"""
import contextvars, sys, timeit, types
case, n = sys.argv[1], int(sys.argv[2])
if case != "own":
    var = contextvars.ContextVar("nemo_gym_rollout_id", default=None)
    mod = types.ModuleType("nemo_gym.rollout_correlation")
    mod._ROLLOUT_ID = var
    mod.current_rollout_id = var.get
    mod.rollout_context = None
    sys.modules["nemo_gym.rollout_correlation"] = mod
from gym_telemetry import rollout_correlation as rc
rc.resolve(force=True)
if case == "own":
    rc.ROLLOUT_ID_VAR.set("r-1")
elif case == "gym":
    var.set("r-1")
else:
    rc.bind_fallback()
    own = getattr(correlation, "TELEMETRY_ROLLOUT_ID", rc.ROLLOUT_ID_VAR)
    own.set("r-1")
f = rc.current_rollout_id
assert f() == "r-1", f()
print(min(timeit.repeat(f, number=n, repeat=5)) / n * 1e9)
"""

CASES = ("own", "gym", "gym+fallback")


def _run(src: str | None, case: str, n: int) -> float:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, case, str(n)], env=env, check=True, capture_output=True
    )
    return float(out.stdout.decode().strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="another agent source tree (src), run alternately")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    # Both trees go through PYTHONPATH, so the import set-up is the same for both.
    this = str(Path(__file__).resolve().parents[1] / "agent" / "src")
    trees = {"this": this} if not args.before else {"before": args.before, "this": this}
    results: dict[tuple[str, str], list[float]] = {}
    for i in range(args.rounds):
        for case in CASES:
            order = list(trees.items())
            if i % 2:
                order.reverse()  # neither tree always runs first
            for name, src in order:
                results.setdefault((name, case), []).append(_run(src, case, args.calls))
    print(f"current_rollout_id(), ns per call, median of {args.rounds} rounds (best of 5 each)")
    for case in CASES:
        row = "  ".join(f"{name} {statistics.median(results[(name, case)]):6.1f}" for name in trees)
        print(f"{case:14s} {row}")


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
