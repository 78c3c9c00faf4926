"""The native scanner's wheel for the sidecar image: the one ``make test`` built, reused.

``scripts/test.sh`` builds ``gym-telemetry-sidecar-native`` (sidecar-native/, Rust) with
the machine's cargo into uv's cache and installs it into the environment the tests run
in. The sidecar image installs that same wheel offline, from the build context's
``deploy/docker/wheels/`` (deploy/docker/sidecar.Dockerfile): :func:`stage` finds the
wheel uv built -- the one whose compiled extension has exactly the hash the installed
distribution's RECORD lists -- and copies it there. Nothing is compiled again.

The extension is read when this module is first imported (:data:`AT_IMPORT`: in a test
session, at collection, before any test runs) as well as at each call: ``make test``'s
demo tests run ``scripts/bootstrap.sh``, whose exact ``uv sync`` removes the extension
from ``.venv`` half-way through the session, and the wheel the session started with is
still the one to stage (uv's cache keeps it). Where the extension was never installed
(a plain ``uv sync``, no Rust), :func:`stage` returns None and the image is built
without it (the sidecar then runs, and says it runs, the pure-Python scanner).
Installed but no matching wheel in uv's cache (the cache was pruned since) is an error
naming the command that builds it again.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS_DIR = REPO / "deploy" / "docker" / "wheels"
"""What sidecar.Dockerfile COPYs and installs offline (``*.whl`` there are ignored by git)."""
DISTRIBUTION = "gym-telemetry-sidecar-native"
WHEEL_PREFIX = "gym_telemetry_sidecar_native-"


class NativeWheelError(RuntimeError):
    """The extension is installed but the wheel it came from cannot be found."""


def installed_extension() -> tuple[str, str] | None:
    """(RECORD path, RECORD hash) of the installed compiled extension; None when the
    distribution is not installed in this interpreter's environment."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name.endswith(".so") and file.hash is not None:
            return str(file), f"{file.hash.mode}={file.hash.value}"
    raise NativeWheelError(f"{DISTRIBUTION} is installed but its RECORD lists no extension")


AT_IMPORT = installed_extension()
"""The installed extension when this module was imported (see the module docstring)."""


def session_extension() -> tuple[str, str] | None:
    """The extension installed now, or else the one installed when this module was
    imported (None: this environment never had it)."""
    return installed_extension() or AT_IMPORT


def uv_cache_dir() -> Path:
    """uv's cache (``uv cache dir``; ``$UV_CACHE_DIR`` or ``~/.cache/uv`` without uv)."""
    uv = shutil.which("uv")
    if uv is not None:
        done = subprocess.run(
            [uv, "cache", "dir"], capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode == 0 and done.stdout.strip():
            return Path(done.stdout.strip())
    return Path(os.environ.get("UV_CACHE_DIR", Path.home() / ".cache" / "uv"))


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def _holds(wheel: Path, extension: tuple[str, str]) -> bool:
    path, want = extension
    try:
        with zipfile.ZipFile(wheel) as archive:
            return record_hash(archive.read(path)) == want
    except (OSError, KeyError, zipfile.BadZipFile):
        return False


def find_built_wheel(extension: tuple[str, str], cache: Path | None = None) -> Path | None:
    """The wheel in uv's cache whose extension is byte for byte the installed one."""
    root = cache or uv_cache_dir()
    for dirpath, dirnames, filenames in os.walk(root):
        # archive-v*: unpacked installs (thousands of files, never a .whl): not searched.
        dirnames[:] = [d for d in dirnames if not d.startswith("archive-")]
        for name in filenames:
            if name.startswith(WHEEL_PREFIX) and name.endswith(".whl"):
                wheel = Path(dirpath) / name
                if _holds(wheel, extension):
                    return wheel
    return None


def stage(into: Path = WHEELS_DIR) -> Path | None:
    """Copy the installed extension's wheel into ``into`` (the only native wheel there);
    its path, or None when the extension is not installed here."""
    extension = session_extension()
    if extension is None:
        return None
    wheel = find_built_wheel(extension)
    if wheel is None:
        raise NativeWheelError(
            f"{DISTRIBUTION} is installed but uv's cache ({uv_cache_dir()}) holds no wheel "
            "with its extension; rebuild it: uv sync --frozen --group native "
            f"--reinstall-package {DISTRIBUTION}"
        )
    into.mkdir(parents=True, exist_ok=True)
    target = into / wheel.name
    for old in into.glob(f"{WHEEL_PREFIX}*.whl"):
        if old != target:
            old.unlink()
    if not target.exists() or target.read_bytes() != wheel.read_bytes():
        shutil.copyfile(wheel, target)
    return target
