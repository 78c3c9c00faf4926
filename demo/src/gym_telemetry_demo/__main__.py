"""``python -m gym_telemetry_demo [--rollouts N] [--concurrency C] [--failing F] [--keep]
[--hang]``.

Exit status: 0 when every step worked, 1 when one did not, 2 on bad arguments. Ctrl-C,
SIGTERM and SIGHUP all stop it the same way (:mod:`gym_telemetry_demo.stopsignals`):
every child process it started is stopped, then it dies by that signal (a shell reports
130, 143 or 129; :func:`main` called in process returns that number).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gym_sidecar.inspect.render import make_console
from gym_sidecar.store.config import default_data_dir

from gym_telemetry_demo.run import DemoOptions, run_demo
from gym_telemetry_demo.stopsignals import Stopped, exit_with, received, stop_on_signals


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="make demo", description="Real Gym servers -> sidecar -> local store -> tables."
    )
    p.add_argument("--rollouts", type=_positive, default=50, help="rollouts to run (50)")
    p.add_argument("--concurrency", type=_positive, default=8, help="rollouts at once (8)")
    p.add_argument(
        "--failing", type=_non_negative, default=3, help="rollouts whose verifier fails (3)"
    )
    p.add_argument(
        "--store-dir",
        type=Path,
        default=default_data_dir(),
        help=f"the local store's directory (default {default_data_dir()}, the sidecar's)",
    )
    p.add_argument(
        "--workdir", type=Path, default=Path(".data/demo"), help="logs and configs (.data/demo)"
    )
    p.add_argument("--keep", action="store_true", help="keep everything running until Ctrl-C")
    p.add_argument(
        "--jaeger",
        action="store_true",
        help="also forward the traces to a Jaeger v2 built from source (first run builds it: "
        "minutes, needs Go) and print the Jaeger API URL of a failed rollout's trace",
    )
    p.add_argument(
        "--hang",
        action="store_true",
        help="then one rollout whose model call hangs: shown stalled on the web view's /live "
        "page and in gym_rollout_stalled, then lost once its agent server is killed",
    )
    p.add_argument("--gym-python", type=Path, help="use this Gym environment's python as is")
    p.add_argument(
        "--repo",
        type=Path,
        help="the gym-telemetry source tree (default: $GYM_TELEMETRY_REPO, else the nearest"
        " directory at or above the current one holding examples/gym_stack)",
    )
    p.add_argument("--wait-s", type=float, default=30.0, help="how long to wait for the store (30)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.failing > args.rollouts:
        print("make demo: --failing must not exceed --rollouts", file=sys.stderr)
        return 2
    opts = DemoOptions(
        rollouts=args.rollouts,
        concurrency=args.concurrency,
        failing=args.failing,
        store_dir=args.store_dir.resolve(),
        workdir=args.workdir.resolve(),
        keep=args.keep,
        gym_python=args.gym_python,
        wait_s=args.wait_s,
        repo=args.repo,
        jaeger=args.jaeger,
        hang=args.hang,
    )
    console = make_console()
    with stop_on_signals():
        try:
            code = run_demo(opts, console)
        except Stopped as stop:
            # every process started so far was stopped by run_demo's finally
            console.print(f"stopped by {signal.Signals(stop.signo).name}.")
            return stop.exit_code
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            # Boundary: a step that could not start (Gym env, sidecar, a Gym server) ends
            # the demo with its message; every process started so far was stopped by
            # run_demo.
            console.print(f"[bold red]demo failed:[/bold red] {exc}")
            code = 1
    signo = received()  # a signal that came while a step was failing still counts
    return code if signo is None else 128 + signo


def cli() -> None:
    """The console script and ``python -m``: :func:`main`, then a stop signal's death."""
    exit_with(main())


if __name__ == "__main__":
    cli()
