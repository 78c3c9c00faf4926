"""``--backend`` plus ``--local-store``: a real sidecar sends every span to both."""

from __future__ import annotations

import time
from contextlib import closing
from pathlib import Path

from gym_sidecar.store import db, queries

from testkit.otlp_samples import grpc_export
from testkit.rollout_requests import Rollout, trace_request
from testkit.sink import RecordingSink
from tests.support.sidecar_proc import SidecarProcess


def test_backend_and_local_store_both_get_every_span(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    request = trace_request([Rollout(f"{i}-0", time.time_ns(), 10) for i in range(4)])
    with RecordingSink() as sink:
        sc = SidecarProcess(
            sink.endpoint,
            extra_args=["--local-store", "--store-dir", str(store_dir)],
            config={"span_groups": {"spec": "all"}},
            log_dir=tmp_path,
        ).start()
        try:
            grpc_export(sc.grpc_endpoint, "traces", request)
            assert sink.wait_spans(20)
        finally:
            assert sc.stop() == 0
        assert sink.span_count == 20
    with closing(db.connect(store_dir / "traces.db", readonly=True)) as conn:
        assert queries.store_counts(conn)["spans"] == 20
        assert sorted(r.rollout_id for r in queries.rollouts(conn)) == [f"{i}-0" for i in range(4)]


def test_backend_alone_leaves_no_store(tmp_path: Path) -> None:
    with RecordingSink() as sink:
        sc = SidecarProcess(sink.endpoint, env={"XDG_DATA_HOME": str(tmp_path)}).start()
        try:
            grpc_export(sc.grpc_endpoint, "traces", trace_request([Rollout("1-0", 1, 5)]))
            assert sink.wait_spans(4)
        finally:
            sc.stop()
    assert not (tmp_path / "gym-sidecar").exists()
