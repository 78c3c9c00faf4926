"""Post-import hooks: run a patch function right after a named module has executed.

``when_imported(name, patch)`` calls ``patch(module)`` as soon as module ``name`` has
finished executing, before the importer that asked for it continues -- so code that
does ``from nemo_gym.server_utils import request`` or ``from fastapi import FastAPI``
already sees the patched objects. If the module is imported already, ``patch`` runs at
once.

How: one ``MetaPathFinder`` at the front of ``sys.meta_path`` answers only for the
registered names. It asks the remaining finders for the real spec and wraps the spec's
loader so that ``exec_module`` runs the module, then the patches. Every other attribute
of the real loader is delegated, so ``importlib.resources`` and friends keep working.

A patch that raises is logged and counted (``patch_failures()``); the module itself is
imported normally either way. Thread-safe (registration is locked; imports are already
serialised per module by the import system).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_log = logging.getLogger(__name__)

Patch = Callable[[ModuleType], None]


class _State:
    __slots__ = ("failures", "lock", "patches")

    def __init__(self) -> None:
        self.patches: dict[str, list[Patch]] = {}
        self.lock = threading.Lock()
        self.failures = 0


_STATE = _State()


def _run_patches(name: str, module: ModuleType, patches: Sequence[Patch]) -> None:
    for patch in patches:
        try:
            patch(module)
        except Exception:  # boundary: a failed patch leaves the module usable, unpatched
            _STATE.failures += 1
            _log.warning(
                "gym_telemetry: patching %s failed; it stays uninstrumented", name, exc_info=True
            )


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader; runs the patches after ``exec_module``."""

    def __init__(self, wrapped: Any, name: str, patches: Sequence[Patch]) -> None:
        self._wrapped = wrapped
        self._name = name
        self._patches = tuple(patches)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._wrapped, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._wrapped.exec_module(module)
        _run_patches(self._name, module, self._patches)

    def __getattr__(self, item: str) -> Any:
        return getattr(self._wrapped, item)


class PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of registered modules (see module doc)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        patches = _STATE.patches.get(fullname)
        if not patches:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, PostImportFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec  # namespace package or legacy loader: leave it alone
            spec.loader = _PatchingLoader(spec.loader, fullname, list(patches))
            return spec
        return None


_FINDER = PostImportFinder()


def when_imported(name: str, patch: Patch) -> None:
    """Run ``patch(module)`` right after module ``name`` executes (now, if imported)."""
    with _STATE.lock:
        module = sys.modules.get(name)
        if module is None:
            _STATE.patches.setdefault(name, []).append(patch)
            if not any(f is _FINDER for f in sys.meta_path):
                sys.meta_path.insert(0, _FINDER)
            return
    _run_patches(name, module, [patch])


def patch_failures() -> int:
    """How many patch functions raised (each left its module unpatched)."""
    return _STATE.failures
