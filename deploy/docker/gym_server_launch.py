#!/usr/bin/env python3
"""Run one NeMo Gym server from a Gym config file: the gym-server image's entrypoint.

Usage::

    gym-server-launch CONFIG_FILE SERVER_NAME

``SERVER_NAME`` is a top-level key of the config, e.g. ``policy_model`` in::

    policy_model:
      responses_api_models:
        stub_model: {entrypoint: app.py, host: 0.0.0.0, port: 8000}

The config is first resolved with nemo-gym's own parser (offline, no CLI or dotenv
input), as ``gym env start`` does before it starts servers. The server's folder is
``<root>/responses_api_models/stub_model`` for the first ``<root>`` that has it,
searched in ``$GYM_SERVER_PATH`` (colon-separated; the image puts the project's
example servers there) and then in the installed nemo-gym distribution (its
shipped ``resources_servers/``, ``responses_api_agents/`` ...). The launcher then does
what Gym's own launcher does for a child server: the whole resolved config as
``NEMO_GYM_CONFIG_DICT``, the server's key as ``NEMO_GYM_CONFIG_PATH``, the folder on
``PYTHONPATH`` and as working directory, and ``exec``s ``python <entrypoint>`` (so the
server is PID 1's direct replacement and receives SIGTERM itself).

Gym servers listen on the ``host`` their config entry names, which is also the address
the other servers call them at. Where those differ -- in Kubernetes the others call a
Service name, which is no address inside the pod -- set ``GYM_SERVER_BIND_HOST`` (e.g.
``0.0.0.0``): this server then listens there, and only its own process sees the change.

With ``GYM_TELEMETRY=1`` (set in the image) the gym-telemetry agent activates inside
that process. ``--version`` prints the versions of the agent and of nemo-gym installed
beside the launcher. Exit code 2 with the usage line on a wrong number of arguments, or with a
message on a bad config or an unknown server.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

import yaml

SEARCH_PATH_ENV = "GYM_SERVER_PATH"
BIND_HOST_ENV = "GYM_SERVER_BIND_HOST"
USAGE = "usage: gym-server-launch CONFIG_FILE SERVER_NAME"


class LaunchError(Exception):
    """The config does not name a runnable server."""


def server_location(config: dict[str, Any], name: str) -> tuple[str, str, str]:
    """(kind, implementation, entrypoint) of top-level server ``name``."""
    block = config.get(name)
    if not isinstance(block, dict) or len(block) != 1:
        servers = sorted(k for k, v in config.items() if isinstance(v, dict) and k != "head_server")
        raise LaunchError(f"no server {name!r} in the config; servers: {', '.join(servers)}")
    [(kind, impls)] = block.items()
    if not isinstance(impls, dict) or len(impls) != 1:
        raise LaunchError(f"{name}.{kind} must hold exactly one server implementation")
    [(impl, settings)] = impls.items()
    entrypoint = (settings or {}).get("entrypoint", "app.py")
    return str(kind), str(impl), str(entrypoint)


def search_roots(environ: dict[str, str]) -> list[Path]:
    """Roots holding ``<kind>/<impl>/`` folders, in search order."""
    roots = [Path(p) for p in environ.get(SEARCH_PATH_ENV, "").split(os.pathsep) if p]
    roots.append(Path(sysconfig.get_paths()["purelib"]))  # nemo-gym's shipped servers
    return roots


def resolve(config: dict[str, Any], name: str, environ: dict[str, str]) -> tuple[Path, str]:
    """The server's folder and entrypoint file name; raises LaunchError."""
    kind, impl, entrypoint = server_location(config, name)
    roots = search_roots(environ)
    for root in roots:
        folder = root / kind / impl
        if (folder / entrypoint).is_file():
            return folder, entrypoint
    tried = ", ".join(str(r / kind / impl) for r in roots)
    raise LaunchError(f"{kind}/{impl}/{entrypoint} not found; looked in {tried}")


def resolve_config(path: str) -> str:
    """The config as nemo-gym's parser completes it, as YAML text."""
    # Installed with nemo-gym in the image (not in the project's own environment).
    from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
    from omegaconf import OmegaConf  # type: ignore[import-not-found,unused-ignore]

    parsed = GlobalConfigDictParser().parse(
        parse_config=GlobalConfigDictParserConfig(
            dotenv_path=None,
            initial_global_config_dict=OmegaConf.load(path),
            skip_load_from_cli=True,
            skip_load_from_dotenv=True,
            offline=True,
        )
    )
    return str(OmegaConf.to_yaml(parsed))


def bind_host(resolved: str, name: str, host: str) -> str:
    """``resolved`` (the YAML of the whole config) with server ``name`` listening on
    ``host``; every other server's address is left as the config gives it."""
    config = yaml.safe_load(resolved)
    [(kind, impls)] = config[name].items()
    [(impl, settings)] = impls.items()
    config[name][kind][impl] = {**(settings or {}), "host": host}
    return str(yaml.safe_dump(config, sort_keys=False))


def versions() -> str:
    """``--version``: what the image runs (the agent, its shared names, nemo-gym)."""
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for dist in ("gym-telemetry-agent", "gym-telemetry-semconv", "nemo-gym"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    return "gym-server-launch: " + ", ".join(parts)


def main(argv: list[str]) -> int:
    if argv == ["--version"]:
        print(versions())
        return 0
    if len(argv) != 2:
        print(f"{USAGE}\n\n{__doc__.splitlines()[0]}", file=sys.stderr)
        return 2
    config_file, name = argv
    try:
        text = Path(config_file).read_text(encoding="utf-8")
        config = yaml.safe_load(text)
        if not isinstance(config, dict):
            raise LaunchError(f"{config_file}: top level must be a mapping")
        folder, entrypoint = resolve(config, name, dict(os.environ))
        resolved = resolve_config(config_file)
        if os.environ.get(BIND_HOST_ENV, "").strip():
            resolved = bind_host(resolved, name, os.environ[BIND_HOST_ENV].strip())
    except (OSError, yaml.YAMLError, LaunchError) as exc:
        print(f"gym-server-launch: {exc}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["NEMO_GYM_CONFIG_DICT"] = resolved
    env["NEMO_GYM_CONFIG_PATH"] = name
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH")) if p)
    os.chdir(folder)
    print(f"gym-server-launch: {name}: {folder / entrypoint}", file=sys.stderr, flush=True)
    os.execve(sys.executable, [sys.executable, entrypoint], env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
