"""Model-call spans of streamed (SSE) responses: end with the stream, read its failures.

With ``stream: true`` a Gym model server's handler returns a Starlette
``StreamingResponse`` before the body is sent: for ``/v1/responses`` after the whole
answer is computed, for ``/v1/chat/completions`` either then or, when generation takes
longer than Gym's keep-alive interval (15 s), at once with a body that waits for the
answer. A span ended when the handler returns would end before the model call does,
and it would read a failure sent inside the 200 stream as a success.

``watch(response, span)`` takes over the end of ``span`` from the wrapper: it wraps the
response's ``body_iterator`` so that the span ends when the body is done, with:

- status ERROR and ``error.type`` = the error's ``code`` for a Gym failure event in the
  stream: ``event: response.failed`` (Responses; Gym writes ``code: server_error``) or
  ``event: error`` (chat completions; ``code`` is the HTTP status, e.g. ``500``), else
  ``_OTHER``; the description is ``response.failed`` / ``error``;
- status ERROR, ``error.type=client_disconnected`` and
  ``nemo.gym.stream.disconnected=true`` when the body stops early: the client went
  away (the iterator is cancelled or closed before its end);
- the exception's type for an exception out of the body;
- ``nemo.gym.stream.events``: how many SSE events were sent;
- ``gen_ai.response.time_to_first_chunk``: seconds from the span's start to the first
  event sent (SSE comments, Gym's keep-alives, are not events), when one was sent.

While the body is sent, :data:`STREAM_SPAN` holds the span, so that code producing the
body later (Gym's long chat completions build their answer inside the stream) can still
put the answer's attributes on it (``autoinstrument.model_calls``).

Scanning costs one substring test per chunk for ``event: error`` /
``event: response.failed`` (the event name opens each SSE event Gym writes); only a
matching event is parsed. Never raises into the stream: a telemetry failure is logged
and the chunk passes on.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any, Final

import gym_telemetry_semconv as semconv
from opentelemetry.trace import Span, Status, StatusCode

_log = logging.getLogger(__name__)

STREAM_EVENTS: Final = "nemo.gym.stream.events"
STREAM_DISCONNECTED: Final = "nemo.gym.stream.disconnected"
CLIENT_DISCONNECTED: Final = "client_disconnected"
OTHER: Final = "_OTHER"
_FAILURE_EVENTS: Final = ("response.failed", "error")
_MARKERS: Final = tuple(f"event: {name}\n" for name in _FAILURE_EVENTS)
_MARKERS_B: Final = tuple(marker.encode() for marker in _MARKERS)
_time_ns = time.time_ns

#: The model-call span whose streamed body is being sent in this context (module doc).
STREAM_SPAN: Final[ContextVar[Span | None]] = ContextVar("gym_telemetry_stream_span", default=None)


def is_stream(result: Any) -> bool:
    """Whether ``result`` is a response whose body is sent later (has a body iterator)."""
    return getattr(result, "body_iterator", None) is not None and hasattr(result, "background")


def failure_in_event(chunk: str | bytes) -> tuple[str, str] | None:
    """``(event name, error.type)`` of a Gym failure event in one SSE chunk, or None."""
    markers = _MARKERS_B if isinstance(chunk, bytes | bytearray | memoryview) else _MARKERS
    for name, marker in zip(_FAILURE_EVENTS, markers, strict=True):
        if marker not in chunk:  # type: ignore[operator]
            continue
        text = bytes(chunk).decode("utf-8", "replace") if not isinstance(chunk, str) else chunk
        return name, _error_code(text, name)
    return None


def _error_code(text: str, name: str) -> str:
    """The ``code`` of the event's error object (``data:`` line), else ``_OTHER``."""
    start = text.find(f"event: {name}\n")
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("data:"):
            continue
        try:
            payload = json.loads(line[5:].strip())
        except ValueError:
            return OTHER
        error = payload.get("error") if isinstance(payload, dict) else None
        if error is None and isinstance(payload, dict):
            response = payload.get("response")
            error = response.get("error") if isinstance(response, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        return str(code) if code not in (None, "") else OTHER
    return OTHER


def watch(response: Any, span: Span) -> bool:
    """Make ``span`` end with ``response``'s body (module doc). False: not a stream,
    the caller ends the span itself."""
    iterator = getattr(response, "body_iterator", None)
    if iterator is None:
        return False
    response.body_iterator = _watched(iterator, span)
    return True


def _fail(span: Span, description: str, error_type: str) -> None:
    span.set_status(Status(StatusCode.ERROR, description))
    span.set_attribute(semconv.ERROR_TYPE, error_type)


async def _watched(iterator: Any, span: Span) -> AsyncIterator[Any]:
    events = 0
    first_ns = 0
    failure: tuple[str, str] | None = None
    finished = False
    STREAM_SPAN.set(span)  # this request's streaming context only (module doc)
    try:
        if hasattr(iterator, "__aiter__"):
            async for chunk in iterator:
                events, failure = _scan(chunk, events, failure)
                if events and not first_ns:
                    first_ns = _time_ns()
                yield chunk
        else:  # a plain iterable: Starlette iterates it in a thread pool; here in order
            for chunk in iterator:
                events, failure = _scan(chunk, events, failure)
                if events and not first_ns:
                    first_ns = _time_ns()
                yield chunk
        finished = True
    except BaseException as exc:
        try:
            if isinstance(exc, GeneratorExit) or type(exc).__name__ == "CancelledError":
                span.set_attribute(STREAM_DISCONNECTED, True)
                _fail(span, "stream ended early", CLIENT_DISCONNECTED)
            else:
                _fail(span, f"{type(exc).__name__}: {exc}", type(exc).__qualname__)
        except Exception:  # telemetry must never change how the stream ends
            _log.debug("gym_telemetry: could not describe a stream's end", exc_info=True)
        raise
    finally:
        try:
            STREAM_SPAN.set(None)
            span.set_attribute(STREAM_EVENTS, events)
            if first_ns:
                start_ns = getattr(span, "start_time", None)
                if type(start_ns) is int:
                    span.set_attribute(
                        semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
                        max(0, first_ns - start_ns) / 1e9,
                    )
            if finished and failure is not None:
                _fail(span, failure[0], failure[1])
        except Exception:  # telemetry must never change how the stream ends
            _log.debug("gym_telemetry: could not finish a stream span", exc_info=True)
        span.end()


def _scan(
    chunk: Any, events: int, failure: tuple[str, str] | None
) -> tuple[int, tuple[str, str] | None]:
    try:
        if isinstance(chunk, str | bytes):
            if failure is None:
                failure = failure_in_event(chunk)
            comment = chunk.startswith(":") if isinstance(chunk, str) else chunk.startswith(b":")
            if not comment:
                events += 1  # SSE comments (Gym's keep-alives) are not events
    except Exception:  # scanning is best effort
        _log.debug("gym_telemetry: could not scan a stream chunk", exc_info=True)
    return events, failure
