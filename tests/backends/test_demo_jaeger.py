"""``bash scripts/demo.sh --jaeger``: the demo against the Jaeger built from source.

Runs what a user runs (bootstrap, the cached Gym environment, the cached Jaeger build,
the sidecar forwarding to Jaeger while keeping its local store, five real Gym servers,
rollouts, the report) and checks that it printed the Jaeger API URL of a failed
rollout's trace, for a rollout the local store also lists as failed, and stopped
cleanly. The demo itself fetched that trace from Jaeger before printing the URL.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gym, pytest.mark.backends, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
ROLLOUTS = 6
FAILING = 2


def test_demo_prints_a_failed_rollouts_trace_url_in_jaeger(
    tmp_path: Path, jaeger_bin: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
    env["COLUMNS"] = "200"
    result = subprocess.run(
        [
            "bash",
            str(REPO / "scripts" / "demo.sh"),
            "--jaeger",
            "--rollouts",
            str(ROLLOUTS),
            "--failing",
            str(FAILING),
            "--concurrency",
            "3",
            "--store-dir",
            str(tmp_path / "store"),
            "--workdir",
            str(tmp_path / "work"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3500,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out[-6000:] + result.stderr[-4000:]
    assert f"failing 500: {FAILING}" in out
    [(rollout_id, spans)] = re.findall(r"Jaeger: failed rollout (\S+), (\d+) spans from 3 ", out)
    assert int(spans) > 0
    [url] = re.findall(r"^  (http://127\.0\.0\.1:\d+/api/traces/[0-9a-f]{32})$", out, re.M)
    assert url
    failed_table = out.split("Failed rollouts", 1)[1].split("└", 1)[0]
    assert rollout_id in failed_table
    assert "stopped cleanly." in out
