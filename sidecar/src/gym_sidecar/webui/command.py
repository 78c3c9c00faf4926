"""``gym-sidecar ui``: serve the web view and the Jaeger-compatible API over the store.

    gym-sidecar ui [--listen 127.0.0.1:16687] [--store-dir DIR] [--config FILE]
                   [--jaeger-url URL] [--jaeger-ui DIR] [--settle-s 10]
                   [--admin-url URL]

Reads the store that ``gym-sidecar run`` writes (the same ``--config`` /
``GYM_SIDECAR_*`` / ``--store-dir`` sources as ``gym-sidecar rollouts``), read-only, from
any process; the store may appear after the view starts. It listens on loopback unless
told otherwise (``--listen``, env ``GYM_SIDECAR_UI_LISTEN``); port 0 picks a free port.
Once listening it prints ``web view: http://HOST:PORT/`` on stdout (and ``Jaeger UI:
http://HOST:PORT/jaeger/`` with ``--jaeger-ui``, a built Jaeger UI to serve over the
store: :mod:`.jaeger_ui`). SIGINT, SIGTERM and SIGHUP stop it (exit 0: a read-only view
has nothing to reload, and SIGHUP is what a closed terminal sends); exit 2 on bad
arguments, 1 when it cannot listen.

The ``/live`` page reads the running sidecar's live view from its admin listener:
``--admin-url`` (env ``GYM_SIDECAR_UI_ADMIN_URL``), by default ``http://`` + the
configuration's ``admin_listen`` (what ``gym-sidecar run`` with the same configuration
listens on).

The listener is the sidecar's own (:mod:`gym_sidecar.wire.http1`, with the admin
listener's connection cap).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from gym_sidecar.config import ENV_CONFIG_FILE, ConfigError, load_config

DEFAULT_LISTEN = "127.0.0.1:16687"
ENV_LISTEN = "GYM_SIDECAR_UI_LISTEN"
ENV_JAEGER_URL = "GYM_SIDECAR_UI_JAEGER_URL"
ENV_JAEGER_UI = "GYM_SIDECAR_UI_JAEGER_UI"
ENV_ADMIN_URL = "GYM_SIDECAR_UI_ADMIN_URL"
ENV_UI_PREFIX = "GYM_SIDECAR_UI_"
EXIT_OK = 0
EXIT_START_FAILED = 1
EXIT_BAD_ARGS = 2


def _jaeger_url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r}")
    return text.rstrip("/")


def add_ui(subparsers: Any) -> None:
    p = subparsers.add_parser("ui", help="serve the web view of the local store (and a Jaeger API)")
    p.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get(ENV_CONFIG_FILE),
        help=f"the sidecar's YAML config, for local_store.data_dir (env {ENV_CONFIG_FILE})",
    )
    p.add_argument("--store-dir", metavar="DIR", help="the store's data directory")
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default=os.environ.get(ENV_LISTEN, DEFAULT_LISTEN),
        help=f"address to serve on (default {DEFAULT_LISTEN}, env {ENV_LISTEN})",
    )
    p.add_argument(
        "--jaeger-url",
        metavar="URL",
        type=_jaeger_url,
        default=os.environ.get(ENV_JAEGER_URL) or None,
        help=f"a Jaeger UI with the same traces, linked from trace pages (env {ENV_JAEGER_URL})",
    )
    p.add_argument(
        "--jaeger-ui",
        metavar="DIR",
        default=os.environ.get(ENV_JAEGER_UI) or None,
        help="a built Jaeger UI (jaeger-ui's build directory) to serve at /jaeger/ over the "
        f"store (env {ENV_JAEGER_UI})",
    )
    p.add_argument(
        "--admin-url",
        metavar="URL",
        default=os.environ.get(ENV_ADMIN_URL) or None,
        help="the sidecar's admin listener, read by the /live page (default: http:// + the "
        f"configuration's admin_listen; env {ENV_ADMIN_URL})",
    )
    p.add_argument(
        "--settle-s",
        type=float,
        default=10.0,
        help="a trace counts as still arriving for this long after its last spans (10)",
    )
    p.set_defaults(func=cmd_ui)


def cmd_ui(args: argparse.Namespace) -> int:
    from gym_sidecar.hostport import split_host_port
    from gym_sidecar.live.client import check_admin_url, default_admin_url
    from gym_sidecar.selfmetrics import SelfMetrics
    from gym_sidecar.webui.app import ViewConfig, build_app
    from gym_sidecar.webui.jaeger_ui import BASE_PATH, JaegerUi, JaegerUiError
    from gym_sidecar.wire.http1.connection_limits import ConnectionLimits
    from gym_sidecar.wire.http1.listener import AsgiListener

    overrides: dict[str, Any] = {}
    if args.store_dir is not None:
        overrides = {"local_store": {"data_dir": args.store_dir}}
    try:
        # GYM_SIDECAR_UI_* are this command's own settings (read above), not config keys
        environ = {k: v for k, v in os.environ.items() if not k.startswith(ENV_UI_PREFIX)}
        cfg = load_config(args.config, environ, overrides)
        split_host_port(args.listen)
        admin_url = (
            check_admin_url(args.admin_url)
            if args.admin_url is not None
            else default_admin_url(cfg.admin_listen)
        )
    except (ConfigError, ValueError) as exc:
        print(f"gym-sidecar ui: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGS
    if args.settle_s < 0:
        print("gym-sidecar ui: --settle-s must not be negative", file=sys.stderr)
        return EXIT_BAD_ARGS
    if args.jaeger_url is not None:
        try:
            args.jaeger_url = _jaeger_url(args.jaeger_url)
        except argparse.ArgumentTypeError as exc:
            print(f"gym-sidecar ui: --jaeger-url: {exc}", file=sys.stderr)
            return EXIT_BAD_ARGS
    jaeger_ui = None
    if args.jaeger_ui is not None:
        try:
            jaeger_ui = JaegerUi(Path(args.jaeger_ui).expanduser())
        except (JaegerUiError, OSError) as exc:
            print(f"gym-sidecar ui: --jaeger-ui: {exc}", file=sys.stderr)
            return EXIT_BAD_ARGS
    view = ViewConfig(
        store_path=cfg.local_store.db_path(),
        jaeger_url=args.jaeger_url,
        jaeger_ui=jaeger_ui,
        settle_s=args.settle_s,
        admin_url=admin_url,
    )
    metrics = SelfMetrics()
    limits = ConnectionLimits.from_config(cfg.limits, metrics, "admin_max_connections")
    listener = AsgiListener(build_app(view), args.listen, "web view", limits)

    async def serve() -> None:
        await listener.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # before the URL is printed: whoever waits for that line may signal at once
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        print(f"web view: http://{listener.address}/", flush=True)
        if jaeger_ui is not None:
            print(f"Jaeger UI: http://{listener.address}{BASE_PATH}/", flush=True)
        print(f"store: {view.store_path}", flush=True)
        try:
            await stop.wait()
        finally:
            await listener.stop(grace_s=2.0)

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve())
    except OSError as exc:
        print(f"gym-sidecar ui: cannot start: {exc}", file=sys.stderr)
        return EXIT_START_FAILED
    return EXIT_OK
