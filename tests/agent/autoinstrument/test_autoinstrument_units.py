"""Unit tests of the Gym auto-instrumentation pieces that need no Gym install.

They run in the workspace environment (FastAPI 0.165, the OpenTelemetry SDK); the
``gym``-marked modules in ``tests/gym/`` check the same code against real Gym servers.
Anything that installs import hooks or patches FastAPI runs in a subprocess, so this
test process stays unpatched.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import gym_telemetry_semconv as semconv
import pytest
from gym_telemetry import environment_variables as env_vars
from gym_telemetry.autoinstrument import activation_requested
from gym_telemetry.autoinstrument.gym_primitives import REDACTED, safe_set_span_attributes
from gym_telemetry.autoinstrument.identity import (
    DEFAULT_EXCLUDED_PATHS,
    excluded_paths,
    server_type_of,
    service_name_for,
)
from gym_telemetry.autoinstrument.install import (
    DEFAULT_STOP_FLUSH_TIMEOUT_S,
    stop_flush_timeout_s,
)
from gym_telemetry.autoinstrument.propagation import inject, rollout_id_from_baggage
from gym_telemetry.autoinstrument.routes import MARKER, is_marked, normalise_path, route_span
from gym_telemetry.rollout_correlation import MAX_ROLLOUT_ID_CHARS, rollout_id_from_path
from opentelemetry.sdk.trace import TracerProvider

REPO = Path(__file__).resolve().parents[3]
PTH = REPO / "agent" / "src" / "gym_telemetry_autoinstrument.pth"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        ("", False),
        ("0", False),
        ("false", False),
        ("Off", False),
        ("1", True),
        ("true", True),
        ("yes", True),
    ],
)
def test_activation_switch(value: str | None, expected: bool) -> None:
    env = {} if value is None else {"GYM_TELEMETRY": value}
    assert activation_requested(env) is expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (b"nemo.gym.rollout.id=12-3", "12-3"),
        (b"a=b, nemo.gym.rollout.id=task.7-a1;prop=x ,c=d", "task.7-a1"),
        (b"nemo.gym.rollout.id=abc%2Ddef", "abc-def"),
        (b"other=1", None),
        (b"nemo.gym.rollout.id=-leading-dash", None),
        (b"nemo.gym.rollout.id=has space", None),
        (b"nemo.gym.rollout.id=" + b"a" * (MAX_ROLLOUT_ID_CHARS + 1), None),
        (b"\xff\xfe", None),
    ],
)
def test_rollout_id_from_baggage(header: bytes, expected: str | None) -> None:
    assert rollout_id_from_baggage(header) == expected


def test_rollout_id_from_path() -> None:
    assert rollout_id_from_path("/ng-rollout/5-2/v1/responses") == "5-2"
    assert rollout_id_from_path("/ng-rollout/5-2") == "5-2"
    assert rollout_id_from_path("/v1/responses") is None
    assert rollout_id_from_path("/ng-rollout/../x") is None


def test_inject_writes_traceparent_and_appends_rollout_baggage() -> None:
    from gym_telemetry import rollout_correlation

    tracer = TracerProvider().get_tracer("test")
    headers = {"baggage": "k=v"}
    with tracer.start_as_current_span("client") as span, rollout_correlation.rollout_context("9-1"):
        inject(headers)
        trace_id = format(span.get_span_context().trace_id, "032x")
    assert headers["traceparent"].split("-")[1] == trace_id
    assert headers["baggage"] == "k=v,nemo.gym.rollout.id=9-1"


def test_inject_without_span_or_rollout_writes_nothing() -> None:
    headers: dict[str, str] = {}
    inject(headers)
    assert headers == {}


@pytest.mark.parametrize(
    ("path", "server_type", "expected"),
    [
        ("/run", "agent", (semconv.GROUP_ROLLOUT, semconv.SPAN_ROLLOUT)),
        ("/run", "environment", (semconv.GROUP_ROLLOUT, semconv.SPAN_ROLLOUT)),
        ("/verify", "resources", (semconv.GROUP_VERIFY, semconv.SPAN_VERIFY)),
        ("/v1/responses", "agent", (semconv.GROUP_AGENT, "gym.agent.responses")),
        (
            "/ng-rollout/{rollout_id}/v1/responses",
            "agent",
            (semconv.GROUP_AGENT, "gym.agent.responses"),
        ),
        (
            "/ng-rollout/{rollout_id}/training-token-capture/v1/responses",
            "agent",
            (semconv.GROUP_AGENT, "gym.agent.responses"),
        ),
        ("/v1/responses", "model", (semconv.GROUP_MODEL_CALL, "gym.model.responses")),
        ("/v1/chat/completions", "model", (semconv.GROUP_MODEL_CALL, "gym.model.chat_completions")),
        ("/v1/messages", "model", (semconv.GROUP_MODEL_CALL, "gym.model.messages")),
        ("/v1/messages", "agent", None),
        ("/get_weather", "resources", None),
        ("/seed_session", "resources", None),
        ("/step", "resources", (semconv.GROUP_VERIFY, semconv.SPAN_ENV_STEP)),
        ("/step", "agent", None),
        ("/reset", "resources", None),
    ],
)
def test_route_mapping(path: str, server_type: str, expected: tuple[str, str] | None) -> None:
    assert route_span(path, server_type) == expected


def test_normalise_path_keeps_ordinary_paths() -> None:
    assert normalise_path("/verify") == "/verify"
    assert normalise_path("/ng-rollout/{rollout_id}") == "/"


def test_marker_is_found_through_wrappers() -> None:
    import functools

    async def handler() -> None:
        return None

    setattr(handler, MARKER, "verify")

    @functools.wraps(handler)
    async def outer() -> None:
        return None

    del outer.__dict__[MARKER]  # wraps copied it; find it through __wrapped__ instead
    assert is_marked(outer)
    assert not is_marked(lambda: None)


def test_safe_set_span_attributes_drops_and_redacts() -> None:
    span = TracerProvider().get_tracer("test").start_span("s")
    safe_set_span_attributes(
        span,
        {"keep": 1, "none": None, "obj": object(), "api_key": "sk-1", "seq": [1, 2], "x": "y"},
        redact_keys=["x"],
    )
    assert dict(span.attributes or {}) == {
        "keep": 1,
        "api_key": REDACTED,
        "seq": (1, 2),
        "x": REDACTED,
    }
    safe_set_span_attributes(None, {"a": 1})  # no span: nothing, no error


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {k: v for k, v in os.environ.items() if k != "GYM_TELEMETRY"}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
        check=False,
    )


def test_pth_line_is_inert_without_the_variable() -> None:
    line = PTH.read_text().strip()
    assert line.startswith("import ") and "\n" not in line
    code = f"""
        import sys
        exec({line!r})
        assert "gym_telemetry" not in sys.modules, "imported with GYM_TELEMETRY unset"
        print("ok")
    """
    result = _run(code)
    assert result.stdout.strip() == "ok", result.stderr
    result = _run(
        code.replace('"gym_telemetry" not in', '"gym_telemetry" in').replace(
            "not imported", "imported"
        ),
        GYM_TELEMETRY="1",
    )
    assert result.stdout.strip() == "ok", result.stderr


def test_activation_patches_fastapi_apps_in_a_fresh_process() -> None:
    result = _run(
        """
        import gym_telemetry.autoinstrument.startup  # what the .pth line imports
        from fastapi import FastAPI
        from gym_telemetry.autoinstrument.server_span import ServerSpanMiddleware

        plain = FastAPI()
        assert plain._telemetry["tracing"] is False and plain._telemetry["metrics"] is False
        assert isinstance(plain.build_middleware_stack(), ServerSpanMiddleware)

        chosen = FastAPI(telemetry={"tracing": True})
        assert chosen._telemetry["tracing"] is True
        assert not isinstance(chosen.build_middleware_stack(), ServerSpanMiddleware)
        print("ok")
        """,
        GYM_TELEMETRY="1",
    )
    assert result.stdout.strip() == "ok", result.stderr


def test_post_import_hook_runs_before_the_importer_continues(tmp_path: Path) -> None:
    (tmp_path / "target_mod.py").write_text("VALUE = 'original'\n")
    (tmp_path / "user_mod.py").write_text("from target_mod import VALUE\n")
    result = _run(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from gym_telemetry.autoinstrument.import_hooks import when_imported
        when_imported("target_mod", lambda m: setattr(m, "VALUE", "patched"))
        import user_mod
        assert user_mod.VALUE == "patched", user_mod.VALUE
        when_imported("target_mod", lambda m: setattr(m, "VALUE", "again"))  # already loaded
        assert sys.modules["target_mod"].VALUE == "again"
        print("ok")
        """
    )
    assert result.stdout.strip() == "ok", result.stderr


def test_service_name_prefix_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GYM_TELEMETRY_SERVICE_PREFIX", raising=False)
    assert service_name_for("math_with_judge") == "nemo-gym/math_with_judge"
    monkeypatch.setenv("GYM_TELEMETRY_SERVICE_PREFIX", "team-rl")
    assert service_name_for("math_with_judge") == "team-rl/math_with_judge"
    assert service_name_for(None) == "team-rl"
    monkeypatch.setenv("GYM_TELEMETRY_SERVICE_PREFIX", "  ")  # blank: the default
    assert service_name_for("a") == "nemo-gym/a"


def test_server_type_from_the_gym_base_class_in_the_mro() -> None:
    def gym_class(name: str, *bases: type) -> type:
        return type(name, bases or (object,), {})

    resources = gym_class("SimpleResourcesServer", gym_class("BaseResourcesServer"))
    environment = gym_class("BaseEnvironmentServer")
    assert server_type_of(gym_class("WeatherServer", resources)) == "resources"
    assert server_type_of(gym_class("MyAgent", gym_class("SimpleResponsesAPIAgent"))) == "agent"
    assert server_type_of(gym_class("Stub", gym_class("SimpleResponsesAPIModel"))) == "model"
    assert server_type_of(gym_class("LegacyAgent", environment)) == "environment"
    assert server_type_of(gym_class("NotGym")) is None
    for server_type in ("resources", "agent", "model", "environment"):
        assert server_type in semconv.SERVER_TYPES


def test_excluded_paths_spec() -> None:
    assert excluded_paths({}) == frozenset(DEFAULT_EXCLUDED_PATHS.split(","))
    assert "/health" in excluded_paths({})
    assert excluded_paths({"GYM_TELEMETRY_EXCLUDED_PATHS": ""}) == frozenset()
    assert excluded_paths({"GYM_TELEMETRY_EXCLUDED_PATHS": " /ping , /metrics,"}) == {
        "/ping",
        "/metrics",
    }


def test_stop_flush_timeout_spec() -> None:
    assert stop_flush_timeout_s({}) == DEFAULT_STOP_FLUSH_TIMEOUT_S
    assert stop_flush_timeout_s({env_vars.GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S: "0.5"}) == 0.5
    assert stop_flush_timeout_s({env_vars.GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S: "0"}) == 0
    assert (
        stop_flush_timeout_s({env_vars.GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S: "soon"})
        == DEFAULT_STOP_FLUSH_TIMEOUT_S
    )


def test_uvicorn_shutdown_is_patched_in_a_fresh_process() -> None:
    result = _run(
        """
        import gym_telemetry.autoinstrument.startup  # what the .pth line imports
        import uvicorn.server
        from gym_telemetry.autoinstrument.install import PATCHED

        assert getattr(uvicorn.server.Server.shutdown, PATCHED, False)
        print("ok")
        """,
        GYM_TELEMETRY="1",
    )
    assert result.stdout.strip() == "ok", result.stderr


def test_stock_fastapi_instrumentor_keeps_the_only_server_span() -> None:
    """An app under gym_telemetry that is also given to the stock FastAPIInstrumentor:
    the instrumentor must still instrument it (it refuses when the outermost layer is not
    Starlette's ServerErrorMiddleware), its SERVER span is the only one, and the route's
    gym.verify span is its child and still carries the rollout id from the baggage."""
    result = _run(
        """
        from types import SimpleNamespace

        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from opentelemetry.trace import SpanKind

        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        trace.set_tracer_provider(provider)

        from gym_telemetry.autoinstrument.identity import start_server_telemetry
        from gym_telemetry.autoinstrument.install import install

        install()

        class SimpleResourcesServer:
            config = SimpleNamespace(name="units_resources")

        assert start_server_telemetry(SimpleResourcesServer())

        from fastapi import FastAPI
        from fastapi.testclient import TestClient
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        app = FastAPI()

        @app.post("/verify")
        async def verify(body: dict) -> dict:
            return {"reward": 0.0}

        FastAPIInstrumentor.instrument_app(app)
        with TestClient(app) as client:
            answer = client.post(
                "/verify", json={}, headers={"baggage": "nemo.gym.rollout.id=7-3"}
            )
        assert answer.status_code == 200, answer.text
        spans = memory.get_finished_spans()
        servers = [s for s in spans if s.kind == SpanKind.SERVER]
        assert len(servers) == 1, [(s.name, s.instrumentation_scope.name) for s in spans]
        assert servers[0].instrumentation_scope.name.startswith("opentelemetry.instrumentation")
        verify_spans = [s for s in spans if s.name == "gym.verify"]
        assert len(verify_spans) == 1, [s.name for s in spans]
        assert verify_spans[0].parent.span_id == servers[0].context.span_id
        assert verify_spans[0].attributes["nemo.gym.rollout.id"] == "7-3"
        print("ok")
        """,
        GYM_TELEMETRY="1",
        GYM_TELEMETRY_SPAN_GROUPS="default,verify",
        GYM_TELEMETRY_POLL_INTERVAL_S="0",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
    )
    assert result.stdout.strip() == "ok", result.stderr
