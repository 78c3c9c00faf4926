#!/usr/bin/env python3
"""Build, cache and reuse the project's gateway distribution of the OpenTelemetry Collector.

Usage::

    python3 scripts/otelcol_build.py ensure     # build if absent/incomplete; print the binary
    python3 scripts/otelcol_build.py path       # where the binary lives (no build)
    python3 scripts/otelcol_build.py version    # the Collector core version it is built on
    python3 scripts/otelcol_build.py check-config deploy/gateway/tier2.yaml [...]
                                                # start the binary on each config (below)

What: the distribution is declared the Collector's own way, by a builder manifest,
``deploy/gateway/otelcol-builder.yaml``. That file is the one place where every version is
pinned (the components, and through the core version, the builder itself). The recipe:

1. the Collector builder (``go.opentelemetry.io/collector/cmd/builder``, ocb) of the
   manifest's core version is built once with :func:`go_peers.ensure` (about 40 s);
2. ocb generates the distribution's module from the manifest (``--skip-compilation``: it
   writes main.go/components.go and resolves go.mod/go.sum through the Go module proxy);
3. :mod:`go_peers` compiles that module with the shared Go module and build caches, and
   checks the binary with ``--version``.

ocb is asked only to generate so that the compile goes through go_peers like every other Go
peer (one cache, one lock, one marker, timings on stderr). ``ocb`` alone would compile the
same sources with the same ``-trimpath -ldflags='-s -w'``.

For other users of the binary (benchmarks): :func:`ensure` returns its path; :data:`GATEWAY`
is the recipe; :func:`components` lists what the manifest puts in.

Needs only the standard library and ``go`` on PATH (or ``$GO``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from go_peers import GoTool, _log, main_for
from go_peers import ensure as _ensure

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "deploy" / "gateway" / "otelcol-builder.yaml"
BUILDER_MODULE = "go.opentelemetry.io/collector/cmd/builder"
# Bump when the steps below change (the manifest's own digest is part of the recipe too).
RECIPE_VERSION = "1"

_GOMOD = re.compile(r"^\s*-\s*gomod:\s*(\S+)\s+(v\S+)\s*$", re.MULTILINE)
_DIST_FIELD = re.compile(r"^  (name|output_path):\s*(\S+)\s*$", re.MULTILINE)


def components(manifest: Path = MANIFEST) -> dict[str, str]:
    """Every Go module the manifest names (receivers, processors, ..., providers): its
    version."""
    return {module: version for module, version in _GOMOD.findall(manifest.read_text())}


def core_version(manifest: Path = MANIFEST) -> str:
    """The Collector core release the manifest is pinned to (``v0.161.0``): the version of
    its ``go.opentelemetry.io/collector`` v0.x modules, which must all agree (the builder of
    the same version is used)."""
    found = {
        version
        for module, version in components(manifest).items()
        if module.startswith("go.opentelemetry.io/collector/") and version.startswith("v0.")
    }
    if len(found) != 1:
        raise RuntimeError(f"{manifest}: the core v0.x modules disagree on a version: {found}")
    return found.pop()


def _dist(manifest: Path, key: str) -> str:
    fields = dict(_DIST_FIELD.findall(manifest.read_text()))
    if key not in fields:
        raise RuntimeError(f"{manifest}: dist.{key} is missing")
    return fields[key]


VERSION = core_version()
DIST_NAME = _dist(MANIFEST, "name")

BUILDER = GoTool(
    name="otelcol-builder",
    module=BUILDER_MODULE,
    version=VERSION,
    programs={"ocb": BUILDER_MODULE},
    check=("version",),
)


def _generate(workdir: Path, env: dict[str, str]) -> None:
    """go_peers ``generate`` step: ocb writes the distribution's module into ``workdir``."""
    ocb = _ensure(BUILDER)
    text = MANIFEST.read_text()
    text = re.sub(
        r"^  output_path:.*$", f"  output_path: {workdir}", text, count=1, flags=re.MULTILINE
    )
    manifest = workdir.parent / "otelcol-builder.yaml"
    manifest.write_text(text)
    cmd = [str(ocb), "--config", str(manifest), "--skip-compilation"]
    _log(DIST_NAME, "$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, cwd=workdir.parent, env=env, stdout=2, stderr=2, timeout=3600)


def _recipe() -> str:
    digest = hashlib.sha256(MANIFEST.read_bytes()).hexdigest()[:16]
    return f"{RECIPE_VERSION} ocb {VERSION} manifest {digest}"


GATEWAY = GoTool(
    name=DIST_NAME,
    module=DIST_NAME,
    version=VERSION,
    programs={DIST_NAME: "."},
    check=("--version",),
    ldflags="-s -w",
    recipe=_recipe(),
    generate=_generate,
)


def binary_path() -> Path:
    """Where the gateway binary lives (it may not be built yet)."""
    return GATEWAY.binary()


def ensure() -> Path:
    """The gateway binary, built first when absent (a cold build takes minutes; blocks
    while another caller builds it)."""
    return _ensure(GATEWAY)


# --- the config check -----------------------------------------------------------------

#: What :func:`check_config` sets when the environment does not: every listen address of
#: the gateway configs on a free loopback port, and a placeholder peer/backend.
LISTEN_VARIABLES = (
    "GATEWAY_OTLP_GRPC_LISTEN",
    "GATEWAY_OTLP_HTTP_LISTEN",
    "GATEWAY_HEALTH_LISTEN",
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with every gateway listen address on a free
    loopback port and the peers a config needs set to unused loopback ports, unless
    given."""
    out = dict(os.environ if env is None else env)
    for name in LISTEN_VARIABLES:
        out.setdefault(name, f"127.0.0.1:{free_port()}")
    out.setdefault("GATEWAY_TELEMETRY_HOST", "127.0.0.1")
    out.setdefault("GATEWAY_TELEMETRY_PORT", str(free_port()))
    out.setdefault("GATEWAY_TIER2_ENDPOINTS", f"[127.0.0.1:{free_port()}]")
    out.setdefault("GATEWAY_TIER2_SERVICE", "localhost")
    out.setdefault("GATEWAY_BACKEND_OTLP_GRPC", f"127.0.0.1:{free_port()}")
    return out


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def check_config(
    config: Path,
    *,
    binary: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 120.0,
) -> tuple[bool, str]:
    """Whether the gateway binary *starts* with ``config``; (ok, its log).

    ``otelcol validate`` decodes the config but does not build the tail-sampling
    policies (a bad status code or OTTL condition passes it and fails at start), so the
    check runs ``validate`` and then starts the collector for real, on loopback ports
    (:func:`check_env`), until its health_check extension answers 200 (ok) or the process
    exits (not ok); then stops it. Blocks up to ``timeout_s`` (generous: the machine may
    be loaded). The config must enable the health_check extension on
    ``GATEWAY_HEALTH_LISTEN``, as the ones in deploy/gateway do.
    """
    exe = str(binary or ensure())
    run_env = check_env(env)
    validate = subprocess.run(
        [exe, "validate", "--config", str(config)],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if validate.returncode != 0:
        return False, f"validate exited {validate.returncode}:\n{validate.stderr}"
    health = f"http://{run_env['GATEWAY_HEALTH_LISTEN']}/"
    proc = subprocess.Popen(
        [exe, "--config", str(config)],
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    ok = False
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if _healthy(health):
                ok = True
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    return ok, out.decode(errors="replace")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "check-config":
        return main_for(
            GATEWAY, args, describe="build the gym-telemetry gateway Collector distribution"
        )
    parser = argparse.ArgumentParser(description="start the gateway binary on each config")
    parser.add_argument("command")
    parser.add_argument("configs", nargs="+", type=Path)
    parsed = parser.parse_args(args)
    failed = 0
    for config in parsed.configs:
        ok, log = check_config(config)
        print(f"{config}: {'ok (started, healthy)' if ok else 'FAILED'}")
        if not ok:
            failed += 1
            print(log[-4000:], file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
