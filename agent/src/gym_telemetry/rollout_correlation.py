"""Rollout correlation: the ContextVar that holds the current rollout id.

One correlation scheme, not two: when NeMo Gym is installed, this module reads and sets
Gym's own ContextVar (the one behind ``nemo_gym.rollout_correlation.current_rollout_id``,
set by Gym's ``RolloutContextMiddleware`` and the agent's ``/run`` wrapper). Without Gym,
or when importing it fails for any reason, it uses a ContextVar of its own with the
same semantics.

Resolution is lazy and happens once, on the first call of ``current_rollout_id`` or
``rollout_context`` (or an explicit ``resolve()``): if ``nemo_gym.rollout_correlation``
is already imported, it is used as is; otherwise it is imported only when the
``nemo_gym`` distribution is present. Afterwards ``current_rollout_id`` costs one
``ContextVar.get``.

A fallback source: ``set_fallback(fn)`` makes ``current_rollout_id`` return ``fn()``
when the primary source (Gym's ContextVar, or this module's own) holds no id; then it
costs one more call on that path only. The Gym integration uses it with this module's
own ContextVar, set through ``own_rollout_context`` without touching Gym's
(``gym_telemetry.autoinstrument.correlation``). ``ROLLOUT_ID_VAR`` is the only rollout
ContextVar this package owns.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any, Final

_log = logging.getLogger(__name__)

GYM_MODULE: Final = "nemo_gym.rollout_correlation"

#: This package's own ContextVar (the only one): the primary source when NeMo Gym is not
#: importable; with Gym, what ``own_rollout_context`` sets and a fallback may read.
ROLLOUT_ID_VAR: Final[ContextVar[str | None]] = ContextVar("gym_telemetry_rollout_id", default=None)


class _State:
    """Resolved correlation backend: the primary getter, the optional fallback, the
    getter readers call (the two composed), and a context-manager factory."""

    __slots__ = ("fallback", "from_gym", "get", "primary", "resolved", "set_ctx")

    def __init__(self) -> None:
        self.get: Callable[[], str | None] = _resolve_and_get
        self.primary: Callable[[], str | None] = ROLLOUT_ID_VAR.get
        self.fallback: Callable[[], str | None] | None = None
        self.set_ctx: Callable[[str | None], AbstractContextManager[None]] = _own_context
        self.resolved = False
        self.from_gym = False


def _var_context(var: ContextVar[Any]) -> Callable[[str | None], AbstractContextManager[None]]:
    """A ``rollout_context`` factory that sets ``var`` for the block and resets it after."""

    @contextmanager
    def ctx(rollout_id: str | None) -> Iterator[None]:
        token = var.set(rollout_id)
        try:
            yield
        finally:
            var.reset(token)

    return ctx


_own_context: Final = _var_context(ROLLOUT_ID_VAR)


def _resolve_and_get() -> str | None:
    resolve()
    return _STATE.get()


_STATE: Final = _State()
_lock = threading.Lock()


def _load_gym_module() -> Any:
    """The already-imported or importable Gym module, or None. Never raises."""
    mod = sys.modules.get(GYM_MODULE)
    if mod is not None:
        return mod
    try:
        if importlib.util.find_spec("nemo_gym") is None:
            return None
        return importlib.import_module(GYM_MODULE)
    except BaseException as exc:  # a broken Gym install must never break the agent
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        _log.info("gym_telemetry: nemo_gym present but not importable (%r); own ContextVar", exc)
        return None


def resolve(force: bool = False) -> bool:
    """Bind to Gym's ContextVar when Gym is importable. Idempotent; thread-safe.

    Returns True when Gym's correlation is in use. ``force`` re-resolves (tests).
    """
    with _lock:
        if _STATE.resolved and not force:
            return _STATE.from_gym
        getter: Callable[[], str | None] = ROLLOUT_ID_VAR.get
        set_ctx: Callable[[str | None], AbstractContextManager[None]] = _own_context
        from_gym = False
        mod = _load_gym_module()
        if mod is not None:
            var = getattr(mod, "_ROLLOUT_ID", None)
            gym_get = getattr(mod, "current_rollout_id", None)
            gym_ctx = getattr(mod, "rollout_context", None)
            if isinstance(var, ContextVar):
                getter = var.get
                set_ctx = gym_ctx if callable(gym_ctx) else _var_context(var)
                from_gym = True
            elif callable(gym_get) and callable(gym_ctx):
                getter = gym_get
                set_ctx = gym_ctx
                from_gym = True
        _STATE.primary = getter
        _STATE.get = _compose(getter, _STATE.fallback)
        _STATE.set_ctx = set_ctx
        _STATE.from_gym = from_gym
        _STATE.resolved = True
        return from_gym


def uses_gym() -> bool:
    """Whether the correlation is Gym's own (resolves on first use)."""
    return resolve()


def current_rollout_id() -> str | None:
    """The rollout id of the current context, or None. Never raises."""
    try:
        return _STATE.get()
    except Exception:  # a foreign getter must never break a handler
        return None


def rollout_context(rollout_id: str | None) -> AbstractContextManager[None]:
    """Context manager that sets the rollout id for the enclosed code, then restores it."""
    if not _STATE.resolved:
        resolve()
    return _STATE.set_ctx(rollout_id)


def getter() -> Callable[[], str | None]:
    """The resolved getter itself (for hot paths that want to skip one call level)."""
    if not _STATE.resolved:
        resolve()
    return _STATE.get


def own_rollout_context(rollout_id: str | None) -> AbstractContextManager[None]:
    """Context manager that sets ``ROLLOUT_ID_VAR`` (never Gym's ContextVar) for the
    enclosed code, then restores it."""
    return _own_context(rollout_id)


def _compose(
    primary: Callable[[], str | None], fallback: Callable[[], str | None] | None
) -> Callable[[], str | None]:
    if fallback is None or fallback == primary:
        return primary

    def current() -> str | None:
        return primary() or fallback()

    return current


def set_fallback(fallback: Callable[[], str | None] | None) -> None:
    """Make ``current_rollout_id`` return ``fallback()`` when the primary source has no
    id; ``None`` removes it. One fallback at a time (a new one replaces the old).

    The fallback must be cheap and must not raise (an exception reads as no id). It
    survives re-resolution. A fallback equal to the primary getter is not called twice.
    Thread-safe; takes effect on the next ``current_rollout_id`` call.
    """
    resolve()
    with _lock:
        _STATE.fallback = fallback
        _STATE.get = _compose(_STATE.primary, fallback)
