"""Reading a sidecar's live view from another process (the web view, ``gym-sidecar live``).

:func:`fetch_live` GETs ``<admin URL>/v1/rollouts/live`` with a timeout and returns the
checked :class:`~gym_sidecar.live.view.LiveView`, or raises :class:`LiveUnavailable` with
a one-line reason (not reachable, an HTTP error, a body that is not a live view). The body
is read up to :data:`MAX_BODY_BYTES`. Blocking: call it off the event loop.

:func:`default_admin_url` is where a sidecar with this machine's configuration answers:
``http://`` + its ``admin_listen`` (a wildcard host read as loopback).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Final

from gym_sidecar.hostport import join_host_port, split_host_port
from gym_sidecar.live.view import LIVE_PATH, LiveView

MAX_BODY_BYTES: Final = 64 * 1024 * 1024
DEFAULT_TIMEOUT_S: Final = 3.0


class LiveUnavailable(Exception):
    """The live view could not be read; the message says why, on one line."""


def default_admin_url(admin_listen: str) -> str:
    host, port = split_host_port(admin_listen)
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1" if host != "::" else "::1"
    return "http://" + join_host_port(host, port)


def check_admin_url(text: str) -> str:
    """``text`` if it is an ``http(s)://host[:port]`` URL (trailing ``/`` removed), else
    ValueError."""
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) URL: {text!r}")
    return text.rstrip("/")


def fetch_live(admin_url: str, limit: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> LiveView:
    """The live view of the sidecar whose admin listener is at ``admin_url``."""
    url = f"{admin_url}{LIVE_PATH}?limit={int(limit)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = response.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise LiveUnavailable(f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise LiveUnavailable(f"{admin_url} is not reachable: {reason}") from None
    if len(body) > MAX_BODY_BYTES:
        raise LiveUnavailable(f"{url}: answer larger than {MAX_BODY_BYTES} bytes")
    try:
        return LiveView.from_json(json.loads(body))
    except ValueError as exc:
        raise LiveUnavailable(f"{url}: not a live view ({exc})") from None
