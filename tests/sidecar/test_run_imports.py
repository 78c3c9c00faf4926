"""What a real ``gym-sidecar run`` process imports: never uvicorn nor click, and not
the modules of features the run does not use (``LAZY``).

Its HTTP listeners are :mod:`gym_sidecar.wire.http1` on httptools; uvicorn (whose
protocol module alone cost 4.8 MiB resident, with click) must not come back through an
import anywhere, at start or later while serving. The process runs with
``PYTHONPROFILEIMPORTTIME=1``, so the interpreter itself writes one line per module the
first time anything imports it, whenever that is; the test serves a request on every
listener (OTLP/HTTP, OTLP/gRPC, the admin routes, the span-group API) and stops the
process before reading them.
"""

from __future__ import annotations

import re

import gym_telemetry_semconv as semconv
import httpx

from testkit.otlp_samples import grpc_export, http_post, trace_request
from testkit.sink import RecordingSink
from tests.support.sidecar_proc import SidecarProcess

FORBIDDEN = ("uvicorn", "click")
#: Imported only where their feature is used (issue 42, resident memory): OTLP/JSON
#: bodies, OTLP/HTTP export, the on-disk queue. The run below uses none of them.
LAZY = (
    "google.protobuf.json_format",
    "gym_sidecar.export.otlp_http",
    "gym_sidecar.export.http_post",
    "gym_sidecar.export.disk_queue",
    "gym_sidecar.export.segments",
)
_IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$", re.MULTILINE)


def imported_modules(log: str) -> set[str]:
    return set(_IMPORT_LINE.findall(log))


def test_gym_sidecar_run_never_imports_uvicorn_or_click() -> None:
    with RecordingSink() as sink:
        sc = SidecarProcess(backend=sink.endpoint, env={"PYTHONPROFILEIMPORTTIME": "1"})
        with sc:
            assert (
                http_post(
                    sc.http_url, "traces", trace_request("imports", 2).SerializeToString()
                ).status_code
                == 200
            )
            grpc_export(sc.grpc_endpoint, "traces", trace_request("imports", 2))
            for path in (semconv.HEALTHZ_PATH, semconv.READYZ_PATH, semconv.METRICS_PATH):
                assert sc.admin_get(path)[0] == 200
            assert httpx.get(sc.admin_url + semconv.SPAN_GROUPS_PATH).status_code == 200
        assert sc.returncode == 0, sc.log_text()[-3000:]
    modules = imported_modules(sc.log_text())
    # The import log is there and complete: the listeners' own modules are in it.
    assert {"httptools", "gym_sidecar.wire.http1.protocol", "gym_sidecar.receiver.http"} <= modules
    found = sorted(m for m in modules if m.split(".")[0] in FORBIDDEN)
    assert found == [], f"gym-sidecar run imported {found}"
    # gRPC export, the in-memory queue and protobuf bodies only: none of these.
    unused = sorted(m for m in LAZY if m in modules)
    assert unused == [], f"gym-sidecar run imported {unused} without using them"
