"""The SDK's internals the export side reaches into: the batch processor's queue, its
``emit`` step and its inner shutdown, and the API's context key of the current span.

Each accessor checks what it finds and returns None (or does the public thing) when the
layout is not the expected one, so a newer SDK leaves the queue to the SDK itself.
"""

from __future__ import annotations

import collections
import inspect
import os
from typing import Any, Final

from opentelemetry.sdk.trace.export import BatchSpanProcessor

try:  # where the API keeps the current span in a Context (stable since 1.0)
    from opentelemetry.trace.propagation import _SPAN_KEY
except ImportError:  # pragma: no cover - very old or very new API
    _SPAN_KEY = "current-span"

#: The API's context key of the current span.
SPAN_KEY: Final = _SPAN_KEY


def batch_queue(processor: BatchSpanProcessor) -> tuple[Any, int]:
    """The deque a batch processor queues spans in, and its bound: (None, 0) if unknown.

    SDK >= 1.3x keeps them in ``_batch_processor._queue`` / ``_max_queue_size``; older
    versions in the processor's own ``queue`` / ``max_queue_size``.
    """
    inner = getattr(processor, "_batch_processor", processor)
    queue = getattr(inner, "_queue", None)
    if queue is None:
        queue = getattr(inner, "queue", None)
    bound = getattr(inner, "_max_queue_size", None) or getattr(inner, "max_queue_size", 0)
    # Private SDK fields: only a deque of the expected bound is used; anything else (a
    # newer SDK's layout) leaves the queue to the SDK, which then drops and logs itself.
    if not isinstance(queue, collections.deque) or not isinstance(bound, int) or bound <= 0:
        return None, 0
    if queue.maxlen not in (None, bound):
        return None, 0
    return queue, bound


def batch_emit(processor: BatchSpanProcessor) -> Any:
    """The step that appends one item to a batch processor's queue and wakes its worker
    when a batch is full (``_batch_processor.emit``, SDK >= 1.3x), or None if unknown."""
    emit = getattr(getattr(processor, "_batch_processor", None), "emit", None)
    return emit if callable(emit) else None


#: Set in a forked child (``batch_append``'s step then leaves every item to ``emit``).
_FORKED = [False]
os.register_at_fork(after_in_child=lambda: _FORKED.__setitem__(0, True))


def batch_append(processor: BatchSpanProcessor) -> Any:
    """A step that appends one item to ``processor``'s queue as its ``emit`` does, or None.

    ``emit`` (``_batch_processor.emit``, SDK >= 1.3x) also refuses items after shutdown,
    re-initializes the processor in a forked child, and logs and counts a drop when the
    queue is full; the step returned here leaves those cases to ``emit`` itself and, in
    the usual one, appends and wakes the worker once a batch is full, as ``emit`` does.
    The caller keeps the queue from being full (``GymSpanProcessor`` drops the oldest
    item first, counted), so no drop is left to the deque. When the batch processor's
    fields are not the known ones, it is ``emit`` itself (or None without one).
    """
    emit = batch_emit(processor)
    inner: Any = getattr(processor, "_batch_processor", None)
    queue = getattr(inner, "_queue", None)
    batch_size = getattr(inner, "_max_export_batch_size", None)
    if (
        emit is None
        or not isinstance(queue, collections.deque)
        or not isinstance(batch_size, int)
        or not isinstance(getattr(inner, "_shutdown", None), bool)
        or not isinstance(getattr(inner, "_pid", None), int)
        or not hasattr(getattr(inner, "_worker_awaken", None), "is_set")
    ):
        return emit
    pid = os.getpid()

    def append(item: object) -> None:
        if inner._shutdown or inner._pid != pid or _FORKED[0]:
            # Refused after shutdown; in a forked child every item goes through emit,
            # which re-initializes the processor there (its worker thread is gone).
            emit(item)
            return
        queue.appendleft(item)
        if len(queue) >= batch_size:
            awaken = inner._worker_awaken  # replaced in a forked child: read each time
            if not awaken.is_set():
                awaken.set()

    return append


def shutdown_batch(processor: BatchSpanProcessor, timeout_s: float) -> None:
    """Shut ``processor`` down within ``timeout_s`` when its inner processor takes a
    deadline (SDK >= 1.3x), else the public way (which waits as long as it waits)."""
    inner = getattr(processor, "_batch_processor", None)
    timeout_ms = max(0, int(timeout_s * 1000))
    if inner is not None and "timeout_millis" in inspect.signature(inner.shutdown).parameters:
        inner.shutdown(timeout_millis=timeout_ms)
    else:
        processor.shutdown()  # type: ignore[no-untyped-call]
