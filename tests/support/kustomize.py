"""kustomize for the deployment tests: a pinned release, built once from the Go module proxy.

:func:`kustomize_command` returns the command that renders a kustomization directory
(the directory is appended as the last argument):

1. the pinned ``kustomize`` binary cached under ``~/.cache/gym-telemetry/peers/``
   (outside the repository), built there the first time with
   ``go install sigs.k8s.io/kustomize/kustomize/v5@<version>`` (minutes cold: the Go
   module proxy serves the sources). ``go`` is the one on PATH; on a linux-amd64 machine
   without one, a pinned Go toolchain is fetched first, as the Go module it is
   (``golang.org/toolchain`` on the module proxy, the way ``GOTOOLCHAIN`` fetches one),
   checked against its pinned checksum-database hash, and cached beside it;
2. otherwise ``kubectl kustomize`` when ``kubectl`` is on PATH (kubectl embeds kustomize);
3. otherwise :class:`KustomizeUnavailable`.

The pinned build is preferred so that every machine renders with the same kustomize.
A lock file serialises concurrent first builds (pytest-xdist, parallel sessions).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from functools import cache
from pathlib import Path

KUSTOMIZE_VERSION = "v5.5.0"
"""Same as the kustomize embedded in kubectl 1.32, so both fall-backs agree."""
KUSTOMIZE_MODULE = "sigs.k8s.io/kustomize/kustomize/v5"
PEERS_DIR = Path(os.environ.get("GYM_TELEMETRY_PEERS_DIR", "~/.cache/gym-telemetry/peers"))
BUILD_TIMEOUT_S = 1200


GO_TOOLCHAIN = "v0.0.1-go1.23.4.linux-amd64"
"""The ``golang.org/toolchain`` module version fetched when the machine has no ``go``."""
GO_TOOLCHAIN_H1 = "h1:3fR1BkR9KVNjB0JJJvAaW1hPYsK5cgcI2/c5QWVViuQ="
"""Its hash as sum.golang.org records it (read through the proxy's sumdb endpoint)."""
GO_PROXY = "https://proxy.golang.org"


class KustomizeUnavailable(RuntimeError):
    """Neither a cached kustomize, nor ``go`` to build one, nor ``kubectl``."""


def module_zip_h1(archive: zipfile.ZipFile) -> str:
    """The Go checksum database's ``h1:`` hash of a module zip (sha256 over the sorted
    lines ``<sha256 of file>  <file name>``)."""
    lines = "".join(
        f"{hashlib.sha256(archive.read(name)).hexdigest()}  {name}\n"
        for name in sorted(n for n in archive.namelist() if not n.endswith("/"))
    )
    return "h1:" + base64.b64encode(hashlib.sha256(lines.encode()).digest()).decode()


def go_binary() -> str:
    """``go`` from PATH, else the pinned toolchain (fetched and verified on first use)."""
    found = shutil.which("go")
    if found is not None:
        return found
    if (platform.system(), platform.machine()) not in {("Linux", "x86_64")}:
        raise KustomizeUnavailable("no `go` on PATH (install Go, or kubectl)")
    home = PEERS_DIR.expanduser() / f"go-{GO_TOOLCHAIN}"
    binary, marker = home / "go" / "bin" / "go", home / ".installed"
    if marker.exists() and binary.is_file():
        return str(binary)
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists() and binary.is_file():
            return str(binary)
        url = f"{GO_PROXY}/golang.org/toolchain/@v/{GO_TOOLCHAIN}.zip"
        with urllib.request.urlopen(url, timeout=600) as response:
            archive = zipfile.ZipFile(io.BytesIO(response.read()))
        if module_zip_h1(archive) != GO_TOOLCHAIN_H1:
            raise KustomizeUnavailable(f"{url}: checksum differs from {GO_TOOLCHAIN_H1}")
        prefix = f"golang.org/toolchain@{GO_TOOLCHAIN}/"
        shutil.rmtree(home / "go", ignore_errors=True)
        for name in archive.namelist():
            if name.endswith("/") or not name.startswith(prefix):
                continue
            target = home / "go" / name[len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(name))
            # Module zips keep no modes: the toolchain's programs are made executable.
            if "/bin/" in name or "/pkg/tool/" in name:
                target.chmod(0o755)
        marker.write_text(GO_TOOLCHAIN)
    return str(binary)


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
