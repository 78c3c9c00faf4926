#!/usr/bin/env python3
"""Build, cache and reuse a Jaeger v2 binary, compiled from the Go module proxy.

Usage::

    python3 scripts/jaeger_build.py ensure     # build if absent/incomplete; print the binary
    python3 scripts/jaeger_build.py path       # print where the binary lives (no build)
    python3 scripts/jaeger_build.py version    # the Jaeger 2.x release that gets built

Why from source: the project's machines have Go and the Go module proxy but no Docker
engine, so the ``jaegertracing/jaeger`` image that ``docker-compose.yml`` runs cannot run
here. Jaeger publishes each release twice, as v1.x for the Go module and as v2.y for the
binary and image; module ``v1.76.0`` is release ``2.13.0`` (its CHANGELOG.md heading reads
"v1.76.0 / v2.13.0 (2025-12-03)"), and compose pins the image to the same release.

How: a throwaway Go module is created, ``go get -tool`` adds
``github.com/jaegertracing/jaeger/cmd/jaeger@v1.76.0`` to it (``go install pkg@version``
refuses modules whose go.mod has ``replace`` lines, Jaeger's does), and ``go build``
compiles the package with the version variables that Jaeger's own Makefile sets through
``-ldflags``, so ``jaeger version`` names the release.

Contract:
- The binary lives outside the repository, in ``$GYM_TELEMETRY_PEERS_DIR`` (default
  ``~/.cache/gym-telemetry/peers``) ``/jaeger-<module version>/bin/jaeger``.
- A ``.complete`` marker (holding the recipe) is written only after the build and a
  ``jaeger version`` check succeeded; a directory without it (or with another recipe) is
  deleted and rebuilt. A lock file serialises concurrent callers (they wait).
- Go's module and build caches (``GOMODCACHE``, ``GOCACHE``) live in
  ``<peers>/go/mod`` and ``<peers>/go/build``, so a rebuild (a new version, a wiped
  binary) reuses what was downloaded and compiled before. ``GOFLAGS=-mod=mod`` and
  ``GOTOOLCHAIN=local`` are set for the build only: the machine's ``go`` is used as is.
- Needs only the standard library and ``go`` on PATH (or ``$GO``). The first build
  downloads a few hundred modules and compiles them: several minutes on two cores; the
  time taken is printed on stderr. Output of the build steps goes to stderr; stdout
  carries only the result.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

MODULE = "github.com/jaegertracing/jaeger"
PACKAGE = f"{MODULE}/cmd/jaeger"
MODULE_VERSION = os.environ.get("GYM_TELEMETRY_JAEGER_MODULE_VERSION", "v1.76.0")
# The 2.x release each module version is (the CHANGELOG heading "v1.x.y / v2.a.b (date)").
RELEASES = {"v1.76.0": ("2.13.0", "2025-12-03T00:00:00Z")}
# Bump when the build steps change, so old builds are not reused.
RECIPE_VERSION = "1"
MARKER = ".complete"
BUILD_TIMEOUT_S = 3600


def _log(msg: str) -> None:
    print(f"jaeger_build: {msg}", file=sys.stderr, flush=True)


def peers_dir() -> Path:
    """The cache directory shared by the tests' independent peers (rotel, Jaeger)."""
    default = Path.home() / ".cache" / "gym-telemetry" / "peers"
    return Path(os.environ.get("GYM_TELEMETRY_PEERS_DIR", default)).expanduser()


def release(module_version: str = MODULE_VERSION) -> str:
    """The Jaeger 2.x release that module ``module_version`` is (``2.13.0``)."""
    try:
        return RELEASES[module_version][0]
    except KeyError:
        raise RuntimeError(
            f"jaeger_build: module {module_version} has no known 2.x release; add it to RELEASES"
        ) from None


def build_dir(module_version: str = MODULE_VERSION) -> Path:
    return peers_dir() / f"jaeger-{module_version}"


def binary_path(module_version: str = MODULE_VERSION) -> Path:
    """Where the binary of ``module_version`` lives (it may not exist yet)."""
    return build_dir(module_version) / "bin" / "jaeger"


def _marker_text(module_version: str) -> str:
    return f"{PACKAGE}@{module_version} recipe {RECIPE_VERSION}\n"


def is_built(module_version: str = MODULE_VERSION) -> bool:
    marker = build_dir(module_version) / MARKER
    try:
        return marker.read_text() == _marker_text(module_version)
    except OSError:
        return False


def _go() -> str:
    found = os.environ.get("GO") or shutil.which("go")
    if not found:
        raise SystemExit(
            "jaeger_build: `go` is not on PATH (set GO=/path/to/go); Jaeger is built from "
            "the Go module proxy"
        )
    return found


def go_env() -> dict[str, str]:
    """The environment of the Go build steps: caches inside the peers directory."""
    env = dict(os.environ)
    go_root = peers_dir() / "go"
    env.update(
        GOMODCACHE=str(go_root / "mod"),
        GOCACHE=str(go_root / "build"),
        GOFLAGS="-mod=mod",
        GOTOOLCHAIN="local",
    )
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
    """Run a build step; its output goes to stderr (stdout carries only the result)."""
    _log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, cwd=cwd, env=env, stdout=2, timeout=BUILD_TIMEOUT_S)


def _build(module_version: str) -> None:
    root = build_dir(module_version)
    if root.exists():
        _log(f"removing incomplete build {root}")
        shutil.rmtree(root)
    (root / "bin").mkdir(parents=True)
    go, env = _go(), go_env()
    version, date = release(module_version), RELEASES[module_version][1]
    ldflags = " ".join(
        f"-X {MODULE}/internal/version.{name}={value}"
        for name, value in (
            ("latestVersion", f"v{version}"),
            ("date", date),  # the release date; a module zip carries no git commit
        )
    )
    started = time.monotonic()
    _run([go, "mod", "init", "gym-telemetry.invalid/jaeger-build"], root, env)
    _run([go, "get", "-tool", f"{PACKAGE}@{module_version}"], root, env)
    fetched = time.monotonic()
    _run(
        [go, "build", "-ldflags", ldflags, "-o", str(binary_path(module_version)), PACKAGE],
        root,
        env,
    )
    built = time.monotonic()
    out = subprocess.run(
        [str(binary_path(module_version)), "version"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    _log(f"built: jaeger version says {out.stdout.strip()}")
    (root / MARKER).write_text(_marker_text(module_version))
    _log(
        f"Jaeger {version} (module {module_version}) built in {built - started:.0f} s "
        f"(go get {fetched - started:.0f} s, go build {built - fetched:.0f} s)"
    )


def ensure(module_version: str = MODULE_VERSION) -> Path:
    """Return the binary, building it first when absent or incomplete.

    Blocks while another caller builds it (file lock next to the build directory).
    """
    if is_built(module_version):
        return binary_path(module_version)
    root = build_dir(module_version)
    root.parent.mkdir(parents=True, exist_ok=True)
    with root.with_name(root.name + ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not is_built(module_version):
                _log(f"building Jaeger {release(module_version)} into {root} (minutes, once)")
                _build(module_version)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return binary_path(module_version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("command", choices=["ensure", "path", "version"])
    args = parser.parse_args(argv)
    if args.command == "path":
        print(binary_path())
    elif args.command == "version":
        print(release())
    else:
        try:
            print(ensure())
        except subprocess.CalledProcessError as exc:
            _log(f"failed: {' '.join(map(str, exc.cmd))} exited with {exc.returncode}")
            return 1
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            _log(f"failed: {exc}")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
