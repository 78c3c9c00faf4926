"""Resource: container id detection and attribute precedence."""

from __future__ import annotations

import pytest
from gym_telemetry import resource

CID = "a" * 12 + "0123456789abcdef" * 3 + "b" * 4


@pytest.mark.parametrize(
    "text",
    [
        f"12:memory:/docker/{CID}\n11:cpu:/docker/{CID}\n",
        f"0::/system.slice/docker-{CID}.scope\n",
        f"1:name=systemd:/kubepods/burstable/pod1234/cri-containerd-{CID}.scope\n",
        f"0::/machine.slice/libpod-{CID}.scope/container\n",
        f"0::/kubepods.slice/kubepods-pod12.slice/crio-{CID}.scope\n",
    ],
)
def test_container_id_from_cgroup(text: str) -> None:
    assert resource.container_id_from_cgroup(text) == CID


def test_no_container_id_on_a_host_cgroup() -> None:
    assert (
        resource.container_id_from_cgroup("0::/user.slice/user-1000.slice/session-2.scope") is None
    )
    assert resource.container_id_from_cgroup("0::/\n") is None


def test_container_id_from_mountinfo_cgroup_v2() -> None:
    sandbox = "c" * 64
    text = (
        "1038 1031 0:130 / / rw,relatime - overlay overlay rw,lowerdir=/x\n"
        f"1050 1038 8:1 /var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/{sandbox}/hostname"
        " /etc/hostname rw - ext4 /dev/sda1 rw\n"
        f"1051 1038 8:1 /var/lib/docker/containers/{CID}/resolv.conf /etc/resolv.conf rw"
        " - ext4 /dev/sda1 rw\n"
        f"1052 1038 8:1 /var/lib/docker/containers/{CID}/hostname /etc/hostname rw"
        " - ext4 /dev/sda1 rw\n"
    )
    assert resource.container_id_from_mountinfo(text) == CID
    assert resource.container_id_from_mountinfo("1038 1031 0:130 / / rw - overlay x rw\n") is None


def test_detect_never_raises_on_missing_files(tmp_path: object) -> None:
    assert resource.detect_container_id("/nonexistent/cgroup", "/nonexistent/mountinfo") is None


def test_precedence_argument_over_environment_over_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,team=env")
    monkeypatch.setattr(resource, "detect_container_id", lambda: CID)
    res = resource.build_resource(
        server_name="weather", server_type="resources", resource_attributes={"team": "arg"}
    )
    attrs = dict(res.attributes)
    assert attrs["service.name"] == "weather"  # falls back to the server name
    assert attrs["nemo.gym.server.name"] == "weather"
    assert attrs["nemo.gym.server.type"] == "resources"
    assert attrs["deployment.environment"] == "ci"
    assert attrs["team"] == "arg"
    assert attrs["container.id"] == CID

    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    assert resource.build_resource(server_name="weather").attributes["service.name"] == "from-env"
    named = resource.build_resource("from-arg", server_name="weather")
    assert named.attributes["service.name"] == "from-arg"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"container.id=env-{CID[:8]}")
    assert resource.build_resource().attributes["container.id"] == f"env-{CID[:8]}"


def test_default_service_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert resource.build_resource().attributes["service.name"] == resource.DEFAULT_SERVICE_NAME


def test_service_instance_id_is_one_uuid_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid

    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    first = resource.build_resource("svc").attributes["service.instance.id"]
    second = resource.build_resource("svc").attributes["service.instance.id"]
    assert first == second and uuid.UUID(str(first)).version == 4
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=pod-1")
    assert resource.build_resource("svc").attributes["service.instance.id"] == "pod-1"
