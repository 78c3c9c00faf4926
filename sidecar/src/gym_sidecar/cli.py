"""The ``gym-sidecar`` command.

Subcommands (argparse subparsers; to add one, write ``_add_<name>(subparsers)`` that
registers its parser with ``set_defaults(func=...)`` and append it to ``SUBCOMMANDS``):

- ``run``: run the sidecar until SIGTERM/SIGINT (exit 0 after a clean shutdown,
  2 on invalid configuration, 1 when it cannot start, e.g. a port in use). SIGHUP
  reloads the span-group config, or stops it as SIGTERM does when it comes from the
  controlling terminal closing (:mod:`gym_sidecar.hangup`).
- ``check-config FILE``: load FILE with the environment and flags applied, print the
  effective configuration as YAML (exit 0) or every error with its key path (exit 2).
- ``rollouts``, ``trace ROLLOUT_ID|TRACE_ID``, ``stats``, ``envs``: read the embedded local store
  (see :mod:`gym_sidecar.inspect.commands`).
- ``ui``: serve the web view and the Jaeger-compatible query API over the local store
  (see :mod:`gym_sidecar.webui.command`).
- ``live``: the rollouts in flight, stalled and lost, read from a running sidecar (see
  :mod:`gym_sidecar.live.command`).

``gym-sidecar --version`` prints the installed version.

Every config flag has an environment twin (``--grpc-listen`` and
``GYM_SIDECAR_GRPC_LISTEN``); flags win over the environment, which wins over the file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gym_telemetry_semconv.safetext import SafeFormatter, escape_controls

from gym_sidecar.config import ENV_CONFIG_FILE, ConfigError, SidecarConfig, load_config
from gym_sidecar.inspect.commands import add_envs, add_rollouts, add_stats, add_trace
from gym_sidecar.live.command import add_live
from gym_sidecar.webhook.cli import add_webhook
from gym_sidecar.webui.command import add_ui

EXIT_OK = 0
EXIT_START_FAILED = 1
EXIT_BAD_CONFIG = 2

# flag dest -> dotted config key it overrides
_CONFIG_FLAGS: dict[str, str] = {
    "grpc_listen": "grpc_listen",
    "http_listen": "http_listen",
    "admin_listen": "admin_listen",
    "backend": "backend.url",
    "backend_protocol": "backend.protocol",
    "backend_compression": "backend.compression",
    "log_level": "log_level",
    "local_store": "local_store.enabled",
    "store_dir": "local_store.data_dir",
}


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that override configuration keys (defaults None = not given)."""
    g = parser.add_argument_group("configuration (each flag also reads GYM_SIDECAR_<FLAG>)")
    g.add_argument("--grpc-listen", metavar="HOST:PORT", help="OTLP/gRPC receiver address")
    g.add_argument("--http-listen", metavar="HOST:PORT", help="OTLP/HTTP receiver address")
    g.add_argument("--admin-listen", metavar="HOST:PORT", help="health/metrics address")
    g.add_argument("--backend", metavar="URL", help="OTLP backend, e.g. http://jaeger:4317")
    g.add_argument("--backend-protocol", choices=["grpc", "http/protobuf"])
    g.add_argument("--backend-compression", choices=["gzip", "none"])
    g.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    g.add_argument(
        "--local-store",
        action=argparse.BooleanOptionalAction,
        help="write into the embedded local store (default: only when there is no --backend)",
    )
    g.add_argument("--store-dir", metavar="DIR", help="the local store's data directory")


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The nested config dict spelled by the flags that were given."""
    out: dict[str, Any] = {}
    for dest, key in _CONFIG_FLAGS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _load(args: argparse.Namespace, config_file: str | None) -> SidecarConfig | None:
    try:
        return load_config(config_file, os.environ, flag_overrides(args))
    except ConfigError as exc:
        print(f"gym-sidecar: {exc}", file=sys.stderr)  # ConfigError escapes
        return None


# -- run --------------------------------------------------------------------------------
def _add_run(subparsers: Any) -> None:
    p = subparsers.add_parser("run", help="run the sidecar")
    p.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get(ENV_CONFIG_FILE),
        help=f"YAML config file (env {ENV_CONFIG_FILE})",
    )
    _add_config_flags(p)
    p.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    cfg = _load(args, args.config)
    if cfg is None:
        return EXIT_BAD_CONFIG
    setup_logging(cfg.log_level)
    from gym_sidecar.server import SidecarServer

    try:
        asyncio.run(SidecarServer(cfg).serve())
    except OSError as exc:
        logging.getLogger("gym_sidecar").error("cannot start: %s", exc)
        return EXIT_START_FAILED
    return EXIT_OK


# -- check-config -----------------------------------------------------------------------
def _add_check_config(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "check-config", help="validate a config file (with env and flags applied)"
    )
    p.add_argument("file", metavar="FILE", help="YAML config file")
    _add_config_flags(p)
    p.set_defaults(func=_cmd_check_config)


def _cmd_check_config(args: argparse.Namespace) -> int:
    cfg = _load(args, args.file)
    if cfg is None:
        return EXIT_BAD_CONFIG
    import yaml  # the run command never needs it (see config.read_yaml_file)

    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    print(f"{escape_controls(args.file)}: OK", file=sys.stderr)
    return EXIT_OK


SUBCOMMANDS: list[Callable[[Any], None]] = [
    _add_run,
    _add_check_config,
    add_webhook,
    add_rollouts,
    add_trace,
    add_stats,
    add_envs,
    add_ui,
    add_live,
]


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    """Log to stderr at ``level`` through ``SafeFormatter``: a client-supplied string in a
    message (a span name, a request path, a backend's error) cannot start a new line or
    carry control characters (``gym_telemetry_semconv.safetext``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter(LOG_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def version() -> str:
    """The installed ``gym-telemetry-sidecar`` distribution's version."""
    # Imported here: importlib.metadata (with zipfile, csv and email's parser) is ~1 MiB
    # resident that a running sidecar has no other use for (docs/benchmarks.md).
    import importlib.metadata

    try:
        return importlib.metadata.version("gym-telemetry-sidecar")
    except importlib.metadata.PackageNotFoundError:  # run from a bare source tree
        return "unknown"


class _VersionAction(argparse.Action):
    """``--version``: looks the version up only when asked (see :func:`version`)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        sys.stdout.write(f"{parser.prog} {version()}\n")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gym-sidecar", description="OTLP sidecar for NeMo Gym fleets"
    )
    parser.add_argument("--version", action=_VersionAction)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gym-sidecar`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
