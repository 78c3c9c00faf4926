"""The SDK's internals the export side reaches into: the batch processor's queue, its
``emit`` step and its inner shutdown, and the API's context key of the current span.

Each accessor checks what it finds and returns None (or does the public thing) when the
layout is not the expected one, so a newer SDK leaves the queue to the SDK itself.
"""

from __future__ import annotations

import collections
import inspect
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


def shutdown_batch(processor: BatchSpanProcessor, timeout_s: float) -> None:
    """Shut ``processor`` down within ``timeout_s`` when its inner processor takes a
    deadline (SDK >= 1.3x), else the public way (which waits as long as it waits)."""
    inner = getattr(processor, "_batch_processor", None)
    timeout_ms = max(0, int(timeout_s * 1000))
    if inner is not None and "timeout_millis" in inspect.signature(inner.shutdown).parameters:
        inner.shutdown(timeout_millis=timeout_ms)
    else:
        processor.shutdown()  # type: ignore[no-untyped-call]
