"""The OTLP endpoint and protocol the injector gives app containers (``otlp_env``).

Checked as the rules say, case by case, then as properties over every combination of
the eight variables an app may already set: nothing the app set is overridden, a
second run adds nothing, and wherever a signal's endpoint ends up at a sidecar port its
protocol is the one served there (unless the app itself set both to disagree).
"""

from __future__ import annotations

from typing import Any

import pytest
from gym_sidecar.webhook.config import InjectorConfigError, load_injector_config
from gym_sidecar.webhook.otlp_env import (
    DERIVED_VARIABLES,
    SIGNALS,
    SidecarPorts,
    _protocol,
    _sidecar_port,
    endpoint_var,
    otlp_env,
    protocol_var,
)
from hypothesis import given, settings
from hypothesis import strategies as st

PORTS = SidecarPorts(grpc=4317, http=4318)
ENDPOINT, PROTOCOL = "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL"
TRACES_ENDPOINT, TRACES_PROTOCOL = (
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
)


def added(env: dict[str, str], default: Any = "grpc", **kw: Any) -> dict[str, str]:
    entries = [{"name": k, "value": v} for k, v in env.items()]
    out = otlp_env(entries, has_env_from=False, ports=PORTS, default_protocol=default, **kw)
    return {e["name"]: e["value"] for e in out}


def test_variable_names_are_the_specifications() -> None:
    assert (endpoint_var(), protocol_var()) == (ENDPOINT, PROTOCOL)
    assert (endpoint_var("traces"), protocol_var("traces")) == (TRACES_ENDPOINT, TRACES_PROTOCOL)
    assert len(DERIVED_VARIABLES) == 8 and SIGNALS == ("traces", "metrics", "logs")


def test_nothing_set_gets_the_pair_of_the_default_protocol() -> None:
    assert added({}) == {ENDPOINT: "http://localhost:4317", PROTOCOL: "grpc"}
    assert added({}, "http/protobuf") == {
        ENDPOINT: "http://localhost:4318",
        PROTOCOL: "http/protobuf",
    }
    assert added({}, "http/json") == {ENDPOINT: "http://localhost:4318", PROTOCOL: "http/json"}


@pytest.mark.parametrize(
    ("protocol", "endpoint"),
    [
        ("http/protobuf", "http://localhost:4318"),
        ("http/json", "http://localhost:4318"),
        ("grpc", "http://localhost:4317"),
        (" HTTP/Protobuf ", "http://localhost:4318"),
    ],
)
def test_the_apps_protocol_gets_the_endpoint_of_its_port(protocol: str, endpoint: str) -> None:
    assert added({PROTOCOL: protocol}) == {ENDPOINT: endpoint}
    assert added({PROTOCOL: protocol}, "http/protobuf") == {ENDPOINT: endpoint}


def test_an_unrecognised_or_unreadable_protocol_gets_no_endpoint() -> None:
    assert added({PROTOCOL: "http"}) == {}
    from_secret = [{"name": PROTOCOL, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    assert otlp_env(from_secret, has_env_from=False, ports=PORTS, default_protocol="grpc") == []


def test_the_apps_endpoint_is_kept_and_a_sidecar_port_gets_its_protocol() -> None:
    assert added({ENDPOINT: "http://collector.observability:4318"}) == {}
    assert added({ENDPOINT: "http://localhost:4318"}) == {PROTOCOL: "http/protobuf"}
    assert added({ENDPOINT: "127.0.0.1:4317"}) == {PROTOCOL: "grpc"}
    assert added({ENDPOINT: "http://[::1]:4318/"}) == {PROTOCOL: "http/protobuf"}
    # Both set by the app, even inconsistently: its own choice, not changed.
    assert added({ENDPOINT: "http://localhost:4317", PROTOCOL: "http/protobuf"}) == {}


def test_env_from_gets_nothing_since_env_would_override_it() -> None:
    out = otlp_env([], has_env_from=True, ports=PORTS, default_protocol="grpc")
    assert out == []


def test_a_signals_own_protocol_gets_its_own_endpoint_when_the_port_differs() -> None:
    assert added({TRACES_PROTOCOL: "http/protobuf"}) == {
        ENDPOINT: "http://localhost:4317",
        PROTOCOL: "grpc",
        TRACES_ENDPOINT: "http://localhost:4318/v1/traces",  # used as is: the path too
    }
    assert added({"OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "grpc"}, "http/protobuf") == {
        ENDPOINT: "http://localhost:4318",
        PROTOCOL: "http/protobuf",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://localhost:4317",
    }
    # Same port (both HTTP): the pair's endpoint already serves it.
    assert added({"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json"}, "http/protobuf") == {
        ENDPOINT: "http://localhost:4318",
        PROTOCOL: "http/protobuf",
    }
    # The app pointed everything elsewhere: its signals' protocols are its business.
    assert added({ENDPOINT: "http://collector:4317", TRACES_PROTOCOL: "http/protobuf"}) == {}
    # The app's pair names a sidecar port: a signal needing the other port gets it.
    assert added({ENDPOINT: "http://localhost:4317", TRACES_PROTOCOL: "http/protobuf"}) == {
        PROTOCOL: "grpc",
        TRACES_ENDPOINT: "http://localhost:4318/v1/traces",
    }


def test_a_signals_own_endpoint_at_a_sidecar_port_gets_that_ports_protocol() -> None:
    assert added({TRACES_ENDPOINT: "http://localhost:4318/v1/traces"}) == {
        ENDPOINT: "http://localhost:4317",
        PROTOCOL: "grpc",
        TRACES_PROTOCOL: "http/protobuf",
    }
    assert added({TRACES_ENDPOINT: "http://localhost:4317"}) == {
        ENDPOINT: "http://localhost:4317",
        PROTOCOL: "grpc",
    }
    assert added({TRACES_ENDPOINT: "http://tempo:4318/v1/traces"}) == {
        ENDPOINT: "http://localhost:4317",
        PROTOCOL: "grpc",
    }


def test_other_ports_follow_the_configuration() -> None:
    ports = SidecarPorts(grpc=14317, http=14318)
    out = otlp_env(
        [{"name": TRACES_PROTOCOL, "value": "http/protobuf"}],
        has_env_from=False,
        ports=ports,
        default_protocol="grpc",
    )
    assert out == [
        {"name": ENDPOINT, "value": "http://localhost:14317"},
        {"name": PROTOCOL, "value": "grpc"},
        {"name": TRACES_ENDPOINT, "value": "http://localhost:14318/v1/traces"},
    ]
    assert added({ENDPOINT: "http://localhost:14318"}) == {}  # not a sidecar port here


def test_the_injector_config_refuses_otlp_destinations_in_app_env() -> None:
    with pytest.raises(InjectorConfigError) as err:
        load_injector_config(
            environ={"GYM_INJECTOR_APP_ENV": "{OTEL_EXPORTER_OTLP_ENDPOINT: http://x:4317}"}
        )
    assert "OTEL_EXPORTER_OTLP_ENDPOINT: the injector derives the OTLP endpoint" in str(err.value)
    with pytest.raises(InjectorConfigError, match="grpc_port and http_port must differ"):
        load_injector_config(environ={"GYM_INJECTOR_HTTP_PORT": "4317"})
    with pytest.raises(InjectorConfigError, match="otlp_protocol"):
        load_injector_config(environ={"GYM_INJECTOR_OTLP_PROTOCOL": "http"})
    ok = load_injector_config(
        environ={"GYM_INJECTOR_APP_ENV": "{OTEL_EXPORTER_OTLP_COMPRESSION: gzip}"}
    )
    assert ok.app_env == {"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
    assert ok.otlp_protocol == "grpc"


# --- properties over every combination --------------------------------------------------

PROTOCOL_VALUES = ["grpc", "http/protobuf", "http/json", "HTTP/PROTOBUF", "thrift", ""]
ENDPOINT_VALUES = [
    "http://localhost:4317",
    "localhost:4318",
    "http://127.0.0.1:4318/v1/traces",
    "http://collector:4317",
    "http://localhost:9",
    "not a url:x",
]
FROM_SECRET = {"secretKeyRef": {"name": "otel", "key": "value"}}


@st.composite
def app_envs(draw: st.DrawFn) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    for signal in (None, *SIGNALS):
        for name, values in (
            (endpoint_var(signal), ENDPOINT_VALUES),
            (protocol_var(signal), PROTOCOL_VALUES),
        ):
            kind = draw(st.sampled_from(["absent", "absent", "value", "valueFrom"]))
            if kind == "value":
                env.append({"name": name, "value": draw(st.sampled_from(values))})
            elif kind == "valueFrom":
                env.append({"name": name, "valueFrom": FROM_SECRET})
    env.append({"name": "APP_MODE", "value": "serve"})
    return draw(st.permutations(env))


def _in_effect(env: dict[str, Any], signal: str) -> tuple[Any, Any, bool]:
    """(protocol, endpoint port's protocol, whether the app set both) for one signal, as
    an SDK resolves them: the signal's own variable, else the pair's."""
    proto_name = protocol_var(signal) if protocol_var(signal) in env else protocol_var()
    end_name = endpoint_var(signal) if endpoint_var(signal) in env else endpoint_var()
    proto = env.get(proto_name)
    end = env.get(end_name)
    return (
        _protocol(proto) if isinstance(proto, str) else None,
        _sidecar_port(end, PORTS) if isinstance(end, str) else None,
        (proto_name, end_name),
    )


@settings(max_examples=400, deadline=None)
@given(env=app_envs(), default=st.sampled_from(["grpc", "http/protobuf", "http/json"]))
def test_properties_never_override_converge_and_stay_consistent(
    env: list[dict[str, Any]], default: Any
) -> None:
    before = {e["name"] for e in env}
    out = otlp_env(env, has_env_from=False, ports=PORTS, default_protocol=default)
    names = [e["name"] for e in out]
    assert len(names) == len(set(names)) and not set(names) & before  # only ever added
    assert set(names) <= DERIVED_VARIABLES
    after = [*env, *out]
    assert otlp_env(after, has_env_from=False, ports=PORTS, default_protocol=default) == []
    app = {e["name"]: e.get("value", e.get("valueFrom")) for e in env}
    final = {e["name"]: e.get("value", e.get("valueFrom")) for e in after}
    for signal in SIGNALS:
        protocol, served, (proto_name, end_name) = _in_effect(final, signal)
        if protocol is None or served is None:
            continue  # the SDK's default, an unreadable value, or not the sidecar
        if proto_name in app and end_name in app:
            continue  # both the app's own: kept as they are, even when they disagree
        assert PORTS.for_protocol(protocol) == PORTS.for_protocol(served), (signal, final)


@settings(max_examples=200, deadline=None)
@given(default=st.sampled_from(["grpc", "http/protobuf", "http/json"]))
def test_without_any_app_setting_every_signal_reaches_its_protocols_port(default: Any) -> None:
    final = {e["name"]: e["value"] for e in otlp_env([], has_env_from=False, ports=PORTS,
                                                     default_protocol=default)}  # fmt: skip
    for signal in SIGNALS:
        protocol, served, _ = _in_effect(final, signal)
        assert protocol == default and served is not None
        assert PORTS.for_protocol(served) == PORTS.for_protocol(default)
