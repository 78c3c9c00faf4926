"""``bash scripts/demo.sh --jaeger``: the demo against the Jaeger built from source.

Runs what a user runs (bootstrap, the cached Gym environment, the cached Jaeger build,
the sidecar forwarding to Jaeger while keeping its local store, five real Gym servers,
rollouts, the report) and checks that it printed the Jaeger API URL of a failed
rollout's trace, for a rollout the local store also lists as failed, the web view's page
and API URL of the same trace, and stopped cleanly. The demo itself fetched that trace
from Jaeger before printing the URL.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.demo import demo_env, run_demo

pytestmark = [pytest.mark.gym, pytest.mark.backends, pytest.mark.timeout(3600)]

ROLLOUTS = 6
FAILING = 2


def test_demo_prints_a_failed_rollouts_trace_url_in_jaeger(
    tmp_path: Path, jaeger_bin: Path
) -> None:
    result = run_demo(
        extra_args=["--jaeger"],
        rollouts=ROLLOUTS,
        failing=FAILING,
        concurrency=3,
        store_dir=tmp_path / "store",
        workdir=tmp_path / "work",
        env=demo_env(),
        timeout_s=3500,
    )
    out = result.stdout
    assert result.returncode == 0, out[-6000:] + result.stderr[-4000:]
    assert f"failing 500: {FAILING}" in out
    [(rollout_id, spans)] = re.findall(r"Jaeger: failed rollout (\S+), (\d+) spans from 3 ", out)
    assert int(spans) > 0
    [url] = re.findall(
        r"^  (http://127\.0\.0\.1:\d+/api/traces/[0-9a-f]{32})$",
        out.split("in the web view:")[0],
        re.M,
    )
    assert url
    failed_table = out.split("Failed rollouts", 1)[1].split("└", 1)[0]
    assert rollout_id in failed_table
    # the web view's page and Jaeger-compatible API URL of the same rollout's trace
    assert f"The same failed rollout {rollout_id} in the web view:" in out
    web = out.split("in the web view:")[1]
    page = re.findall(r"^  (http://127\.0\.0\.1:\d+/trace/[0-9a-f]{32})$", web, re.M)[0]
    [view_api] = re.findall(r"^  (http://127\.0\.0\.1:\d+/api/traces/[0-9a-f]{32})$", web, re.M)
    assert page.rsplit("/", 1)[1] == view_api.rsplit("/", 1)[1] == url.rsplit("/", 1)[1]
    assert "stopped cleanly." in out
