"""The Docker test tooling's own contract, without an engine: what it names and how it
reports an engine that cannot start (tests/support/docker_daemon.py, docker_images.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.deploy.support import REPO
from tests.support import docker_daemon, docker_images


def test_stand_ins_cover_every_third_party_image_named() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    own = {"gym-server", "gym-telemetry-sidecar"}
    third_party = {s["image"] for s in compose.values() if s["image"].split(":")[0] not in own}
    for dockerfile in (REPO / "deploy" / "docker").glob("*.Dockerfile"):
        text = dockerfile.read_text()
        third_party.update(re.findall(r"ARG PYTHON_IMAGE=(\S+)", text))
        third_party.update(re.findall(r"^FROM (python:\S+)", text, flags=re.M))
    tags = {tag for standin in docker_images.standins() for tag in standin.tags}
    assert tags == third_party
    for standin in docker_images.standins():
        assert (docker_images.STANDIN_DIR / standin.dockerfile).is_file()


def test_an_engine_that_cannot_start_fails_on_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="on CI: dockerd exited with 1: boom"):
        docker_daemon.skip_or_fail(docker_daemon.EngineUnavailable("dockerd exited with 1: boom"))


def test_an_engine_that_cannot_start_skips_elsewhere_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="unavailable: no root"):
        docker_daemon.skip_or_fail(docker_daemon.EngineUnavailable("no root"))


def test_the_daemons_own_error_is_quoted(tmp_path: Path) -> None:
    log = tmp_path / "dockerd.log"
    log.write_text(
        'time="x" level=info msg="Starting up"\n'
        'time="x" level=info msg="libcontainerd: started new containerd process"\n'
        "failed to start daemon: error initializing graphdriver: driver not supported\n"
    )
    assert "error initializing graphdriver: driver not supported" in (
        docker_daemon._daemon_error(log)
    )
    assert docker_daemon._daemon_error(tmp_path / "absent.log") == "(no daemon log)"
