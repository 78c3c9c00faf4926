"""kustomize for the deployment tests: a pinned release, built once from the Go module proxy.

:func:`kustomize_command` returns the command that renders a kustomization directory
(the directory is appended as the last argument):

1. the pinned ``kustomize`` binary cached under ``~/.cache/gym-telemetry/peers/``
   (outside the repository), built there the first time with
   ``go install sigs.k8s.io/kustomize/kustomize/v5@<version>`` (minutes cold: the Go
   module proxy serves the sources), with the ``go`` on PATH;
2. otherwise ``kubectl kustomize`` when ``kubectl`` is on PATH (kubectl embeds kustomize);
3. otherwise :class:`KustomizeUnavailable`.

The pinned build is preferred so that every machine renders with the same kustomize.
A lock file serialises concurrent first builds (pytest-xdist, parallel sessions).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

KUSTOMIZE_VERSION = "v5.5.0"
"""Same as the kustomize embedded in kubectl 1.32, so both fall-backs agree."""
KUSTOMIZE_MODULE = "sigs.k8s.io/kustomize/kustomize/v5"
PEERS_DIR = Path(os.environ.get("GYM_TELEMETRY_PEERS_DIR", "~/.cache/gym-telemetry/peers"))
BUILD_TIMEOUT_S = 1200


class KustomizeUnavailable(RuntimeError):
    """Neither a cached kustomize, nor ``go`` to build one, nor ``kubectl``."""


def go_binary() -> str:
    """``go`` from PATH (every machine of this project has it)."""
    found = shutil.which("go")
    if found is None:
        raise KustomizeUnavailable("no `go` on PATH to build kustomize (install Go, or kubectl)")
    return found


def kustomize_binary(version: str = KUSTOMIZE_VERSION) -> Path:
    """Build ``kustomize@version`` into its cached directory if missing; return the binary.

    Idempotent; an interrupted build leaves no marker and is redone. Raises
    :class:`KustomizeUnavailable` when no ``go`` can be had, CalledProcessError or
    OSError when the fetch or the build fails.
    """
    home = PEERS_DIR.expanduser() / f"kustomize-{version}"
    binary, marker = home / "bin" / "kustomize", home / ".installed"
    if marker.exists() and binary.is_file():
        return binary
    go = go_binary()
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent caller may be building it
        if marker.exists() and binary.is_file():
            return binary
        env = dict(os.environ)
        env.update(
            GOBIN=str(home / "bin"),
            # Module and build caches beside the binary: nothing lands in the user's GOPATH.
            GOPATH=str(home / "gopath"),
            GOCACHE=str(home / "gocache"),
            GOFLAGS="-modcacherw",
            CGO_ENABLED="0",
            GOTOOLCHAIN="local",  # build with this go, fetch no other
        )
        subprocess.run(
            [go, "install", f"{KUSTOMIZE_MODULE}@{version}"],
            check=True,
            env=env,
            timeout=BUILD_TIMEOUT_S,
        )
        if not binary.is_file():
            raise KustomizeUnavailable(f"go install succeeded but {binary} is missing")
        for scratch in ("gocache", "gopath"):  # only the binary is needed afterwards
            shutil.rmtree(home / scratch, ignore_errors=True)
        marker.write_text(version)
    return binary


@cache
def kustomize_command() -> tuple[str, ...]:
    """``(kustomize, "build")`` or ``(kubectl, "kustomize")``; the directory goes last."""
    try:
        return (str(kustomize_binary()), "build")
    except (KustomizeUnavailable, OSError, subprocess.SubprocessError) as exc:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise KustomizeUnavailable(f"{exc}; and no kubectl on PATH") from exc
        return (kubectl, "kustomize")


def kustomize_build(directory: Path) -> str:
    """The rendered YAML stream of the kustomization in ``directory``."""
    return subprocess.run(
        [*kustomize_command(), str(directory)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout


if __name__ == "__main__":
    print(" ".join(kustomize_command()), file=sys.stdout)
