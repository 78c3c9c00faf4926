"""Debian's Chromium driven by Playwright (from PyPI), for the web view's browser tests.

:func:`chromium_binary` returns ``/usr/bin/chromium``; when the package is absent it
installs it as CI machines are provisioned: as root, ``apt-get install -y
--no-install-recommends chromium`` (``apt-get update`` first when the package is not
known), once per machine under a lock. No browser is ever downloaded by Playwright.

:func:`launch` starts it headless with the flags this machine needs: no sandbox (root),
no GPU, and no background networking, component updates, sync or QUIC (a closed network
refuses those connections), with a fresh profile directory each time (Playwright makes
one per launch).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Playwright

CHROMIUM: Final = Path("/usr/bin/chromium")
APT_TIMEOUT_S: Final = 900
FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def _peers_dir() -> Path:
    default = Path.home() / ".cache" / "gym-telemetry" / "peers"
    return Path(os.environ.get("GYM_TELEMETRY_PEERS_DIR", default)).expanduser()


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(
        ["apt-get", "-o", "DPkg::Lock::Timeout=900", *args],
        capture_output=True,
        text=True,
        timeout=APT_TIMEOUT_S,
        env=env,
        check=False,
    )


def chromium_binary() -> Path:
    """``/usr/bin/chromium``, installed from Debian's package when absent.

    Raises RuntimeError saying what to install when that cannot be done here."""
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(
            "Chromium is not installed and cannot be installed from here (needs root and "
            "apt-get): run `apt-get install -y chromium` and re-run the tests"
        )
    lock_path = _peers_dir() / "chromium-apt.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not os.access(CHROMIUM, os.X_OK):
                started = time.monotonic()
                result = _apt("install", "-y", "--no-install-recommends", "chromium")
                if result.returncode != 0:
                    _apt("update")
                    result = _apt("install", "-y", "--no-install-recommends", "chromium")
                if result.returncode != 0:
                    raise RuntimeError(f"apt-get install chromium failed:\n{result.stderr[-3000:]}")
                print(f"browser: installed Debian's chromium in {time.monotonic() - started:.0f} s")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if not os.access(CHROMIUM, os.X_OK):
        raise RuntimeError(f"apt-get installed chromium but {CHROMIUM} is missing")
    return CHROMIUM


def launch(playwright: Playwright) -> Browser:
    """A headless Debian Chromium. Playwright gives every launch a new empty profile
    directory of its own (its ``--user-data-dir``, removed on close)."""
    return playwright.chromium.launch(
        executable_path=str(chromium_binary()), headless=True, args=list(FLAGS)
    )
