"""Where an app container's OpenTelemetry SDK sends OTLP: the variables the injector adds.

The sidecar receives OTLP/gRPC on one port (4317) and OTLP/HTTP on another (4318), so an
endpoint is right only together with its protocol: an SDK that speaks ``http/protobuf``
(the OpenTelemetry default protocol, and the Java and JavaScript SDKs' default) posts
``/v1/traces`` to whatever port it is given, and on the gRPC port every span is lost.
:func:`otlp_env` therefore sets ``OTEL_EXPORTER_OTLP_ENDPOINT`` and
``OTEL_EXPORTER_OTLP_PROTOCOL`` as a pair, and keeps what the pod spec already chose,
as the OpenTelemetry Operator's injection does (a variable is only ever added, never
changed). The rules, for one container:

1. A variable the container already has (``value`` or ``valueFrom``) is never added.
   A ``valueFrom`` variable's value is unknown here.
2. A container with ``envFrom`` gets no OTLP variable: its ConfigMaps or Secrets may set
   them, and a container's ``env`` wins over ``envFrom``, so anything added could
   override the app's choice. Every OpenTelemetry SDK's default endpoint is localhost
   at its protocol's standard port (4317 for gRPC, 4318 for HTTP), which is where the
   sidecar listens with its default ports.
3. The pair. The app sets the endpoint: kept; when it names the sidecar (localhost, one
   of its two ports) and no protocol is set, the protocol of that port is added. The
   app sets only the protocol (``grpc``, ``http/protobuf`` or ``http/json``): the
   endpoint of that protocol's port is added (``http/protobuf`` -> 4318). Neither:
   ``default_protocol`` and its endpoint. A protocol the injector does not recognise
   (or one from ``valueFrom``) gets no endpoint: the SDK's own default, or its error,
   applies.
4. Per signal (``traces``, ``metrics``, ``logs``), the OpenTelemetry specification's
   ``OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL`` and ``_ENDPOINT`` win over the pair. A
   signal whose own protocol is served on the other sidecar port than the one the
   pair's endpoint names gets its own endpoint (for HTTP the full URL,
   ``http://localhost:4318/v1/traces``: a signal's endpoint is used as is); when the
   pair's endpoint is the app's and points elsewhere than the sidecar, nothing is added
   for the signal. A signal endpoint naming a sidecar port gets that port's protocol
   when the protocol in effect for it would be the other one.

The function is pure (the pod comes in as its container's env list) and convergent: run
on its own output it adds nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import urlsplit

OtlpProtocol = Literal["grpc", "http/protobuf", "http/json"]
PROTOCOLS: Final[tuple[OtlpProtocol, ...]] = ("grpc", "http/protobuf", "http/json")
SIGNALS: Final = ("traces", "metrics", "logs")
"""The signals with their own OTLP exporter variables, in the specification's order."""
SIDECAR_HOST: Final = "localhost"
"""The pod's containers share one network namespace: the sidecar is on localhost."""
_LOCAL_HOSTS: Final = frozenset({"localhost", "127.0.0.1", "::1"})
_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"
_PROTOCOL: Final = "OTEL_EXPORTER_OTLP_PROTOCOL"


def endpoint_var(signal: str | None = None) -> str:
    """``OTEL_EXPORTER_OTLP_ENDPOINT``, or ``OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT``."""
    return f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT" if signal else _ENDPOINT


def protocol_var(signal: str | None = None) -> str:
    """``OTEL_EXPORTER_OTLP_PROTOCOL``, or ``OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL``."""
    return f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL" if signal else _PROTOCOL


DERIVED_VARIABLES: Final = frozenset(
    name for signal in (None, *SIGNALS) for name in (endpoint_var(signal), protocol_var(signal))
)
"""The variables :func:`otlp_env` decides; the injector's ``app_env`` may not set them."""


@dataclass(frozen=True)
class SidecarPorts:
    """The sidecar's two OTLP ports, as the app reaches them on localhost."""

    grpc: int
    http: int

    def for_protocol(self, protocol: OtlpProtocol) -> int:
        return self.grpc if protocol == "grpc" else self.http

    def protocol_at(self, port: int) -> OtlpProtocol | None:
        """The protocol the sidecar serves on ``port`` (None: not a sidecar port)."""
        if port == self.grpc:
            return "grpc"
        if port == self.http:
            return "http/protobuf"
        return None

    def endpoint(self, protocol: OtlpProtocol, signal: str | None = None) -> str:
        """The URL an SDK speaking ``protocol`` is given; a signal's HTTP URL has its path."""
        url = f"http://{SIDECAR_HOST}:{self.for_protocol(protocol)}"
        if signal is not None and protocol != "grpc":
            url += f"/v1/{signal}"
        return url


_UNKNOWN: Final = object()
"""The value of a variable that is present but not readable here (``valueFrom``)."""


def _present(env: Sequence[Mapping[str, Any]]) -> dict[str, object]:
    """Name -> literal value (a string) or ``_UNKNOWN``, for every variable of ``env``."""
    found: dict[str, object] = {}
    for entry in env:
        name = entry.get("name")
        if not isinstance(name, str):
            continue
        value = entry.get("value")
        found[name] = value if isinstance(value, str) and "valueFrom" not in entry else _UNKNOWN
    return found


def _protocol(value: object) -> OtlpProtocol | None:
    """A recognised protocol value (trimmed, any case), else None."""
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    return next((p for p in PROTOCOLS if p == text), None)


def _sidecar_port(value: object, ports: SidecarPorts) -> OtlpProtocol | None:
    """The protocol of the sidecar port an endpoint names (localhost only), else None."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    try:
        parts = urlsplit(text if "://" in text else "//" + text)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if host not in _LOCAL_HOSTS or port is None:
        return None
    return ports.protocol_at(port)


def _same_port(a: OtlpProtocol, b: OtlpProtocol, ports: SidecarPorts) -> bool:
    return ports.for_protocol(a) == ports.for_protocol(b)


def otlp_env(
    env: Sequence[Mapping[str, Any]],
    *,
    has_env_from: bool,
    ports: SidecarPorts,
    default_protocol: OtlpProtocol,
) -> list[dict[str, str]]:
    """The OTLP variables to add to one app container whose ``env`` list is ``env``.

    See the module docstring for the rules. Returns ``[{"name": ..., "value": ...}]`` in
    a stable order (the pair, then each signal's), none of whose names is in ``env``.
    """
    if has_env_from:
        return []
    present = _present(env)
    added: dict[str, str] = {}

    # The pair: the protocol in effect for every signal without its own, and what is
    # served where the pair's endpoint points (None: no endpoint, so the SDK's default,
    # or, with ``elsewhere``, not a sidecar port or unreadable).
    pair_protocol: OtlpProtocol | None
    pair_target: OtlpProtocol | None
    elsewhere = False
    if endpoint_var() in present:
        pair_protocol = _protocol(present.get(protocol_var()))
        pair_target = at_port = _sidecar_port(present[endpoint_var()], ports)
        elsewhere = at_port is None
        if protocol_var() not in present and at_port is not None:
            added[protocol_var()] = pair_protocol = at_port
    elif protocol_var() in present:
        pair_protocol = pair_target = _protocol(present[protocol_var()])
        if pair_protocol is not None:
            added[endpoint_var()] = ports.endpoint(pair_protocol)
    else:
        pair_protocol = pair_target = default_protocol
        added[endpoint_var()] = ports.endpoint(default_protocol)
        added[protocol_var()] = default_protocol

    for signal in SIGNALS:
        own_endpoint, own_protocol = endpoint_var(signal), protocol_var(signal)
        if own_endpoint in present:
            at_port = _sidecar_port(present[own_endpoint], ports)
            if (
                own_protocol not in present
                and at_port is not None
                and (pair_protocol is None or not _same_port(pair_protocol, at_port, ports))
            ):
                added[own_protocol] = at_port  # the pair's protocol would miss this port
            continue
        wanted = _protocol(present.get(own_protocol))
        if wanted is None or elsewhere:
            continue  # the pair applies, or the app pointed every signal elsewhere itself
        if pair_target is None or not _same_port(wanted, pair_target, ports):
            added[own_endpoint] = ports.endpoint(wanted, signal)
    return [{"name": name, "value": value} for name, value in added.items()]
