"""The test control plane itself: the version it is, RBAC on, the admission plugins the
other tests rely on really in the chain, and a clean stop that leaves no process."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from tests.k8s.conftest import new_name, pod
from tests.support.control_plane import (
    ControlPlane,
    ControlPlaneError,
    kubernetes_version,
    metric_value,
    on_ci,
)

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(3600)]


def test_version_rbac_and_admission_plugins(control_plane: ControlPlane) -> None:
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == kubernetes_version() == "v1.37.2"
    assert version["clientVersion"]["gitVersion"] == "v1.37.2"
    # RBAC: a user bound to nothing may do nothing (AlwaysAllow would let it).
    denied = control_plane.kubectl("get", "pods", "--as=nobody", check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
    assert control_plane.kubectl("auth", "can-i", "create", "pods").stdout.strip() == "yes"
    # One pod through the chain; the API server's metrics name each plugin that ran.
    namespace = control_plane.namespace(new_name("plugins"))
    control_plane.apply_json("create", "-n", namespace, obj=pod(new_name("p")))
    metrics = control_plane.metrics()
    for plugin, kind in [
        ("ServiceAccount", "admit"),
        ("MutatingAdmissionWebhook", "admit"),
        ("ValidatingAdmissionWebhook", "validate"),
        ("PodSecurity", "validate"),
    ]:
        assert (
            metric_value(
                metrics,
                "apiserver_admission_controller_admission_duration_seconds_count",
                name=plugin,
                type=kind,
                operation="CREATE",
            )
            > 0
        ), plugin


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_starts_and_stops_leaving_no_process(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path)
    try:
        plane.start()
    except ControlPlaneError as exc:
        if on_ci():
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    pids, port = plane.pids(), plane.port
    assert len(pids) == 2 and plane.alive() and _listening(port)
    plane.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):  # exited and reaped
            os.kill(pid, 0)
    assert not _listening(port)
    plane.stop()  # idempotent


def test_a_component_that_cannot_start_is_reported_with_its_log_tail(tmp_path: Path) -> None:
    """What the fixture turns into a CI failure (or a skip elsewhere): the component's
    name, its exit and the end of its own log."""
    script = tmp_path / "etcd"
    script.write_text(
        "#!/bin/sh\necho 'etcdmain: listen tcp: address already in use' >&2\nexit 3\n"
    )
    script.chmod(0o755)
    plane = ControlPlane(tmp_path / "plane", bins={"etcd": script})
    (tmp_path / "plane").mkdir()
    with pytest.raises(ControlPlaneError) as caught:
        plane.start()
    message = str(caught.value)
    assert "etcd exited 3 before healthy" in message
    assert "address already in use" in message
    assert plane.pids() == []
