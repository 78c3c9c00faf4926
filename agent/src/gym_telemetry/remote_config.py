"""Follow the sidecar's span-group configuration: a background poller.

The sidecar is the source of truth for which span groups are on (see
docs/span-groups.md). This module polls ``GET {admin_url}/v1/span-groups?service=NAME``
every ``poll_interval_s`` (with +/-20% jitter, so a fleet does not poll in step), sends
the last ``ETag`` as ``If-None-Match`` (an unchanged config costs a 304 and nothing
else), and on a new answer swaps the process-wide enabled set with
``span_groups.set_enabled``: groups in mode ``on`` or ``metrics`` are enabled, ``off``
groups are disabled.

Guarantees:
- It runs in one daemon thread; nothing here ever runs on a request handler's path.
  Handlers only read the frozenset that ``set_enabled`` swaps atomically.
- Before the first answer the local configuration (``GYM_TELEMETRY_SPAN_GROUPS``) stays
  in force; when the sidecar is unreachable or answers garbage, the last known set
  stays. Failures are logged once when they start and once when they end.
- Standard library only (``urllib``), no proxy (the sidecar is local), a short timeout.

Environment: ``GYM_TELEMETRY_SIDECAR_ADMIN_URL`` (default ``http://localhost:13133``),
``GYM_TELEMETRY_POLL_INTERVAL_S`` (default 10; ``0`` disables polling).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import gym_telemetry_semconv as semconv

from gym_telemetry import environment_variables as env_vars
from gym_telemetry import span_groups

_log = logging.getLogger(__name__)

DEFAULT_ADMIN_URL: Final = f"http://localhost:{semconv.DEFAULT_ADMIN_PORT}"
DEFAULT_POLL_INTERVAL_S: Final = 10.0
#: Relative jitter applied to every wait between polls.
JITTER: Final = 0.2
#: Upper bound on one request's duration; also never more than the poll interval.
MAX_TIMEOUT_S: Final = 2.0
#: Largest answer read from the sidecar.
MAX_RESPONSE_BYTES: Final = 64 * 1024
PATH: Final = semconv.SPAN_GROUPS_PATH

_KNOWN: Final = frozenset(semconv.ALL_GROUPS)


class RemoteConfigPoller:
    """Polls the sidecar for this service's span groups in a daemon thread.

    Lifecycle: :meth:`start` once, :meth:`stop` any number of times (also unstarted).
    :meth:`poll_once` does one request synchronously (the thread's loop body; tests and
    callers that want a first answer before serving may call it directly).
    """

    def __init__(
        self,
        admin_url: str,
        service_name: str,
        poll_interval_s: float,
        apply: Callable[[Iterable[str]], None] = span_groups.set_enabled,
        jitter: float = JITTER,
    ) -> None:
        if poll_interval_s <= 0:
            raise ValueError("poll_interval_s must be > 0")
        query = urllib.parse.urlencode({"service": service_name})
        self.url = admin_url.rstrip("/") + PATH + "?" + query
        self.service_name = service_name
        self.poll_interval_s = poll_interval_s
        self.timeout_s = min(MAX_TIMEOUT_S, poll_interval_s)
        self.jitter = jitter
        self._apply = apply
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.etag: str | None = None
        self.last_groups: frozenset[str] | None = None
        """The set last received from the sidecar (None before the first answer)."""
        self.polls = 0
        self.updates = 0
        self.not_modified = 0
        self.failures = 0
        self._failing = False

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        """Start the daemon thread (first poll immediately). Idempotent."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name="gym-telemetry-span-groups", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread and wait up to ``timeout_s`` for it. Safe twice or unstarted."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # thread boundary: a bug here must not end polling
                self._failed(f"poller error: {exc!r}")
            spread = self.poll_interval_s * self.jitter
            if self._stop.wait(self.poll_interval_s + random.uniform(-spread, spread)):
                return

    # -- one poll ------------------------------------------------------------------
    def poll_once(self) -> bool:
        """One GET; applies a new answer. Returns whether the enabled set was replaced.

        Never raises: every failure keeps the current set and is counted.
        """
        self.polls += 1
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        if self.etag is not None:
            request.add_header("If-None-Match", self.etag)
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                body = response.read(MAX_RESPONSE_BYTES + 1)
                etag = response.headers.get("ETag")
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 304:
                self.not_modified += 1
                self._recovered()
                return False
            self._failed(f"HTTP {exc.code}")
            return False
        except (OSError, ValueError) as exc:  # URLError, timeouts, resets, bad URL
            self._failed(str(getattr(exc, "reason", exc)))
            return False
        groups = self._parse(body)
        if groups is None:
            return False
        self._recovered()
        self.etag = etag
        self.last_groups = groups
        self.updates += 1
        self._apply(groups)
        return True

    def _parse(self, body: bytes) -> frozenset[str] | None:
        if len(body) > MAX_RESPONSE_BYTES:
            self._failed(f"answer larger than {MAX_RESPONSE_BYTES} bytes")
            return None
        try:
            doc = json.loads(body)
            enabled = doc["enabled"]
            if not isinstance(enabled, list) or not all(isinstance(g, str) for g in enabled):
                raise TypeError("'enabled' is not a list of names")
        except (ValueError, KeyError, TypeError) as exc:
            self._failed(f"unusable answer: {exc}")
            return None
        # Groups this agent does not know (a newer sidecar) are ignored, not fatal.
        return frozenset(enabled) & _KNOWN

    def _failed(self, reason: str) -> None:
        self.failures += 1
        if not self._failing:
            self._failing = True
            _log.warning(
                "gym_telemetry: cannot fetch span groups from %s (%s); keeping %s",
                self.url,
                reason,
                "the last known set" if self.last_groups is not None else "the local config",
            )

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            _log.info("gym_telemetry: span groups reachable again at %s", self.url)


# --- process-wide poller ----------------------------------------------------------------


class _Process:
    """The process-wide poller slot (replaced, never mutated, under ``lock``)."""

    __slots__ = ("lock", "poller")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.poller: RemoteConfigPoller | None = None


_PROCESS: Final = _Process()


def poll_interval_from_env(environ: Mapping[str, str] | None = None) -> float:
    """``GYM_TELEMETRY_POLL_INTERVAL_S`` as a float (default 10; bad values: default)."""
    env = os.environ if environ is None else environ
    raw = env.get(env_vars.GYM_TELEMETRY_POLL_INTERVAL_S, "").strip()
    if not raw:
        return DEFAULT_POLL_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        _log.warning(
            "gym_telemetry: %s=%r is not a number; using %s",
            env_vars.GYM_TELEMETRY_POLL_INTERVAL_S,
            raw,
            DEFAULT_POLL_INTERVAL_S,
        )
        return DEFAULT_POLL_INTERVAL_S
    return max(value, 0.0)


def start_polling(
    service_name: str, environ: Mapping[str, str] | None = None
) -> RemoteConfigPoller | None:
    """Start the process-wide poller for ``service_name`` from the environment.

    Returns it, or None when polling is disabled (interval 0). Replaces (stops) an
    earlier poller. Called by ``init_telemetry``; never blocks on the network.
    """
    env = os.environ if environ is None else environ
    interval = poll_interval_from_env(env)
    admin_url = env.get(env_vars.GYM_TELEMETRY_SIDECAR_ADMIN_URL, "").strip() or DEFAULT_ADMIN_URL
    with _PROCESS.lock:
        if _PROCESS.poller is not None:
            _PROCESS.poller.stop()
            _PROCESS.poller = None
        if interval <= 0:
            _log.info(
                "gym_telemetry: span-group polling disabled (%s=0)",
                env_vars.GYM_TELEMETRY_POLL_INTERVAL_S,
            )
            return None
        poller = RemoteConfigPoller(admin_url, service_name, interval)
        poller.start()
        _PROCESS.poller = poller
        return poller


def stop_polling(timeout_s: float = 2.0) -> None:
    """Stop the process-wide poller, if any. Safe to call twice. Called by
    ``shutdown_telemetry``."""
    with _PROCESS.lock:
        poller, _PROCESS.poller = _PROCESS.poller, None
    if poller is not None:
        poller.stop(timeout_s)


def current_poller() -> RemoteConfigPoller | None:
    """The process-wide poller, if one is running."""
    return _PROCESS.poller


def _restart_after_fork() -> None:
    # Threads do not survive fork: a forked server worker gets its own poller thread.
    _PROCESS.lock = threading.Lock()
    poller = _PROCESS.poller
    if poller is not None:
        poller._thread = None
        poller._stop = threading.Event()
        poller.start()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_restart_after_fork)
