"""The compose stack's Prometheus config, checked by the real ``promtool``.

The backend tests run Prometheus with this file's scrape job (targets replaced), so a
config Prometheus refuses would fail there too; this says which file is wrong.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.prometheus import COMPOSE_CONFIG

# the first use may install Debian's prometheus package (apt-get update + install)
pytestmark = [pytest.mark.backends, pytest.mark.timeout(900)]


def test_compose_prometheus_config_passes_promtool(prometheus_bin: Path) -> None:
    promtool = prometheus_bin.with_name("promtool")
    result = subprocess.run(
        [str(promtool), "check", "config", str(COMPOSE_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr
