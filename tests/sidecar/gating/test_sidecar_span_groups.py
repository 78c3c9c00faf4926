"""A real sidecar process: the span-group API over HTTP, enforcement of what arrives,
and reloads by file change and by SIGHUP."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testkit.otlp_samples import add_resource
from testkit.sink import RecordingSink
from tests.support.sidecar_proc import SidecarProcess

TOKEN = "t0ken-for-tests"
VERIFY = semconv.scope_name(semconv.GROUP_VERIFY)
ROLLOUT = semconv.scope_name(semconv.GROUP_ROLLOUT)


def http(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, Any]:
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            raw = resp.read()
            return resp.status, resp.headers, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = raw.decode()
        return exc.code, exc.headers, doc


def wait_until(predicate: Any, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


def start_sidecar(sink: RecordingSink, span_groups: dict[str, Any]) -> SidecarProcess:
    return SidecarProcess(backend=sink.endpoint, config={"span_groups": span_groups}).start()


def test_api_auth_validation_etag_and_warnings(sink: RecordingSink) -> None:
    sc = start_sidecar(sink, {"spec": "default,verify", "token": TOKEN})
    try:
        url = sc.admin_url + "/v1/span-groups"
        status, headers, doc = http("GET", url + "?service=res")
        assert status == 200
        assert doc["service"] == "res" and doc["modes"]["verify"] == "on"
        etag = headers["ETag"]
        assert http("GET", url + "?service=res", headers={"If-None-Match": etag})[0] == 304

        new = {"spec": "default,verify", "modes": {"verify": "off"}}
        assert http("PUT", url, new)[0] == 401
        assert http("PUT", url, new, {"Authorization": "Bearer nope"})[0] == 401
        status, _, doc = http(
            "PUT", url, {"spec": "default,verfy"}, {"Authorization": f"Bearer {TOKEN}"}
        )
        assert status == 400 and "verfy" in doc["error"]
        assert http("GET", url + "?service=res", headers={"If-None-Match": etag})[0] == 304

        status, _, doc = http(
            "PUT",
            url,
            {"spec": "verify,rollout", "modes": {"http_client": "metrics"}},
            {"Authorization": f"Bearer {TOKEN}"},
        )
        assert status == 200
        assert any("'server' is off" in w for w in doc["warnings"])
        assert any("'http_client' is in metrics mode" in w for w in doc["warnings"])
        status, headers, doc = http("GET", url + "?service=res", headers={"If-None-Match": etag})
        assert status == 200 and headers["ETag"] != etag
        assert doc["modes"]["server"] == "off"
        assert TOKEN not in sc.log_text()
    finally:
        sc.stop()
    assert sc.returncode == 0


def post_traces(sc: SidecarProcess, req: ExportTraceServiceRequest) -> None:
    status, _, _ = http(
        "POST",
        sc.http_url + "/v1/traces",
        req.SerializeToString(),
        {"Content-Type": "application/x-protobuf"},
    )
    assert status == 200


def test_spans_of_disabled_groups_are_dropped_and_counted(sink: RecordingSink) -> None:
    sc = start_sidecar(
        sink,
        {
            "spec": "default,verify",
            "token": TOKEN,
            "services": {"res-b": {"modes": {"verify": "metrics"}}},
        },
    )
    try:
        req = ExportTraceServiceRequest()
        add_resource(req, "res-a", {VERIFY: 3, ROLLOUT: 1})
        add_resource(req, "res-b", {VERIFY: 4, ROLLOUT: 1})
        post_traces(sc, req)
        assert sink.wait_spans(5)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, _, _ = http(
            "PUT", sc.admin_url + "/v1/span-groups", {"spec": "default,-verify"}, auth
        )
        assert status == 200
        before = sink.span_count
        post_traces(sc, req)  # stale agents still sending verify spans
        assert sink.wait_spans(before + 2)
        time.sleep(0.5)  # let anything else that would arrive arrive
        arrived = [s.scope for s in sink.spans()[before:]]
        assert arrived == [ROLLOUT, ROLLOUT]
        name = "gym_sidecar_span_group_dropped_spans_total"
        assert sc.metric(name, group="verify", service="res-b", mode="metrics") == 4
        assert sc.metric(name, group="verify", service="res-b", mode="off") == 4
        assert sc.metric(name, group="verify", service="res-a", mode="off") == 3
        assert sc.metric(name, group="verify", service="res-a", mode="metrics") == 0
    finally:
        sc.stop()


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` in one rename, so the watcher never reads half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_reload_by_file_change_and_by_sighup(sink: RecordingSink) -> None:
    sc = start_sidecar(sink, {"spec": "default,-verify", "token": TOKEN, "watch_interval_s": 0.1})
    try:
        assert sc.config_path is not None
        path: Path = sc.config_path
        url = sc.admin_url + "/v1/span-groups?service=res"

        def verify_mode() -> str:
            return str(http("GET", url)[2]["modes"]["verify"])

        assert verify_mode() == "off"
        config = yaml.safe_load(path.read_text())
        config["span_groups"]["spec"] = "default,verify"
        config["span_groups"]["modes"] = {"verify": "metrics"}
        replace_file(path, yaml.safe_dump(config))
        assert wait_until(lambda: verify_mode() == "metrics")

        # An invalid file is refused; the policy in force stays.
        config["span_groups"]["spec"] = "default,verfy"
        replace_file(path, yaml.safe_dump(config))
        assert wait_until(
            lambda: (
                sc.metric("gym_sidecar_span_group_changes_total", source="file", outcome="invalid")
                == 1
            )
        )
        assert verify_mode() == "metrics"
        config["span_groups"]["spec"] = "default,verify"
        replace_file(path, yaml.safe_dump(config))
        # Seen by the watcher (same policy as in force) before the PUT below, which a
        # later file change would otherwise discard.
        assert wait_until(
            lambda: (
                sc.metric(
                    "gym_sidecar_span_group_changes_total", source="file", outcome="unchanged"
                )
                == 1
            )
        )

        # SIGHUP re-reads the file and discards what PUT set.
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert http("PUT", sc.admin_url + "/v1/span-groups", {"spec": "all"}, auth)[0] == 200
        assert verify_mode() == "on"
        sc.signal(signal.SIGHUP)
        assert wait_until(lambda: verify_mode() == "metrics")
        assert sc.metric("gym_sidecar_span_group_changes_total", source="sighup") >= 1
    finally:
        sc.stop()
    assert sc.returncode == 0
