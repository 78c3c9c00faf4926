"""deploy/gateway's configs start the gateway Collector, and the config check can fail.

``otelcol validate`` does not build tail-sampling policies, so ``otelcol_build.py
check-config`` starts the binary on each config (loopback ports) until its health check
answers. Each shipped config passes that; a config with a bogus policy passes
``validate`` and is refused by the check.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scripts import otelcol_build
from testkit.otelcol import TIER1, TIER1_DNS, TIER2

pytestmark = [pytest.mark.backends, pytest.mark.gateway, pytest.mark.timeout(3600)]


@pytest.mark.parametrize("config", [TIER1, TIER1_DNS, TIER2], ids=lambda p: p.name)
def test_shipped_config_starts(gateway_bin: Path, config: Path) -> None:
    ok, log = otelcol_build.check_config(config, binary=gateway_bin)
    assert ok, log[-4000:]


def test_a_bad_policy_passes_validate_but_not_the_check(gateway_bin: Path, tmp_path: Path) -> None:
    bad = tmp_path / "tier2-bad.yaml"
    bad.write_text(TIER2.read_text().replace("status_codes: [ERROR]", "status_codes: [FAILED]"))
    assert bad.read_text() != TIER2.read_text()
    env = otelcol_build.check_env()
    validate = subprocess.run(
        [str(gateway_bin), "validate", "--config", str(bad)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert validate.returncode == 0, validate.stderr  # why the check must start it
    ok, log = otelcol_build.check_config(bad, binary=gateway_bin, env=env)
    assert not ok
    assert "FAILED" in log, log[-4000:]


def test_components_of_the_distribution(gateway_bin: Path) -> None:
    out = subprocess.run(
        [str(gateway_bin), "components"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    for name in (
        "otlp",
        "load_balancing",
        "tail_sampling",
        "span_metrics",
        "resource",
        "filter",
        "attributes",
        "batch",
        "memory_limiter",
        "health_check",
        "otlp_grpc",
        "otlp_http",
        "debug",
    ):
        assert f"name: {name}\n" in out, name
