"""Label values of the ``reason`` label that export/ puts on the refused/dropped counters."""

from __future__ import annotations

# refused (the client was told to retry or that the data is unacceptable)
QUEUE_FULL = "queue_full"
"""The queue's byte bound would be passed: Backpressure, the client retries."""
SHUTTING_DOWN = "shutting_down"
"""Data arrived after shutdown began: Backpressure, the client retries elsewhere/later."""
LARGER_THAN_QUEUE = "larger_than_queue"
"""One request larger than the whole queue: rejected (partial_success), never fits."""

# dropped (accepted, will never be exported)
NO_BACKEND = "no_backend"
"""backend.url is not set and no local store is configured."""
PERMANENT_ERROR = "permanent_error"
"""The backend answered with a permanent error (gRPC INVALID_ARGUMENT, HTTP 400, ...)."""
BACKEND_REJECTED = "backend_rejected"
"""The backend accepted the request but rejected these items (partial_success)."""
RETRY_EXHAUSTED = "retry_exhausted"
"""Retried for longer than queue.retry_max_elapsed_s."""
SHUTDOWN = "shutdown"
"""Still queued or in flight when the shutdown deadline passed."""
