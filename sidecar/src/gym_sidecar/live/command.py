"""``gym-sidecar live``: the rollouts in flight, stalled and lost, in the terminal.

    gym-sidecar live [--admin-url URL] [--config FILE] [--limit N] [--watch SECONDS]

Reads the running sidecar's live view from its admin listener (``--admin-url``, env
``GYM_SIDECAR_LIVE_ADMIN_URL``; by default ``http://`` + the configuration's
``admin_listen``) and prints it (:mod:`.render`). ``--watch S`` prints it again every S
seconds until Ctrl-C. Exit codes: 0 shown, 1 the sidecar could not be read, 2 bad
arguments or configuration.

Only the parser is built at import (``gym-sidecar run`` imports this module to register
it); rich and the client are imported by the command.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from gym_sidecar.config import ENV_CONFIG_FILE, ConfigError, load_config

EXIT_OK = 0
EXIT_UNAVAILABLE = 1
EXIT_BAD_ARGS = 2
ENV_ADMIN_URL = "GYM_SIDECAR_LIVE_ADMIN_URL"
ENV_PREFIX = "GYM_SIDECAR_LIVE_"


def add_live(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "live", help="show the rollouts in flight, stalled and lost (from a running sidecar)"
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get(ENV_CONFIG_FILE),
        help=f"the sidecar's YAML config, for admin_listen (env {ENV_CONFIG_FILE})",
    )
    p.add_argument(
        "--admin-url",
        metavar="URL",
        default=os.environ.get(ENV_ADMIN_URL) or None,
        help=f"the sidecar's admin listener (default: http:// + admin_listen; env {ENV_ADMIN_URL})",
    )
    p.add_argument("--limit", type=int, default=50, help="most rollouts listed (default 50)")
    p.add_argument(
        "--watch", type=float, metavar="SECONDS", help="print it again every SECONDS until Ctrl-C"
    )
    p.set_defaults(func=cmd_live)


def cmd_live(args: argparse.Namespace) -> int:
    from gym_sidecar.live.client import (
        LiveUnavailable,
        check_admin_url,
        default_admin_url,
        fetch_live,
    )
    from gym_sidecar.live.render import live_tables, make_console
    from gym_sidecar.live.view import MAX_LIMIT

    if not 1 <= args.limit <= MAX_LIMIT or (args.watch is not None and args.watch <= 0):
        print(f"gym-sidecar: --limit must be 1..{MAX_LIMIT}, --watch positive", file=sys.stderr)
        return EXIT_BAD_ARGS
    try:
        if args.admin_url is not None:
            url = check_admin_url(args.admin_url)
        else:
            # GYM_SIDECAR_LIVE_* are this command's own settings, not config keys
            environ = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
            url = default_admin_url(load_config(args.config, environ, {}).admin_listen)
    except (ConfigError, ValueError) as exc:
        print(f"gym-sidecar: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGS
    console = make_console()
    while True:
        try:
            view = fetch_live(url, args.limit)
        except LiveUnavailable as exc:
            console.print(f"gym-sidecar live: {exc}", markup=False, highlight=False)
            if args.watch is None:
                return EXIT_UNAVAILABLE
        else:
            if args.watch is not None:
                console.clear()
            console.print(live_tables(view, url))
        if args.watch is None:
            return EXIT_OK
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return EXIT_OK
