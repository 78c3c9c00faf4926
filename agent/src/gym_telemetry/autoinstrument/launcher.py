"""``gym-telemetry-run <command> [args...]``: run a command with Gym auto-instrumentation on.

Like ``opentelemetry-instrument``: it sets ``GYM_TELEMETRY=1`` (keeping a value already
set) and replaces itself with ``command``. Every Python process that command starts in
an environment where ``gym-telemetry-agent`` is installed -- ``gym env start`` and each
Gym server it spawns, or a single ``python app.py`` -- is then instrumented through the
``.pth`` hook. Exit status: the command's; 2 when no command is given; 127 when it is
not found. ``-h``/``--help`` as the first argument prints :data:`HELP` (what it does and
the environment variables the instrumentation reads), ``--version`` the agent's version;
any later ``--help`` belongs to the command.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

from gym_telemetry import environment_variables as env_vars
from gym_telemetry.autoinstrument import activation_requested

USAGE = "usage: gym-telemetry-run <command> [args...]"

HELP = f"""{USAGE}

Run <command> with NeMo Gym auto-instrumentation switched on: sets {env_vars.GYM_TELEMETRY}=1
(keeping a value that already turns it on) and replaces itself with <command>. Every
Python process it starts where gym-telemetry-agent is installed (`gym env start` and
each Gym server it spawns, or one `python app.py`) traces its requests and sends OTLP
to the local sidecar.

environment read by the instrumentation (docs/agent.md has the full table):
  {env_vars.GYM_TELEMETRY}                        the switch (set to 1 here)
  OTEL_EXPORTER_OTLP_ENDPOINT          where spans go (default localhost:4317, the sidecar)
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT   the same, for traces only (wins over the above)
  OTEL_EXPORTER_OTLP_PROTOCOL          grpc (default) or http/protobuf
  OTEL_SDK_DISABLED                    true: no telemetry at all
  GYM_TELEMETRY_SERVICE_PREFIX         service.name is <prefix>/<Gym server> (nemo-gym)
  OTEL_RESOURCE_ATTRIBUTES             extra resource attributes
  OTEL_BSP_*                           the batch span processor's queue, batch size, delay
  GYM_TELEMETRY_SPAN_GROUPS            span groups before the first poll (default: default)
  GYM_TELEMETRY_SIDECAR_ADMIN_URL      the sidecar's admin API for span-group polling
                                       (default http://localhost:13133)
  GYM_TELEMETRY_POLL_INTERVAL_S        span-group poll interval (default 10)
  GYM_TELEMETRY_SERVER_NAME, GYM_TELEMETRY_SERVER_TYPE   name/type when Gym's are unknown
  GYM_TELEMETRY_EXCLUDED_PATHS         request paths never traced

exit status: the command's; 2 without a command; 127 when the command is not found."""


def _version() -> str:
    try:
        return importlib.metadata.version("gym-telemetry-agent")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``gym-telemetry-run`` (returns only on error)."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(USAGE, file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help"):
        print(HELP)
        return 0
    if args[0] == "--version":
        print(f"gym-telemetry-run (gym-telemetry-agent {_version()})")
        return 0
    if not activation_requested():
        os.environ[env_vars.GYM_TELEMETRY] = "1"
    try:
        os.execvp(args[0], args)
    except FileNotFoundError:
        print(f"gym-telemetry-run: command not found: {args[0]}", file=sys.stderr)
        return 127
    return 0  # unreachable: execvp does not return


if __name__ == "__main__":
    raise SystemExit(main())
