"""The ``rollouts``, ``trace``, ``stats`` and ``envs`` subcommands of ``gym-sidecar``.

All four read the store that ``gym-sidecar run`` writes: its path comes from the same
config file, environment (``GYM_SIDECAR_LOCAL_STORE__DATA_DIR`` / ``GYM_SIDECAR_STORE_DIR``)
and ``--store-dir`` flag. They open it read-only and never block a running sidecar.
Exit codes: 0 shown, 1 nothing found (no store, unknown id), 2 bad arguments/config.

Only the parsers are built at import (``gym-sidecar run`` imports this module to register
them): rich, sqlite3, the store and the renderers are imported by the commands
themselves, so a running sidecar does not keep them resident.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym_telemetry_semconv.safetext import escape_controls

from gym_sidecar.config import ENV_CONFIG_FILE, ConfigError, load_config

if TYPE_CHECKING:
    import sqlite3

    from rich.console import Console
    from rich.text import Text

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_BAD_ARGS = 2

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d``, ``500ms`` -> seconds (argparse type)."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30s, 15m, 2h, 1d)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def store_path(config_file: str | None, store_dir: str | None) -> Path:
    """The store file named by config file < environment < ``--store-dir``.

    Raises ConfigError.
    """
    overrides: dict[str, Any] = {}
    if store_dir is not None:
        overrides = {"local_store": {"data_dir": store_dir}}
    cfg = load_config(config_file, os.environ, overrides)
    return cfg.local_store.db_path()


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get(ENV_CONFIG_FILE),
        help=f"the sidecar's YAML config, for local_store.data_dir (env {ENV_CONFIG_FILE})",
    )
    p.add_argument("--store-dir", metavar="DIR", help="the store's data directory")


def _window(p: argparse.ArgumentParser) -> None:
    """``--since``, the window of the commands that summarise (stats, envs)."""
    p.add_argument(
        "--since",
        type=parse_duration,
        metavar="DURATION",
        help="the window, e.g. 1h (default: everything stored)",
    )


def _open(args: argparse.Namespace, console: Console) -> sqlite3.Connection | int:
    import sqlite3

    from rich.text import Text

    from gym_sidecar.store import db

    try:
        path = store_path(args.config, args.store_dir)
    except ConfigError as exc:
        print(f"gym-sidecar: {exc}", file=sys.stderr)  # ConfigError escapes
        return EXIT_BAD_ARGS
    try:
        return db.connect(path, readonly=True)
    except FileNotFoundError as exc:
        console.print(Text("cannot open the local store: ", style="red") + _plain(exc))
        console.print("Is a sidecar running with the local store (no --backend, or --local-store)?")
        return EXIT_NOT_FOUND
    except (sqlite3.Error, db.StoreVersionError) as exc:
        console.print(
            Text(f"cannot open the local store {_plain(path)}: ", style="red") + _plain(exc)
        )
        return EXIT_NOT_FOUND


def _plain(value: object) -> Text:
    """``value`` as unparsed text with its control characters escaped (see render.py)."""
    from rich.text import Text

    return Text(escape_controls(str(value)))


def add_rollouts(subparsers: Any) -> None:
    p = subparsers.add_parser("rollouts", help="list recent rollouts from the local store")
    _common(p)
    p.add_argument("--service", help="only rollouts whose trace has this service (substring)")
    p.add_argument(
        "--since",
        type=parse_duration,
        metavar="DURATION",
        help="only rollouts started in this window, e.g. 15m",
    )
    p.add_argument(
        "--failed",
        action="store_true",
        help="only rollouts that errored or whose verification failed",
    )
    p.add_argument("--slowest", type=int, metavar="N", help="the N longest rollouts")
    p.add_argument("--limit", type=int, default=20, help="most rows shown (default 20)")
    p.set_defaults(func=cmd_rollouts)


def cmd_rollouts(args: argparse.Namespace, console: Console | None = None) -> int:
    from gym_sidecar.inspect.render import make_console, rollouts_table
    from gym_sidecar.store import queries

    console = console or make_console()
    if args.limit <= 0 or (args.slowest is not None and args.slowest <= 0):
        print("gym-sidecar: --limit and --slowest must be positive", file=sys.stderr)
        return EXIT_BAD_ARGS
    conn = _open(args, console)
    if isinstance(conn, int):
        return conn
    with closing(conn):
        rows = queries.rollouts(
            conn,
            since_s=args.since,
            service=args.service,
            failed_only=args.failed,
            slowest=args.slowest,
            limit=args.limit,
        )
    title = f"Slowest {args.slowest} rollouts" if args.slowest else "Recent rollouts"
    console.print(rollouts_table(rows, title))
    return EXIT_OK


def add_trace(subparsers: Any) -> None:
    p = subparsers.add_parser("trace", help="show one rollout's span tree as a waterfall")
    _common(p)
    p.add_argument(
        "ident",
        metavar="ROLLOUT_ID|TRACE_ID",
        help="a rollout id, a trace id or its first 8+ hex digits",
    )
    p.set_defaults(func=cmd_trace)


def cmd_trace(args: argparse.Namespace, console: Console | None = None) -> int:
    from gym_sidecar.inspect.render import make_console, trace_waterfall, untrusted
    from gym_sidecar.store import queries

    console = console or make_console()
    conn = _open(args, console)
    if isinstance(conn, int):
        return conn
    with closing(conn):
        trace_ids = queries.find_traces(conn, args.ident)
        if not trace_ids:
            console.print(
                untrusted(f"no rollout or trace {args.ident!r} in the local store", 200, "red")
            )
            return EXIT_NOT_FOUND
        for trace_id in trace_ids:
            console.print(trace_waterfall(queries.trace_spans(conn, trace_id)))
    return EXIT_OK


def add_stats(subparsers: Any) -> None:
    p = subparsers.add_parser("stats", help="rollout and verify percentiles over a window")
    _common(p)
    _window(p)
    p.set_defaults(func=cmd_stats)


def cmd_stats(args: argparse.Namespace, console: Console | None = None) -> int:
    from gym_sidecar.inspect.render import make_console, stats_table
    from gym_sidecar.inspect.rl_render import envs_table, models_table
    from gym_sidecar.store import rl, stats

    console = console or make_console()
    conn = _open(args, console)
    if isinstance(conn, int):
        return conn
    with closing(conn):
        result = stats.compute(conn, args.since)
        rollouts = rl.whole_fleet(conn, args.since)
        models = rl.models(conn, args.since)
    console.print(stats_table(result))
    console.print(envs_table(rollouts, "Reward, turns and tokens per rollout (all rollouts)"))
    console.print(models_table(models))
    return EXIT_OK


def add_envs(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "envs",
        help="reward, turns, tokens and latency per environment; model calls; verifier rewards",
    )
    _common(p)
    _window(p)
    p.set_defaults(func=cmd_envs)


def cmd_envs(args: argparse.Namespace, console: Console | None = None) -> int:
    from gym_sidecar.inspect.render import make_console
    from gym_sidecar.inspect.rl_render import rl_group
    from gym_sidecar.store import rl

    console = console or make_console()
    conn = _open(args, console)
    if isinstance(conn, int):
        return conn
    with closing(conn):
        found = rl.environments(conn, args.since)
        models = rl.models(conn, args.since)
        verifiers = rl.verifier_rewards(conn, args.since)
    console.print(rl_group(found, models, verifiers))
    return EXIT_OK if found.envs or models or verifiers else EXIT_NOT_FOUND
