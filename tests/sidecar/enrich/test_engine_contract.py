"""Contract test of the Docker Engine API as the ``docker`` SDK uses it for enrichment.

No Docker engine runs here: ``tests.support.docker_engine`` serves the documented JSON
of the Engine API (v1.45) on a unix socket. These tests pin the calls and shapes the
Docker source relies on, through the real SDK over a real socket.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from gym_sidecar.enrich.docker_lookup import container_attributes

from tests.support.docker_engine import EngineContractServer, FakeContainer

CID = "3f4a" * 16


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EngineContractServer]:
    with EngineContractServer(tmp_path / "docker.sock") as server:
        server.add(
            FakeContainer(
                CID,
                "gym-model-1",
                "gym/model:1.2",
                {"com.docker.compose.project": "gym", "com.docker.compose.service": "model"},
                {"gym_default": "172.18.0.5"},
            )
        )
        yield server


def test_engine_api_version_negotiation_and_inspect(engine: EngineContractServer) -> None:
    client = docker.APIClient(base_url=engine.base_url, version="auto", timeout=5)
    try:
        assert client.api_version == "1.45"
        doc = client.inspect_container(CID)
        assert doc["Name"] == "/gym-model-1"
        assert doc["Config"]["Image"] == "gym/model:1.2"
        assert doc["NetworkSettings"]["Networks"]["gym_default"]["IPAddress"] == "172.18.0.5"
        # The engine resolves id prefixes and names too.
        assert client.inspect_container(CID[:12])["Id"] == CID
        assert client.inspect_container("gym-model-1")["Id"] == CID
        attrs = container_attributes(doc, ["com.docker.compose.project"])
        assert attrs["container.name"] == "gym-model-1"
        assert attrs["container.label.com.docker.compose.project"] == "gym"
        assert engine.count("/version") == 1
        assert engine.count(f"/v1.45/containers/{CID}/json") == 1
    finally:
        client.close()


def test_engine_api_unknown_container_is_not_found(engine: EngineContractServer) -> None:
    client = docker.APIClient(base_url=engine.base_url, version="1.45", timeout=5)
    try:
        with pytest.raises(docker.errors.NotFound):
            client.inspect_container("0" * 64)
        assert engine.count("/version") == 0  # a pinned version skips negotiation
    finally:
        client.close()


def test_engine_api_list_has_network_addresses(engine: EngineContractServer) -> None:
    client = docker.APIClient(base_url=engine.base_url, version="1.45", timeout=5)
    try:
        (summary,) = client.containers()
        assert summary["Id"] == CID
        assert summary["Names"] == ["/gym-model-1"]
        assert summary["NetworkSettings"]["Networks"]["gym_default"]["IPAddress"] == ("172.18.0.5")
        assert client.ping() is True
    finally:
        client.close()
