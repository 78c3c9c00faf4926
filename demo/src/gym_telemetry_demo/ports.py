"""Free loopback ports and waiting for a server to listen.

Used by the demo (``gym_telemetry_demo``) to place its Gym servers and sidecar, and by the
test suite and benchmarks (``tests/support/ports.py`` re-exports these).
"""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

_FALLBACK_EPHEMERAL_LOW = 32768
_rng = random.SystemRandom()  # unaffected by tests that seed the global generator


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for ``bind(0)`` and outgoing connections."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii")
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    Picked at random *below* the kernel's ephemeral range, so that no outgoing
    connection (every client on a machine shared by parallel runs) can take it between
    this call and the server's bind; the kernel's ``bind(0)`` is the fallback.
    """
    low = _ephemeral_low()
    if low > 11000:
        for _ in range(50):
            port = _rng.randrange(10000, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, timeout_s: float = 20.0, host: str = "127.0.0.1") -> None:
    """Block until something accepts TCP connections on host:port; TimeoutError after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s}s")
