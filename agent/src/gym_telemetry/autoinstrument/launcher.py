"""``gym-telemetry-run <command> [args...]``: run a command with Gym auto-instrumentation on.

Like ``opentelemetry-instrument``: it sets ``GYM_TELEMETRY=1`` (keeping a value already
set) and replaces itself with ``command``. Every Python process that command starts in
an environment where ``gym-telemetry-agent`` is installed -- ``gym env start`` and each
Gym server it spawns, or a single ``python app.py`` -- is then instrumented through the
``.pth`` hook. Exit status: the command's; 2 when no command is given; 127 when it is
not found.
"""

from __future__ import annotations

import os
import sys

from gym_telemetry.autoinstrument import ENV_ACTIVATE, activation_requested

USAGE = "usage: gym-telemetry-run <command> [args...]"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``gym-telemetry-run`` (returns only on error)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 0 if args else 2
    if not activation_requested():
        os.environ[ENV_ACTIVATE] = "1"
    try:
        os.execvp(args[0], args)
    except FileNotFoundError:
        print(f"gym-telemetry-run: command not found: {args[0]}", file=sys.stderr)
        return 127
    return 0  # unreachable: execvp does not return


if __name__ == "__main__":
    raise SystemExit(main())
