"""The sidecar as ``gym-sidecar run`` starts it never imports grpc (grpc core: ~13 MiB
resident): not at start, not while it receives over gRPC and HTTP, exports over gRPC
(plain and gzip) or into its local store, nor while it stops.

The check is an import trap installed in the real CLI process before anything else
runs: a ``sitecustomize`` module (on ``PYTHONPATH``) puts a finder first on
``sys.meta_path`` that, asked for ``grpc`` or anything under it, writes the importing
stack to a file and ends the process at once with code 97, so neither a caught
ImportError nor a lazy import can hide it. The trap also writes an ``armed`` file
when installed, so a run where it was not loaded cannot pass; and
:func:`test_the_trap_catches_the_grpcio_client` checks that it does fire, by asking for
the one client that imports grpc on purpose.
"""

from __future__ import annotations

import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testkit.otlp_samples import (
    grpc_export,
    http_post,
    logs_request,
    metrics_request,
    trace_request,
)
from testkit.sink import RecordingSink
from testkit.wait import wait_for
from tests.support.sidecar_proc import SidecarProcess

TRAPPED_EXIT = 97

SITECUSTOMIZE = textwrap.dedent(
    """
    import os, sys, traceback

    _report = os.environ["GYM_TEST_GRPC_TRAP"]


    class _GrpcTrap:
        def find_spec(self, name, path=None, target=None):
            if name == "grpc" or name.startswith(("grpc.", "grpc_status")):
                with open(_report, "w") as f:
                    f.write(f"imported {name}:\\n")
                    traceback.print_stack(file=f)
                os._exit(97)
            return None


    sys.meta_path.insert(0, _GrpcTrap())
    with open(_report + ".armed", "w") as f:
        f.write("armed")
    """
)


@pytest.fixture
def trap(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    report = tmp_path / "grpc-imported.txt"
    pythonpath = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    yield {"PYTHONPATH": pythonpath, "GYM_TEST_GRPC_TRAP": str(report)}, report


def _exercise(sc: SidecarProcess, tag: str) -> ExportTraceServiceRequest:
    """Traces, metrics and logs over gRPC (plain and gzip: the receiver's inflation too),
    traces over HTTP; the trace request sent over gRPC is returned."""
    import grpc  # the test's client, not the sidecar's

    request = trace_request(tag, 4)
    grpc_export(sc.grpc_endpoint, "traces", request)
    grpc_export(sc.grpc_endpoint, "traces", trace_request(tag + "-gz", 2), grpc.Compression.Gzip)
    grpc_export(sc.grpc_endpoint, "metrics", metrics_request(tag + ".m"))
    grpc_export(sc.grpc_endpoint, "logs", logs_request(tag))
    body = trace_request(tag + "-http", 2).SerializeToString()
    assert http_post(sc.http_url, "traces", body).status_code == 200
    return request


def _assert_never_imported(sc: SidecarProcess, report: Path) -> None:
    assert Path(str(report) + ".armed").exists(), "the import trap was not loaded"
    assert not report.exists(), report.read_text()
    assert sc.returncode == 0, sc.log_text()[-3000:]


def test_default_configuration_never_imports_grpc(trap: tuple[dict[str, str], Path]) -> None:
    """No backend: the local store is the exporter (the default configuration)."""
    env, report = trap
    with SidecarProcess(env=env) as sc:
        _exercise(sc, "free-default")
        assert wait_for(
            lambda: sc.metric("gym_sidecar_exported_items_total", signal="traces") >= 8, 30
        )
        sc.signal(signal.SIGTERM)
    _assert_never_imported(sc, report)


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_grpc_export_never_imports_grpc(
    trap: tuple[dict[str, str], Path], compression: str
) -> None:
    """A gRPC backend with the default client (``grpc_client: auto``), either compression."""
    env, report = trap
    with (
        RecordingSink() as sink,
        SidecarProcess(
            backend=sink.endpoint,
            env=env,
            extra_args=["--backend-compression", compression],
        ) as sc,
    ):
        request = _exercise(sc, f"free-{compression}")
        want = {span.name for span in request.resource_spans[0].scope_spans[0].spans}
        assert sink.wait_for(lambda: want <= {s.span.name for s in sink.spans()}, 30)
        assert sink.wait_for(lambda: len(sink.metric_requests()) >= 1, 30)
        assert sink.wait_for(lambda: len(sink.log_requests()) >= 1, 30)
        sc.signal(signal.SIGTERM)
    _assert_never_imported(sc, report)


def test_the_trap_catches_the_grpcio_client(trap: tuple[dict[str, str], Path]) -> None:
    """``grpc_client: grpcio`` imports grpc when the exporter is built, at start: the
    trap ends the process with its own code and names the import."""
    env, report = trap
    sc = SidecarProcess(
        backend="127.0.0.1:9",
        env={**env, "GYM_SIDECAR_BACKEND__GRPC_CLIENT": "grpcio"},
        startup_timeout_s=60,
    )
    with pytest.raises(RuntimeError, match=f"exited early with code {TRAPPED_EXIT}"):
        sc.start()
    assert "imported grpc" in report.read_text()
