"""Rollout correlation: the rollout id, in one module.

Everything the agent does with the rollout id lives here: the ContextVar that holds it
(Gym's own when Gym is installed), telemetry's own ContextVar and the fallback that
reads it, the readers that find an id in a ``/ng-rollout/<id>/`` path prefix and in a
``/run`` body, the ASGI step that makes an id current for a request, and
``ENCLOSING_ROLLOUT``, which says whether a recorded rollout span encloses the code.
(The W3C baggage member that carries the id between processes is read and written by
``autoinstrument.propagation``, with the rest of the baggage header.)

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
(``bind_fallback``). ``ROLLOUT_ID_VAR`` is the only rollout-id ContextVar this package
owns.

Why a fallback: Gym sets its rollout ContextVar only when rollout capture is on
(``observability_enabled``); otherwise Gym's ``current_rollout_id()`` is None in all
three processes. Writing an id into Gym's ContextVar ourselves would change what Gym
does (some agents prefix model URLs or key sessions by it), so telemetry keeps the id it
learns (from the hop's baggage, a ``/ng-rollout/<id>/`` path, the ``/run`` body) in
``ROLLOUT_ID_VAR`` instead, and ``current_rollout_id()`` returns Gym's id when Gym has
one, else this one. Gym's own ContextVar and behaviour are left exactly as they were.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

from gym_telemetry.inflight import InFlight

if TYPE_CHECKING:  # types only: this module stays standard library at run time
    from gym_telemetry.asgi import ASGIApp, Receive, Scope, Send

_log = logging.getLogger(__name__)

GYM_MODULE: Final = "nemo_gym.rollout_correlation"
#: Gym's URL prefix for rollout-scoped calls: ``/ng-rollout/<id>/...``.
ROLLOUT_PATH_PREFIX: Final = "/ng-rollout/"
#: Longest rollout id accepted from the wire.
MAX_ROLLOUT_ID_CHARS: Final = 256
#: Largest raw ``/run`` body read to find the rollout id (handlers taking ``Request``).
MAX_RAW_BODY_BYTES: Final = 8 * 1024 * 1024

_ROLLOUT_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

#: This package's own ContextVar (the only one): the primary source when NeMo Gym is not
#: importable; with Gym, what ``own_rollout_context`` sets and a fallback may read.
ROLLOUT_ID_VAR: Final[ContextVar[str | None]] = ContextVar("gym_telemetry_rollout_id", default=None)

#: True while code runs inside a *recorded* ``gym.rollout`` span: this process's (set by
#: the rollout wrapper only when its span is recording), or an upstream one (set by the
#: Gym integration's SERVER layer when the request's baggage carries the outer-rollout
#: marker, which ``propagation.inject`` writes only while this is true). A
#: ``gym.rollout`` span started while it is true is marked
#: ``nemo.gym.rollout.nested=true``, and the sidecar derives rollout metrics from the
#: outermost span only. A rollout id that merely arrived from upstream does not set it:
#: the caller may have recorded no rollout span (rollout group off, a plain client).
#: When the enclosing rollout is in flight in this process, the value is its
#: ``inflight.InFlight`` record (truthy): the hops made under it update its step and turns.
ENCLOSING_ROLLOUT: Final[ContextVar[bool | InFlight]] = ContextVar(
    "gym_telemetry_enclosing_rollout", default=False
)


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
#: The resolved source: ``SOURCE.get()`` is what ``current_rollout_id`` returns, for hot
#: paths that call it themselves (one call less; they must catch what it raises, as
#: ``current_rollout_id`` does). The getter changes on resolution and ``set_fallback``,
#: so it is read from here at each use.
SOURCE: Final = _STATE
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


def bind_fallback() -> None:
    """Make ``current_rollout_id`` fall back to telemetry's id (``ROLLOUT_ID_VAR``) when
    Gym's is unset. Idempotent; call once Gym is importable (at server start), so the
    primary source is resolved to Gym's. Never raises."""
    try:
        set_fallback(ROLLOUT_ID_VAR.get)
    except Exception:  # boundary: without it spans just lack the fallback id
        _log.warning("gym_telemetry: could not bind the rollout-id fallback", exc_info=True)


# --- readers: where a request carries its rollout id ------------------------------------


def valid_rollout_id(value: str) -> bool:
    """Whether ``value`` is an acceptable rollout id: Gym's pattern (letters, digits,
    ``.``, ``_``, ``-``, not starting with ``.``/``_``/``-``), at most
    ``MAX_ROLLOUT_ID_CHARS``."""
    return len(value) <= MAX_ROLLOUT_ID_CHARS and _ROLLOUT_ID_RE.fullmatch(value) is not None


def rollout_id_from_path(path: str) -> str | None:
    """The id in a ``/ng-rollout/<id>/...`` path, or None."""
    if not path.startswith(ROLLOUT_PATH_PREFIX):
        return None
    segment = path[len(ROLLOUT_PATH_PREFIX) :].split("/", 1)[0]
    return segment if valid_rollout_id(segment) else None


def _id_from(value: Any) -> str | None:
    episode = getattr(value, "episode_id", None)
    key = getattr(episode, "capture_key", None)
    if isinstance(key, str) and key:
        return key
    try:
        from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body

        found = maybe_rollout_id_from_run_body(value)
    except Exception:  # not a run body, or a malformed id: no id
        found = None
    return found if isinstance(found, str) and found else None


def rollout_id_from_models(kwargs: Mapping[str, Any]) -> str | None:
    """The rollout id of a ``/run``'s parsed request models (Gym's rule
    ``maybe_rollout_id_from_run_body``, or an episode's capture key), or None."""
    for value in kwargs.values():
        found = _id_from(value)
        if found is not None:
            return found
    return None


async def rollout_id_from_body(kwargs: Mapping[str, Any]) -> str | None:
    """The rollout id of a ``/run`` body (Gym's rule, or an episode's capture key).

    Parsed request models are tried first. A handler that takes the raw ``Request``
    (Gym's ``legacy_agent`` relay) has its JSON body read -- Starlette caches it, so
    the handler reads the same bytes -- when it is at most ``MAX_RAW_BODY_BYTES``.
    """
    found = rollout_id_from_models(kwargs)
    if found is not None:
        return found
    for value in kwargs.values():
        if not (hasattr(value, "body") and hasattr(value, "headers")):
            continue
        length = value.headers.get("content-length")
        if length is None or not length.isdigit() or int(length) > MAX_RAW_BODY_BYTES:
            continue
        try:
            parsed = json.loads(await value.body())
        except Exception:  # not JSON: no id
            continue
        found = _id_from(parsed) if isinstance(parsed, dict) else None
        if found is not None:
            return found
    return None


# --- the middleware's use -----------------------------------------------------------------


async def call_with_rollout_id(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, rollout_id: str | None
) -> None:
    """Run ``app`` with ``rollout_id`` as telemetry's rollout id (if there is one)."""
    if rollout_id is None:
        await app(scope, receive, send)
        return
    token = ROLLOUT_ID_VAR.set(rollout_id)
    try:
        await app(scope, receive, send)
    finally:
        ROLLOUT_ID_VAR.reset(token)
