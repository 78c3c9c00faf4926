"""Issue 40's table for one run of the Gym-own-telemetry scenario (``testkit.gym_fleet``).

Real Gym 0.7.0 servers on Gym's own telemetry (nemo-lens 0.1.0 plus the test-only
stand-in), alone (``--fleet gym``) or with this project's agent in some servers
(``--fleet mixed``: the agent server by default, ``--agent-servers`` names others), 20
rollouts of which 4 have a verifier that raises, into one
``gym-sidecar run --local-store`` with default settings forwarding to a recording sink.
Prints the figures the issue judges (rollouts listed, derived rollout and verify points,
spans of not-forwarded groups that reached the backend, producers per metric name).

"Before" a change: run it with another tree's sidecar first on the path, e.g.

    git archive main sidecar/src semconv/src | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before/sidecar/src:/tmp/before/semconv/src:. \\
        uv run --frozen python -m bench.gym_fleet_table --fleet gym

(the sidecar child process inherits ``PYTHONPATH``; so does the store reader here).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from testkit.gym_fleet import FAILING_AGENT, FLEET, fleet_table, lens_python, run_fleet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet", choices=["gym", "mixed"], default="gym")
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--failing", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--agent-servers",
        default=FAILING_AGENT,
        help=f"comma-separated servers on this project's agent with --fleet mixed ({FLEET})",
    )
    args = parser.parse_args()
    python = lens_python()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gym-fleet-"))
    agent_servers = args.agent_servers.split(",") if args.fleet == "mixed" else []
    run = run_fleet(
        python,
        workdir,
        agent_servers=agent_servers,
        rollouts=args.rollouts,
        failing=args.failing,
    )
    statuses: dict[int, int] = {}
    for status, _ in run.results.values():
        statuses[status] = statuses.get(status, 0) + 1
    print(
        f"fleet: {args.fleet} (agent in: {agent_servers or 'none'}); "
        f"rollout answers by status: {statuses}; workdir {workdir}"
    )
    for label, value in fleet_table(run).rows():
        print(f"  {label:48} {value}")


if __name__ == "__main__":
    main()
