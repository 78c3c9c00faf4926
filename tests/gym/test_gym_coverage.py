"""Gym coverage round 3, through Gym's own launcher: sandbox spans, MCP tool calls, streamed
model answers, cancellation and a multi-worker server, in one ``gym env start`` launch.

The stack (``gym-telemetry-run gym env start``, offline, the cached Gym env):

- ``policy_model``: the stub model (``examples/gym_stack``), which calls the first tool
  a request offers, sleeps on ``SLEEP:<s>`` and fails on ``POLICY_FAIL``;
- ``litmus`` (the shipped ``litmus_agent`` resources server with the ``local`` sandbox
  provider, cells time out after 3 s) and ``litmus_agent`` (``simple_agent``) in front;
- ``litmus_broken``: the same server with ``code_exec_user: root``, which the ``local``
  provider refuses (a provider error on exec);
- ``weather``: ``failing_weather`` with MCP auto-exposure on (``expose_tools_over_mcp``)
  and a verifier that sleeps on request; ``weather_agent`` (``simple_agent``) in front;
- ``weather_env``: a ``legacy_agent`` environment server with ``num_workers: 2`` in front
  of ``weather_agent`` (uvicorn workers, each loading the module-level ``app``).

Every server batches spans for an hour (``OTEL_BSP_SCHEDULE_DELAY``), so what reaches
the sink got there through the stop flush of each process (each uvicorn worker included)
after SIGTERM. All requests run first (module fixture), then the stack stops and each
test reads its part of what arrived.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from testkit.gym_stack import gym_env_start, launcher_config, launcher_env, post_json
from testkit.sink import RecordedSpan, RecordingSink
from tests.gym.traces import SERVER, Trace, traces, write_shapes
from tests.support.sidecar_proc import SidecarProcess

pytestmark = [pytest.mark.gym, pytest.mark.timeout(2400)]

SERVERS = {
    "policy_model": "model",
    "litmus": "resources",
    "litmus_agent": "agent",
    "litmus_broken": "resources",
    "weather": "resources",
    "weather_agent": "agent",
    "weather_env": "environment",
}
ERROR = Status.StatusCode.STATUS_CODE_ERROR
UNSET = Status.StatusCode.STATUS_CODE_UNSET
CODE_TOOL = "stateful_python_code_exec"
#: Cells of the sandbox rollouts: rollout id -> code.
CELLS = {
    "101-0": "print(6 * 7)",
    "102-0": "raise ValueError('cell boom')",
    "103-0": "import time\ntime.sleep(60)",
}
SECRET_CODE = "print('s3cr3t-cell-text')"
MULTI_WORKER_ROLLOUTS = 12
#: Gym answers a streamed chat call with SSE at once when generation takes longer.
CHAT_KEEPALIVE_S = 15.0
SLOW_S = 17


def _trace_id(n: int) -> str:
    return f"{n:032x}"


def _traceparent(n: int) -> str:
    return f"00-{_trace_id(n)}-{n:016x}-01"


def _headers(n: int, rollout_id: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "traceparent": _traceparent(n),
        "baggage": f"{semconv.ROLLOUT_ID}={rollout_id}",
    }


def _config(tmp: Path) -> dict[str, Any]:
    stub = {"entrypoint": "app.py", "host": "127.0.0.1", "fail_markers": ["POLICY_FAIL"]}
    litmus = {
        "entrypoint": "app.py",
        "domain": "knowledge",
        "verified": False,
        "description": "litmus_agent with the local sandbox provider",
        "host": "127.0.0.1",
        "code_exec_tool_name": CODE_TOOL,
        "code_exec_timeout_s": 3,
        "code_exec_max_output_chars": 10000,
        "sandbox_provider": {
            "local": {
                "workspace_root": str(tmp / "sandboxes"),
                "shell": "/bin/bash",
                "default_timeout_s": 30,
                "concurrency": 4,
            }
        },
        "sandbox_spec": {},
    }

    def agent(resources: str) -> dict[str, Any]:
        return {
            "responses_api_agents": {
                "simple_agent": {
                    "entrypoint": "app.py",
                    "host": "127.0.0.1",
                    "resources_server": {"type": "resources_servers", "name": resources},
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                }
            }
        }

    return {
        "head_server": {"host": "127.0.0.1", "port": 0},
        "policy_model": {"responses_api_models": {"stub_model": stub}},
        "litmus": {"resources_servers": {"litmus_agent": litmus}},
        "litmus_agent": agent("litmus"),
        "litmus_broken": {
            "resources_servers": {"litmus_agent": {**litmus, "code_exec_user": "root"}}
        },
        "weather": {
            "resources_servers": {
                "failing_weather": {
                    "entrypoint": "app.py",
                    "domain": "agent",
                    "verified": False,
                    "description": "weather with MCP and a verifier that sleeps on request",
                    "host": "127.0.0.1",
                    "expose_tools_over_mcp": True,
                }
            }
        },
        "weather_agent": agent("weather"),
        "weather_env": {
            "environment_servers": {
                "legacy_agent": {
                    "entrypoint": "app.py",
                    "host": "127.0.0.1",
                    "num_workers": 2,
                    "agent_server": {"type": "responses_api_agents", "name": "weather_agent"},
                }
            }
        },
    }


def _litmus_body(rollout_id: str, code: str) -> dict[str, Any]:
    task, index = rollout_id.split("-")
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": code}],
            "tools": [
                {
                    "type": "function",
                    "name": CODE_TOOL,
                    "description": "run a python cell",
                    "strict": True,
                    "parameters": {
                        "type": "object",
                        "properties": {"code": {"type": "string", "description": ""}},
                        "required": ["code"],
                        "additionalProperties": False,
                    },
                }
            ],
        },
        "expected_answer": "42",
        "answer_type": "float",
        "answer_format": "fmt_00",
        "match": {"rule": "exact"},
        "_ng_task_index": int(task),
        "_ng_rollout_index": int(index),
    }


def _weather_body(rollout_id: str, text: str = "what's it like in sf?", **extra: Any) -> Any:
    task, index = rollout_id.split("-")
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": text}],
            "tools": [
                {
                    "type": "function",
                    "name": "get_weather",
                    "description": "",
                    "strict": True,
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string", "description": ""}},
                        "required": ["city"],
                        "additionalProperties": False,
                    },
                }
            ],
        },
        "_ng_task_index": int(task),
        "_ng_rollout_index": int(index),
        **extra,
    }


def _verify_body(**extra: Any) -> dict[str, Any]:
    response = {
        "id": "resp_cancel",
        "created_at": 0,
        "model": "stub-model",
        "object": "response",
        "output": [],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    }
    return {"responses_create_params": {"input": "x"}, "response": response, **extra}


def _post(url: str, body: Any, headers: dict[str, str], timeout_s: float = 120) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _disconnect_after(
    port: int, path: str, body: Any, headers: dict[str, str], after_s: float
) -> bytes:
    """Send a request on a raw socket, read what comes within ``after_s``, then close it
    (a client that goes away). Returns what was read."""
    payload = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(payload)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    sock = socket.create_connection(("127.0.0.1", port), timeout=after_s)
    got = b""
    try:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        deadline = time.monotonic() + after_s
        while time.monotonic() < deadline:
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            got += chunk
    finally:
        sock.close()
    return got


def _stream(port: int, path: str, body: Any, headers: dict[str, str]) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


@dataclass
class Run:
    spans: list[RecordedSpan]
    answers: dict[str, Any]
    log: str

    def trace(self, n: int) -> Trace:
        wanted = bytes.fromhex(_trace_id(n))
        return Trace(wanted, [s for s in self.spans if s.span.trace_id == wanted])

    def rollout_traces(self, rollout_id: str) -> list[Trace]:
        ids = {
            s.span.trace_id
            for s in self.spans
            if s.attributes.get(semconv.ROLLOUT_ID) == rollout_id
        }
        return [t for tid, t in traces(self.spans).items() if tid in ids]


def _scenarios(launched: Any) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    ports = launched.ports

    # --- sandbox: three litmus rollouts, and a provider error on the broken server
    def litmus(item: tuple[str, str]) -> tuple[int, Any]:
        return post_json(launched.url("litmus_agent", "/run"), _litmus_body(*item), 180)

    with ThreadPoolExecutor(3) as pool:
        answers["litmus"] = dict(zip(CELLS, pool.map(litmus, CELLS.items()), strict=True))
    answers["broken"] = _post(
        launched.url("litmus_broken", f"/{CODE_TOOL}"),
        {"code": SECRET_CODE},
        _headers(104, "104-0"),
    )

    # --- MCP: seed a session, then one tools/call over /mcp
    _, seeded = post_json(launched.url("weather", "/seed_session"), {})
    token = seeded["mcp"]["headers"]["X-NeMo-Gym-Session-Token"]  # type: ignore[index]
    answers["mcp"] = _post(
        launched.url("weather", "/mcp"),
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "get_weather", "arguments": {"city": "SF"}},
        },
        {
            **_headers(201, "201-0"),
            "Accept": "application/json, text/event-stream",
            "X-NeMo-Gym-Session-Token": token,
        },
    )

    # --- streamed model answers (straight to the model server), and cancellations
    model_port = ports["policy_model"]

    def chat(text: str) -> dict[str, Any]:
        return {"model": "stub", "messages": [{"role": "user", "content": text}], "stream": True}

    jobs = {
        "responses_failed": lambda: _stream(
            model_port,
            "/v1/responses",
            {"model": "stub", "input": "POLICY_FAIL", "stream": True},
            _headers(301, "301-0"),
        ),
        "chat_slow_failed": lambda: _stream(
            model_port,
            "/v1/chat/completions",
            chat(f"SLEEP:{SLOW_S} POLICY_FAIL"),
            _headers(302, "302-0"),
        ),
        "chat_slow_ok": lambda: _stream(
            model_port, "/v1/chat/completions", chat(f"SLEEP:{SLOW_S}"), _headers(303, "303-0")
        ),
        "chat_disconnect": lambda: _disconnect_after(
            # past Gym's 15 s early return: headers and a keep-alive were sent
            model_port,
            "/v1/chat/completions",
            chat("SLEEP:45"),
            _headers(304, "304-0"),
            CHAT_KEEPALIVE_S + 6,
        ),
        "verify_disconnect": lambda: _disconnect_after(
            ports["weather"], "/verify", _verify_body(verify_delay_s=40), _headers(401, "401-0"), 3
        ),
        "verify_timeout": lambda: _timeout(
            launched.url("weather", "/verify"),
            _verify_body(verify_delay_s=40),
            _headers(402, "402-0"),
        ),
        "run_timeout": lambda: _timeout(
            launched.url("weather_agent", "/run"),
            _weather_body("403-0", "what's it like in sf? SLEEP:40"),
            {"Content-Type": "application/json"},
        ),
    }
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        answers.update({name: future.result() for name, future in futures.items()})

    # --- the multi-worker environment server
    def relay(n: int) -> tuple[int, Any]:
        return post_json(launched.url("weather_env", "/run"), _weather_body(f"5{n:02d}-0"), 180)

    with ThreadPoolExecutor(4) as pool:
        answers["multi"] = list(pool.map(relay, range(MULTI_WORKER_ROLLOUTS)))
    # let the cancelled handlers (their sleeps are cut, not waited out) settle before the stop
    time.sleep(2)
    return answers


def _timeout(url: str, body: Any, headers: dict[str, str]) -> str:
    try:
        _post(url, body, headers, timeout_s=3)
    except (TimeoutError, urllib.error.URLError) as exc:
        return type(exc).__name__
    return "answered"


@pytest.fixture(scope="module")
def run(gym_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    env_root = gym_python.parent.parent
    tmp = tmp_path_factory.mktemp("coverage")
    config_path, ports = launcher_config(_config(tmp), SERVERS, tmp, env_root)
    with RecordingSink() as sink:
        sidecar = SidecarProcess(
            backend=sink.endpoint, config={"span_groups": {"spec": "all"}}, log_dir=tmp
        ).start()
        env = launcher_env(sidecar.grpc_endpoint, sidecar.admin_url)
        if os.environ.get(AGENT_SRC_ENV):
            env["PYTHONPATH"] = os.environ[AGENT_SRC_ENV]
        env.update(
            {
                "GYM_TELEMETRY_SPAN_GROUPS": "all",
                # nothing leaves a process before it stops: the stop flush carries it all
                "OTEL_BSP_SCHEDULE_DELAY": "3600000",
                "GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S": "30",
            }
        )
        try:
            with gym_env_start(
                env_root, config_path, ports, env, tmp, up_timeout_s=600, stop_timeout_s=120
            ) as launched:
                answers = _scenarios(launched)
            sink.wait_for(lambda: False, 5)  # the last exports of the stop flushes land
        finally:
            sidecar.stop()
        run = Run(spans=sink.spans(), answers=answers, log=launched.log())
        _report_shapes(run)
        yield run


#: Set to a file path to get each case's trace shape as JSON (before/after reports).
SHAPES_ENV = "GYM_TELEMETRY_TEST_SHAPES"
#: Set to ``<agent src>:<semconv src>`` to run the servers with another agent tree first
#: on their path (a before/after comparison; the assertions are this tree's).
AGENT_SRC_ENV = "GYM_TELEMETRY_TEST_AGENT_SRC"


def _report_shapes(run: Run) -> None:
    cases: dict[str, list[RecordedSpan]] = {}
    for rollout_id in [*CELLS, "403-0", *(f"5{n:02d}-0" for n in range(MULTI_WORKER_ROLLOUTS))]:
        for i, trace in enumerate(run.rollout_traces(rollout_id)):
            cases[f"rollout {rollout_id} trace {i}"] = trace.spans
    for n in (104, 201, 301, 302, 303, 304, 401, 402):
        cases[f"trace {n}"] = run.trace(n).spans
    write_shapes(SHAPES_ENV, cases)


def _only(trace: Trace, name: str) -> RecordedSpan:
    found = trace.named(name)
    assert len(found) == 1, (name, [s.span.name for s in trace.spans])
    return found[0]


def _duration_s(span: RecordedSpan) -> float:
    return (span.span.end_time_unix_nano - span.span.start_time_unix_nano) / 1e9


# --- sandbox --------------------------------------------------------------------------------


def test_sandbox_spans_in_the_rollout_trace(run: Run) -> None:
    for rollout_id, (status, _answer) in run.answers["litmus"].items():
        assert status == 200, (rollout_id, _answer)
        [trace] = run.rollout_traces(rollout_id)
        assert trace.orphans() == [] and len(trace.roots()) == 1
        assert trace.rollout_ids() == {rollout_id}
        tool_route = next(
            s for s in trace.spans if s.span.kind == SERVER and s.span.name == f"POST /{CODE_TOOL}"
        )
        start = _only(trace, "gym.sandbox.start")
        execute = _only(trace, "gym.sandbox.exec")
        stop = _only(trace, "gym.sandbox.stop")
        verify = _only(trace, semconv.SPAN_VERIFY)
        assert trace.is_descendant(start, tool_route) and trace.is_descendant(execute, tool_route)
        assert trace.is_descendant(stop, verify)
        for span in (start, execute, stop):
            assert span.scope == "gym_telemetry.sandbox"
            assert span.attributes["nemo.gym.sandbox.provider"] == "local"
            assert str(span.attributes["nemo.gym.sandbox.id"]).startswith("local-")
            assert span.attributes[semconv.ROLLOUT_ID] == rollout_id
        assert start.span.status.code == UNSET and stop.span.status.code == UNSET
        # the cell's text is nowhere in the trace (attributes, events, status)
        code = CELLS[rollout_id]
        for span in trace.spans:
            assert code not in str(span.span), (rollout_id, span.span.name)
        if rollout_id == "101-0":
            assert execute.attributes["nemo.gym.sandbox.return_code"] == 0
            assert execute.span.status.code == UNSET
        elif rollout_id == "102-0":  # a cell that raised: the sandbox worked, the task did not
            assert execute.attributes["nemo.gym.sandbox.return_code"] != 0
            assert execute.span.status.code == UNSET
            assert semconv.ERROR_TYPE not in execute.attributes
        else:  # the cell outlived code_exec_timeout_s
            assert execute.attributes["nemo.gym.sandbox.error_type"] == "timeout"
            assert execute.span.status.code == ERROR
            assert execute.attributes[semconv.ERROR_TYPE] == "timeout"
        assert verify.attributes[semconv.VERIFY_SUCCEEDED] is True


def test_sandbox_provider_error(run: Run) -> None:
    status, _ = run.answers["broken"]
    assert status == 500
    trace = run.trace(104)
    execute = _only(trace, "gym.sandbox.exec")
    assert execute.span.status.code == ERROR
    assert execute.attributes[semconv.ERROR_TYPE] == "ValueError"
    assert execute.attributes[semconv.ROLLOUT_ID] == "104-0"
    assert not execute.span.events  # no exception text: a provider's message may quote the command
    [route] = [s for s in trace.spans if s.span.kind == SERVER]
    assert route.span.status.code == ERROR and trace.is_descendant(execute, route)
    for span in trace.spans:
        assert "s3cr3t-cell-text" not in str(span.span)


# --- MCP ------------------------------------------------------------------------------------


def test_mcp_tool_call_span(run: Run) -> None:
    status, text = run.answers["mcp"]
    assert status == 200 and "isError" in text and '"isError":false' in text.replace(" ", ""), text
    trace = run.trace(201)
    [route] = [s for s in trace.spans if s.span.kind == SERVER]
    assert route.span.name == "POST /mcp"
    tool = _only(trace, "tools/call get_weather")
    assert trace.parent(tool) is route
    assert tool.scope == "gym_telemetry.server"
    assert tool.attributes["gen_ai.tool.name"] == "get_weather"
    assert tool.attributes["mcp.method.name"] == "tools/call"
    assert tool.attributes[semconv.ROLLOUT_ID] == "201-0"
    assert tool.span.status.code == UNSET


# --- streamed model answers -----------------------------------------------------------------


def test_streamed_responses_failure_is_an_error(run: Run) -> None:
    status, body = run.answers["responses_failed"]
    assert status == 200 and "event: response.failed" in body
    span = _only(run.trace(301), "gym.model.responses")
    assert span.span.status.code == ERROR
    assert span.attributes[semconv.ERROR_TYPE] == "server_error"
    assert span.attributes[semconv.ROLLOUT_ID] == "301-0"


def test_streamed_chat_failure_after_early_return(run: Run) -> None:
    status, body = run.answers["chat_slow_failed"]
    assert status == 200 and "event: error" in body
    span = _only(run.trace(302), "gym.model.chat_completions")
    assert span.span.status.code == ERROR
    assert span.attributes[semconv.ERROR_TYPE] == "500"
    # the handler returned after Gym's 15 s keep-alive interval; the span ended with the
    # stream, after the model's SLEEP (a lower bound that holds on any machine)
    assert _duration_s(span) >= SLOW_S


def test_streamed_chat_span_ends_with_the_stream(run: Run) -> None:
    status, body = run.answers["chat_slow_ok"]
    assert status == 200 and "stub answer" in body
    span = _only(run.trace(303), "gym.model.chat_completions")
    assert span.span.status.code == UNSET
    assert _duration_s(span) >= SLOW_S
    assert span.attributes["nemo.gym.stream.events"] >= 2


def test_streamed_chat_disconnect_is_recorded(run: Run) -> None:
    assert b"200 OK" in run.answers["chat_disconnect"]  # the stream had started
    span = _only(run.trace(304), "gym.model.chat_completions")
    assert span.span.status.code == ERROR
    assert span.attributes[semconv.ERROR_TYPE] == "client_disconnected"
    assert span.attributes["nemo.gym.stream.disconnected"] is True


# --- cancellation ---------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "n"), [("verify_disconnect", 401), ("verify_timeout", 402)])
def test_cancelled_verification_did_not_succeed(run: Run, case: str, n: int) -> None:
    trace = run.trace(n)
    verify = _only(trace, semconv.SPAN_VERIFY)
    # the verification call did not complete: succeeded=false, as for a verifier that raised
    assert verify.attributes[semconv.VERIFY_SUCCEEDED] is False
    assert verify.span.status.code == ERROR
    assert verify.attributes[semconv.ERROR_TYPE] == "CancelledError"
    assert _duration_s(verify) < 40  # cut, not waited out
    [route] = [s for s in trace.spans if s.span.kind == SERVER]
    # no response was sent: the SERVER span has no status code and stays UNSET
    assert semconv.HTTP_RESPONSE_STATUS_CODE not in route.attributes
    assert route.span.status.code == UNSET
    assert trace.is_descendant(verify, route)


def test_cancelled_rollout_is_a_failed_rollout(run: Run) -> None:
    assert run.answers["run_timeout"] in ("TimeoutError", "URLError")
    [trace] = run.rollout_traces("403-0")
    rollout = _only(trace, semconv.SPAN_ROLLOUT)
    assert rollout.span.status.code == ERROR
    assert rollout.attributes[semconv.ERROR_TYPE] == "CancelledError"
    assert trace.named(semconv.SPAN_VERIFY) == []  # never reached
    model = _only(trace, "gym.model.responses")  # the model call it was waiting on
    assert model.span.status.code == ERROR
    assert model.attributes[semconv.ERROR_TYPE] == "CancelledError"
    assert trace.orphans() == []


# --- multi-worker server ---------------------------------------------------------------------


def test_multi_worker_server(run: Run) -> None:
    assert all(status == 200 for status, _ in run.answers["multi"]), run.answers["multi"]
    instances: set[str] = set()
    for n in range(MULTI_WORKER_ROLLOUTS):
        rollout_id = f"5{n:02d}-0"
        [trace] = run.rollout_traces(rollout_id)
        assert trace.orphans() == [] and len(trace.roots()) == 1, rollout_id
        assert trace.rollout_ids() == {rollout_id}
        [root] = trace.roots()
        assert root.resource[semconv.SERVER_NAME] == "weather_env"
        assert len(trace.named(semconv.SPAN_ROLLOUT)) == 2
        assert len(trace.named(semconv.SPAN_VERIFY)) == 1
        env_spans = [s for s in trace.spans if s.resource[semconv.SERVER_NAME] == "weather_env"]
        [instance] = {s.resource["service.instance.id"] for s in env_spans}
        instances.add(instance)
    # both workers served (each its own SDK and identity) and flushed at stop
    assert len(instances) == 2, instances
    for span in run.spans:
        assert "service.instance.id" in span.resource
