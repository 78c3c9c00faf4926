"""Reloading span groups from the config file: on change on disk, and on SIGHUP.

:class:`ConfigReloader` owns a ``load`` callable (supplied by the server: it re-reads the
file with the same environment and flags as at start and returns the ``span_groups``
section, raising on an invalid file) and a :class:`SpanGroupState` to apply it to.

- :meth:`ConfigReloader.reload` is what the server's SIGHUP hook calls: load and apply,
  always (also discarding PUT changes).
- :meth:`ConfigReloader.run` is a loop task that checks the file every
  ``watch_interval_s``: ``stat`` first (mtime, size, inode: a ConfigMap's symlink swap
  changes them), then the content's hash, and reloads only when the content changed.
  The stat and read run in a worker thread, so the loop never blocks on disk.

An invalid file is logged (every error) and counted; the policy in force stays.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from gym_sidecar.gating.config import SpanGroupsConfig
from gym_sidecar.gating.state import SpanGroupState

_log = logging.getLogger(__name__)

_Signature = tuple[int, int, int]


def _stat(path: Path) -> _Signature | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


class ConfigReloader:
    """Applies the config file's ``span_groups`` section to ``state`` when asked or changed."""

    def __init__(
        self,
        state: SpanGroupState,
        path: str | Path | None,
        load: Callable[[], SpanGroupsConfig],
    ) -> None:
        self.state = state
        self.path = Path(path) if path is not None else None
        self.load = load
        self._signature: _Signature | None = None
        self._digest: str | None = None
        self._stopping = asyncio.Event()

    def baseline(self) -> None:
        """Remember the file as it is now (the version loaded at start). Blocking I/O."""
        if self.path is not None:
            self._signature = _stat(self.path)
            self._digest = _digest(self.path)

    def reload(self, source: str = "sighup") -> bool:
        """Load the file and apply its span groups. Returns whether the policy changed.

        Never raises: a load error is logged and counted and the current policy stays.
        Blocking (reads the file); cheap enough for a signal handler on the loop.
        """
        try:
            config = self.load()
        except Exception as exc:  # boundary: any loader failure must not kill the sidecar
            self.state.record_invalid(source)
            _log.error(
                "span groups: %s reload refused, keeping generation %d: %s",
                source,
                self.state.policy.generation,
                exc,
            )
            return False
        return self.state.apply_config(config, source)

    async def check_once(self) -> bool:
        """Reload if the file's content changed since the last check. Returns whether
        a reload was attempted."""
        if self.path is None:
            return False
        signature = await asyncio.to_thread(_stat, self.path)
        if signature is None or signature == self._signature:
            return False
        self._signature = signature
        digest = await asyncio.to_thread(_digest, self.path)
        if digest is None or digest == self._digest:
            return False
        self._digest = digest
        self.reload("file")
        return True

    async def run(self) -> None:
        """Check the file every ``watch_interval_s`` until :meth:`stop` (0: paused)."""
        if self.path is None:
            return
        if self._signature is None:
            await asyncio.to_thread(self.baseline)
        while True:
            interval = self.state.settings.watch_interval_s
            # 0 pauses watching; a later SIGHUP may set it again, so keep waking up.
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=interval or 1.0)
                return
            except TimeoutError:
                pass
            if interval > 0:
                await self.check_once()

    def stop(self) -> None:
        """Make :meth:`run` return at its next wake-up. Safe to call twice."""
        self._stopping.set()
