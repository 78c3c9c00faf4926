"""This project's implementation of the primitives NeMo Gym's telemetry call sites use.

NeMo Gym 0.7.0 ships instrumentation call sites that expect nemo-lens (not installable
from public packages); without it they resolve to no-ops. The Gym integration puts the
functions below in their place, right after the defining Gym module has executed and
before any Gym module imports them -- no Gym file is edited:

- ``nemo_gym.telemetry._fallbacks``: ``is_span_group_enabled``, ``managed_span``,
  ``span_cm``, ``trace_fn``, ``safe_set_span_attributes`` (used by the HTTP hop in
  ``server_utils.request``, the sandbox API and rollout collection);
- ``nemo_gym.telemetry.spans.client_span``: the CLIENT span of every hop;
- ``nemo_gym.telemetry.contrib.inject_trace_context``: ``traceparent`` + rollout baggage
  into the hop's headers; ``instrument_fastapi_app`` (the SERVER span is made by
  ``server_span.ServerSpanMiddleware`` instead, so this reports False).

Every span goes through the tracer of its span group (``span_groups.tracer_for``, scope
``gym_telemetry.<group>``); the CLIENT span uses group ``http_client`` and is named and
given its status (ERROR for a 4xx/5xx response) by the HTTP semantic conventions as it
ends (``client_span``). The gate is the same process-wide frozenset the endpoint
wrappers read.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, Final

import gym_telemetry_semconv as semconv
from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from gym_telemetry import rollout_correlation, span_groups
from gym_telemetry._lean.context import detach
from gym_telemetry._lean.recorder import LeanRecorder, SdkRecorder, recorder_for
from gym_telemetry._lean.span import LeanSpan, clean_value
from gym_telemetry.autoinstrument import propagation

_log = logging.getLogger(__name__)

_ENABLED: Final = span_groups.ENABLED
#: Attribute-key fragments whose values are replaced by ``REDACTED``.
SENSITIVE_KEY_PARTS: Final = ("api_key", "apikey", "authorization", "password", "secret", "token")
REDACTED: Final = "REDACTED"
#: Scope of ``span_cm`` spans, which belong to no span group.
UNGROUPED_SCOPE: Final = "nemo_gym"


def is_span_group_enabled(group: str) -> bool:
    """Whether ``group`` is enabled right now."""
    return group in _ENABLED.groups


def _clean(value: Any) -> Any:
    if isinstance(value, bool | str | int | float):
        return value
    if isinstance(value, list | tuple) and all(
        isinstance(v, bool | str | int | float) for v in value
    ):
        return tuple(value)
    return None


#: Bound of the memo of attribute keys' sensitivity (entries; cleared when full).
MAX_CACHED_KEYS: Final = 1024
_key_sensitive: dict[str, bool] = {}


def _sensitive(key: str) -> bool:
    """Whether ``key`` looks sensitive (a ``SENSITIVE_KEY_PARTS`` fragment), remembered."""
    hit = _key_sensitive.get(key)
    if hit is None:
        lowered = key.lower()
        hit = any(part in lowered for part in SENSITIVE_KEY_PARTS)
        if len(_key_sensitive) >= MAX_CACHED_KEYS:
            _key_sensitive.clear()
        _key_sensitive[key] = hit
    return hit


def safe_set_span_attributes(
    span: Any, attributes: Mapping[str, Any] | None, redact_keys: Any = None
) -> None:
    """Set the scalar (or scalar-sequence) attributes on ``span``; drop the rest.

    ``None`` values and non-scalar values are dropped; keys that look sensitive (or are
    in ``redact_keys``) get the value ``REDACTED``. Never raises.
    """
    if span is None or not attributes:
        return
    try:
        extra = {str(k).lower() for k in redact_keys} if redact_keys else None
        clean: dict[str, Any] = {}
        for key, raw in attributes.items():
            kind = raw.__class__
            if kind is str or kind is int or kind is bool or kind is float:
                value = raw
            else:
                value = _clean(raw)
                if value is None:
                    continue
            if _sensitive(key) or (extra is not None and key.lower() in extra):
                value = REDACTED
            clean[key] = value
        if clean:
            span.set_attributes(clean)
    except Exception:  # attributes are best effort
        _log.debug("gym_telemetry: could not set span attributes", exc_info=True)


@contextmanager
def _current(
    span: Span,
    before_end: Callable[[Span, bool], None] | None = None,
    *,
    exception_text: bool = True,
) -> Iterator[Span]:
    """``span`` current while the block runs; ``before_end(span, raised)`` runs before end.

    An exception sets ERROR and ``error.type``; with ``exception_text`` it is also
    recorded as an event and its message becomes the status description. Without it
    (sandbox spans: a provider's message may quote the command) only its type is kept.
    """
    token = context_api.attach(trace.set_span_in_context(span))
    raised = False
    try:
        yield span
    except BaseException as exc:
        raised = True
        if exception_text:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        else:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        span.set_attribute(semconv.ERROR_TYPE, type(exc).__qualname__)
        raise
    finally:
        context_api.detach(token)
        if before_end is not None:
            before_end(span, raised)
        span.end()


def _with_rollout(attributes: dict[str, Any]) -> dict[str, Any]:
    rollout_id = rollout_correlation.current_rollout_id()
    if rollout_id:
        attributes[semconv.ROLLOUT_ID] = rollout_id
    return attributes


@contextmanager
def managed_span(
    group: str, name: str, tracer: Any = None, **attributes: Any
) -> Iterator[Span | None]:
    """A span of ``group`` (its own tracer), current while the block runs; None when off."""
    if group not in _ENABLED.groups:
        yield None
        return
    span = span_groups.tracer_for(group).start_span(name, attributes=_with_rollout({}))
    safe_set_span_attributes(span, attributes)
    if group == semconv.GROUP_SANDBOX:
        with _current(span, _finish_sandbox_span, exception_text=False):
            yield span
        return
    with _current(span):
        yield span


#: Gym's own attribute for an exec that did not complete (``timeout``, a provider's
#: runtime error class); a command that ran and exited non-zero leaves it unset.
SANDBOX_ERROR_TYPE: Final = "nemo.gym.sandbox.error_type"


def _finish_sandbox_span(span: Span, raised: bool) -> None:
    """A ``gym.sandbox.*`` span whose result carries Gym's ``error_type`` is an error.

    Gym's sandbox API returns a timed-out exec as a result (``error_type="timeout"``,
    no exception), so the span would end UNSET: status ERROR and ``error.type`` = that
    value instead. A command that ran and exited non-zero (a cell that raised) is the
    task's outcome, not the sandbox's: it stays UNSET with its return code. An
    exception (a provider error) already set ERROR and its type. Never raises.
    """
    if raised:
        return
    try:
        attributes = getattr(span, "attributes", None)
        value = attributes.get(SANDBOX_ERROR_TYPE) if attributes else None
        if isinstance(value, str) and value:
            span.set_status(Status(StatusCode.ERROR, value))
            span.set_attribute(semconv.ERROR_TYPE, value)
    except Exception:  # status is best effort
        _log.debug("gym_telemetry: could not finish a sandbox span", exc_info=True)


@contextmanager
def span_cm(
    name: str, tracer: Any = None, record_exception: bool = True, **attributes: Any
) -> Iterator[Span | None]:
    """An ungated span (scope ``nemo_gym`` unless a tracer is given)."""
    chosen = tracer if tracer is not None else trace.get_tracer(UNGROUPED_SCOPE)
    span = chosen.start_span(name, attributes=_with_rollout({}))
    safe_set_span_attributes(span, attributes)
    with _current(span):
        yield span


def trace_fn(group: str, name: str, tracer: Any = None) -> Callable[[Any], Any]:
    """Decorator: run the function inside ``managed_span(group, name)`` (gated per call)."""

    def decorator(func: Any) -> Any:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                if group not in _ENABLED.groups:
                    return await func(*args, **kwargs)
                with managed_span(group, name):
                    return await func(*args, **kwargs)

            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if group not in _ENABLED.groups:
                return func(*args, **kwargs)
            with managed_span(group, name):
                return func(*args, **kwargs)

        return wrapper

    return decorator


#: Methods a client span name may carry (the semconv's known methods); others read ``HTTP``.
KNOWN_METHODS: Final = frozenset(
    ("CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE")
)
#: Most path segments (after the rollout prefix) a client span name may carry.
MAX_ROUTE_SEGMENTS: Final = 4
#: Longest path (after the rollout prefix) a client span name may carry.
MAX_ROUTE_CHARS: Final = 128
#: What the high-cardinality ``/ng-rollout/<id>`` prefix reads as in a template.
ROLLOUT_ROUTE_TEMPLATE: Final = rollout_correlation.ROLLOUT_PATH_PREFIX + "{rollout_id}"


def _route_segment(segment: str) -> bool:
    """Whether one path segment looks like a route name (``verify``, ``v1``), not an id.

    Letters with ``_``/``-`` between them, or a version ``v<digits>``. Anything with other
    digits (ids, hashes, counters) is refused: it could make one name per value.
    """
    if not segment or not segment.isascii():
        return False
    if segment[0] == "v" and segment[1:].isdigit():
        return True
    return segment.replace("_", "").replace("-", "").isalpha()


def url_template(url: str) -> str | None:
    """The low-cardinality route template of a hop's URL, or None when it has none.

    ``http://h:1/ng-rollout/<id>/v1/responses`` -> ``/ng-rollout/{rollout_id}/v1/responses``;
    ``http://h:1/verify`` -> ``/verify``. Only a Gym server route shape qualifies: no
    query or fragment, at most ``MAX_ROUTE_SEGMENTS`` segments and ``MAX_ROUTE_CHARS``
    characters after the rollout prefix, every segment a route name (``_route_segment``).
    String checks only (no regex): this runs once per hop.
    """
    if "?" in url or "#" in url:
        return None
    _, sep, rest = url.partition("://")
    if sep:
        slash = rest.find("/")
        if slash == -1:
            return None
        path = rest[slash:]
    else:
        path = url
    prefix = ""
    if path.startswith(rollout_correlation.ROLLOUT_PATH_PREFIX):
        start = len(rollout_correlation.ROLLOUT_PATH_PREFIX)
        slash = path.find("/", start)
        if slash <= start:  # no id, or nothing after it
            return None
        prefix = ROLLOUT_ROUTE_TEMPLATE
        path = path[slash:]
    if not path.startswith("/") or len(path) > MAX_ROUTE_CHARS:
        return None
    segments = path[1:].split("/", MAX_ROUTE_SEGMENTS)
    if len(segments) > MAX_ROUTE_SEGMENTS or not all(map(_route_segment, segments)):
        return None
    return prefix + path


def _client_span_end(span: Span, raised: bool) -> tuple[str | None, dict[str, Any], bool]:
    """What ``_finish_client_span`` changes: (new name or None, attributes to add, error)."""
    attributes = getattr(span, "attributes", None)
    if not attributes:  # a non-recording span
        return None, {}, False
    name = None
    extra: dict[str, Any] = {}
    method = attributes.get(semconv.HTTP_REQUEST_METHOD)
    url = attributes.get(semconv.URL_FULL)
    if isinstance(method, str) and isinstance(url, str):
        if method not in KNOWN_METHODS:
            method = "HTTP"
        template = _url_template(url)
        if template is None:
            name = method
        else:
            extra[semconv.URL_TEMPLATE] = template
            name = _client_name(method, template)
    error = False
    status = attributes.get(semconv.HTTP_RESPONSE_STATUS_CODE)
    if not raised and type(status) is int and status >= 400:
        # no description: the status code says it (HTTP semconv)
        error = True
        extra[semconv.ERROR_TYPE] = str(status)
    return name, extra, error


def _finish_client_span(span: Span, raised: bool) -> None:
    """Name the CLIENT span and set its status from what the hop recorded on it.

    Gym opens the span (named ``HTTP <method>``) before it sets ``url.full`` and the
    response status, so both are applied here, just before the span ends:

    - name ``{method} {url.template}`` with ``url.template`` set when the URL has a
      route template (``url_template``), else ``{method}``;
    - status ERROR with ``error.type`` = the status code for a 4xx/5xx response (an
      exception already set both, with the exception's type).

    Spans without ``http.request.method`` and ``url.full`` keep their name. Never raises.
    """
    try:
        name, extra, error = _client_span_end(span, raised)
        if name is not None:
            span.update_name(name)
        if extra:
            span.set_attributes(extra)
        if error:
            span.set_status(Status(StatusCode.ERROR))
    except Exception:  # naming and status are best effort
        _log.debug("gym_telemetry: could not finish a client span", exc_info=True)


#: Bound of the memos of URL templates and client span names (entries; cleared when full).
MAX_CACHED_URLS: Final = 1024
_url_templates: dict[str, str | None] = {}
_client_names: dict[tuple[str, str], str] = {}


def _url_template(url: str) -> str | None:
    """``url_template(url)``, remembered (a hop's URLs are a server's few routes, unless
    rollout-prefixed)."""
    try:
        return _url_templates[url]
    except KeyError:
        template = url_template(url)
        if len(_url_templates) >= MAX_CACHED_URLS:
            _url_templates.clear()
        _url_templates[url] = template
        return template


def _client_name(method: str, template: str) -> str:
    name = _client_names.get((method, template))
    if name is None:
        name = f"{method} {template}"
        if len(_client_names) >= MAX_CACHED_URLS:
            _client_names.clear()
        _client_names[(method, template)] = name
    return name


class _ClientRecorder:
    """The ``http_client`` group's recording path, re-resolved when its tracer changes."""

    __slots__ = ("recorder", "tracer")

    def __init__(self) -> None:
        self.tracer: object = None
        self.recorder: LeanRecorder | SdkRecorder | None = None

    def get(self) -> LeanRecorder | SdkRecorder:
        recorder = self.recorder
        tracer = _tracers.get(semconv.GROUP_HTTP_CLIENT)
        if recorder is None or recorder.provisional or tracer is None or tracer is not self.tracer:
            tracer = span_groups.tracer_for(semconv.GROUP_HTTP_CLIENT)
            recorder = self.recorder = recorder_for(tracer)
            self.tracer = tracer
        return recorder


_CLIENT_RECORDER: Final = _ClientRecorder()
#: The ``http_client`` group's recorder (for ``hops``).
client_recorder: Final = _CLIENT_RECORDER.get
#: ``url_template`` remembered, and the client span name of a method and template.
cached_url_template: Final = _url_template
client_name: Final = _client_name
_tracers = span_groups._tracers  # group -> tracer cache (cleared when the provider changes)


class _ClientSpan:
    """``client_span``'s context manager: a slotted object instead of a generator-based
    one (Gym opens one per hop)."""

    __slots__ = ("attributes", "name", "span", "token")

    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self.name = name
        self.attributes = attributes

    def __enter__(self) -> Span:
        attributes: dict[str, Any] = {}
        rollout_id = rollout_correlation.current_rollout_id()
        if rollout_id:
            value = rollout_id if rollout_id.__class__ is str else clean_value(rollout_id)
            if value is not None:
                attributes[semconv.ROLLOUT_ID] = value
        try:
            span, token = _CLIENT_RECORDER.get().start(self.name, attributes, SpanKind.CLIENT)
        except Exception:  # the hop goes on without its span
            _log.debug("gym_telemetry: could not start a client span", exc_info=True)
            span, token = trace.INVALID_SPAN, None
        self.span, self.token = span, token
        if self.attributes:
            safe_set_span_attributes(span, self.attributes)
        return span

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        span = self.span
        raised = exc is not None
        try:
            if exc is not None:  # as _current: recorded, then re-raised by the with
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                span.set_attribute(semconv.ERROR_TYPE, type(exc).__qualname__)
        finally:
            if self.token is not None:
                detach(self.token)
            if type(span) is LeanSpan:
                try:
                    name, extra, error = _client_span_end(span, raised)
                except Exception:  # naming and status are best effort
                    name, extra, error = None, {}, False
                span.end_with(extra, name, error)
            else:
                _finish_client_span(span, raised)
                span.end()


def client_span(name: str, tracer: Any = None, **attributes: Any) -> _ClientSpan:
    """A CLIENT span of group ``http_client``, current while the block runs.

    Gym gates the call site on ``http_client`` itself, so this always records. Before
    the span ends it is named and its status set from its attributes
    (``_finish_client_span``): ``POST /verify``, ERROR for a 4xx/5xx response.
    """
    return _ClientSpan(name, attributes)


def inject_trace_context(headers: MutableMapping[str, str]) -> None:
    """Write ``traceparent`` and the rollout-id baggage into ``headers``. Never raises."""
    try:
        propagation.inject(headers)
    except Exception:  # a request without trace context is still a valid request
        _log.debug("gym_telemetry: could not inject trace context", exc_info=True)


def instrument_fastapi_app(app: Any) -> bool:
    """Not needed: every app already gets its SERVER span from the middleware layer."""
    return False


#: Gym module -> {attribute: replacement}, applied by the Gym integration.
REPLACEMENTS: Final[dict[str, dict[str, Any]]] = {
    "nemo_gym.telemetry._fallbacks": {
        "is_span_group_enabled": is_span_group_enabled,
        "managed_span": managed_span,
        "span_cm": span_cm,
        "trace_fn": trace_fn,
        "safe_set_span_attributes": safe_set_span_attributes,
        "NEMO_LENS_AVAILABLE": False,
    },
    "nemo_gym.telemetry.spans": {"client_span": client_span},
    "nemo_gym.telemetry.contrib": {
        "inject_trace_context": inject_trace_context,
        "instrument_fastapi_app": instrument_fastapi_app,
    },
}
