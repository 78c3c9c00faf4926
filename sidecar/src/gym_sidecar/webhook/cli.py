"""The ``gym-sidecar webhook`` subcommand: run the sidecar-injection admission webhook.

Exit codes: 0 after SIGTERM, SIGINT or SIGHUP (each stops it the same way; there is
nothing to reload on SIGHUP, certificates are reloaded on rotation by themselves), 2 on
invalid configuration, 1 when it cannot start (port in use, unreadable certificate, or the
``webhook`` extra not installed).

The webhook's server libraries come with ``gym-telemetry-sidecar[webhook]``; the plain
sidecar (and its image) does not carry them, so this module imports them only to serve.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import signal
import ssl
import sys
from typing import Any

# flag dest -> config key
_FLAGS: dict[str, str] = {
    "listen": "listen",
    "cert": "cert_file",
    "key": "key_file",
    "image": "image",
    "sidecar_mode": "sidecar_mode",
    "kubernetes_version": "kubernetes_version",
}


WEBHOOK_EXTRA_MODULES: tuple[str, ...] = ("aiohttp", "jsonpatch", "pydantic")
"""What ``gym-telemetry-sidecar[webhook]`` adds; the server needs every one."""
INSTALL_HINT = "pip install 'gym-telemetry-sidecar[webhook]' (or the gym-telemetry-webhook image)"


def missing_extra() -> list[str]:
    """The modules of the ``webhook`` extra that cannot be imported (empty: all there)."""
    missing = []
    for name in WEBHOOK_EXTRA_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def add_webhook(subparsers: Any) -> None:
    """Register ``webhook`` on the ``gym-sidecar`` subparsers."""
    p = subparsers.add_parser("webhook", help="run the sidecar-injection admission webhook (HTTPS)")
    p.add_argument("--config", metavar="FILE", help="injector YAML config file")
    g = p.add_argument_group("configuration (each flag also reads GYM_INJECTOR_<KEY>)")
    g.add_argument("--listen", metavar="HOST:PORT", help="HTTPS address (default 0.0.0.0:8443)")
    g.add_argument("--cert", metavar="FILE", help="PEM certificate chain (tls.crt)")
    g.add_argument("--key", metavar="FILE", help="PEM private key (tls.key)")
    g.add_argument("--image", metavar="IMAGE", help="sidecar image to inject")
    g.add_argument("--sidecar-mode", choices=["auto", "native", "container"])
    g.add_argument(
        "--kubernetes-version", metavar="VERSION", help="cluster version for --sidecar-mode auto"
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run_webhook)


def run_webhook(args: argparse.Namespace) -> int:
    """Load the config and serve until SIGTERM, SIGINT or SIGHUP; returns the exit code."""
    missing = missing_extra()
    if missing:
        print(
            f"gym-sidecar webhook: needs the 'webhook' extra ({', '.join(missing)} not "
            f"installed): {INSTALL_HINT}",
            file=sys.stderr,
        )
        return 1
    # Imported here: the injector's config (and yaml) would otherwise load with every
    # ``gym-sidecar`` command, including ``run`` (~4 MiB resident).
    from gym_sidecar.webhook.config import InjectorConfigError, load_injector_config

    overrides = {
        key: getattr(args, dest)
        for dest, key in _FLAGS.items()
        if getattr(args, dest, None) is not None
    }
    try:
        config = load_injector_config(args.config, overrides=overrides)
    except InjectorConfigError as exc:
        print(f"gym-sidecar webhook: {exc}", file=sys.stderr)  # ConfigError escapes
        return 2
    from gym_telemetry_semconv.safetext import SafeFormatter  # pod names are client text

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    logging.getLogger(__name__).info(
        "injecting %s as a %s",
        config.image,
        "native sidecar" if config.native_sidecar() else "plain container",
    )

    async def _main() -> None:
        from gym_sidecar.webhook.server import serve_forever  # aiohttp: only when serving

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await serve_forever(config, stop)

    try:
        asyncio.run(_main())
    except (OSError, ssl.SSLError, ValueError) as exc:
        logging.getLogger(__name__).error("cannot start: %s", exc)
        return 1
    return 0
