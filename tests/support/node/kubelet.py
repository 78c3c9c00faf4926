"""A kubelet v1.37.2 (built with the control plane: scripts/k8s_peers.py) joined to the
tests' API server as the node ``127.0.0.1``.

Its identity is a client certificate from the control plane's CA (``system:node:127.0.0.1``
in ``system:nodes``), bound to the built-in ``system:node`` ClusterRole (the test API
server authorises with RBAC only, no Node authorizer). The configuration is what this VM
needs (docs/testing.md): ``failCgroupV1: false`` and ``cgroupDriver: cgroupfs`` (cgroup v1
controllers, no systemd), ``makeIPTablesUtilChains: false`` (the firewall is left alone),
anonymous authentication with ``AlwaysAllow`` on its own port (the test API server has no
kubelet client certificate, and ``kubectl logs``/``exec`` go through it), its cgroups
under a root of its own (``cgroupRoot``, created here and removed afterwards), its root
directory, certificates and pod logs in directories of the test's, image garbage
collection off (the images are imported once, never pulled) and eviction thresholds low
(a busy shared disk must not evict the test's pod). There is no scheduler: pods name
``spec.nodeName`` themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import IO

from gym_telemetry_demo.procs import stop_process

from tests.support.control_plane import ControlPlane, log_tail
from tests.support.ports import free_port

NODE_NAME = "127.0.0.1"
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
CGROUP_BASE = Path("/sys/fs/cgroup")


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, ``name=systemd``, the unified one)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split()[0] in {"cgroup", "cgroup2"}:
            point = Path(pre.split()[4])
            if point.parent == CGROUP_BASE or point == CGROUP_BASE:
                points.append(point)
    return sorted(set(points))


def config_yaml(
    *,
    runtime_endpoint: str,
    port: int,
    healthz_port: int,
    cgroup_root: str,
    pod_logs_dir: Path,
) -> str:
    """The KubeletConfiguration (v1beta1), as JSON (which is YAML)."""
    return json.dumps(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": cgroup_root,
            "containerRuntimeEndpoint": runtime_endpoint,
            "imageServiceEndpoint": runtime_endpoint,
            "makeIPTablesUtilChains": False,
            "address": NODE_NAME,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz_port,
            "authentication": {
                "anonymous": {"enabled": True},
                "webhook": {"enabled": False},
                "x509": {},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(pod_logs_dir),
            "failSwapOn": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "resolvConf": "/etc/resolv.conf",
            "registerNode": True,
            "serializeImagePulls": False,
        },
        indent=2,
    )


class Kubelet:
    """The kubelet process; :meth:`start` returns once the node is Ready."""

    def __init__(
        self,
        *,
        binary: Path,
        plane: ControlPlane,
        runtime_endpoint: str,
        root_dir: Path,
        workdir: Path,
        cgroup_root: str,
    ) -> None:
        self.binary, self.plane = binary, plane
        self.runtime_endpoint = runtime_endpoint
        self.root_dir, self.workdir = root_dir, workdir
        self.cgroup_root = cgroup_root
        self.port, self.healthz_port = free_port(), free_port()
        self.log = workdir / "kubelet.log"
        self.pod_logs_dir = workdir / "pod-logs"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    def _kubeconfig(self) -> Path:
        pki = self.workdir / "pki"
        crt, key = self.plane.ca.issue(
            pki, "kubelet", f"system:node:{NODE_NAME}", organization="system:nodes", client=True
        )
        (pki / "ca.crt").write_bytes(self.plane.ca.pem())
        path = self.workdir / "kubelet.kubeconfig"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "test",
                            "cluster": {
                                "server": f"https://127.0.0.1:{self.plane.port}",
                                "certificate-authority": str(pki / "ca.crt"),
                            },
                        }
                    ],
                    "users": [
                        {
                            "name": "node",
                            "user": {"client-certificate": str(crt), "client-key": str(key)},
                        }
                    ],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "node"}}],
                    "current-context": "test",
                }
            )
        )
        return path

    def _make_cgroup_root(self) -> None:
        for hierarchy in cgroup_hierarchies():
            (hierarchy / self.cgroup_root.lstrip("/")).mkdir(exist_ok=True)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.root_dir.mkdir(parents=True, exist_ok=True)
        self.pod_logs_dir.mkdir(exist_ok=True)
        self.plane.kubectl(
            "create", "clusterrolebinding", "gym-telemetry-test-nodes",
            "--clusterrole=system:node", "--group=system:nodes", check=False,
        )  # fmt: skip
        config = self.workdir / "kubelet.yaml"
        config.write_text(
            config_yaml(
                runtime_endpoint=self.runtime_endpoint,
                port=self.port,
                healthz_port=self.healthz_port,
                cgroup_root=self.cgroup_root,
                pod_logs_dir=self.pod_logs_dir,
            )
        )
        self._make_cgroup_root()
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        self._log_file = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                str(self.binary),
                f"--config={config}",
                f"--kubeconfig={self._kubeconfig()}",
                # The node's name is its address: the API server reaches the kubelet (logs,
                # exec) at its Hostname address first. (--node-ip cannot be loopback.)
                f"--hostname-override={NODE_NAME}",
                f"--root-dir={self.root_dir}",
                f"--cert-dir={self.workdir / 'serving'}",
                "--v=2",
            ],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.ready():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the kubelet exited {self.proc.returncode}: {log_tail(self.log, 40)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {NODE_NAME} not Ready: {log_tail(self.log, 40)}")
            time.sleep(1)

    def ready(self) -> bool:
        out = self.plane.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if out.returncode:
            return False
        conditions = json.loads(out.stdout)["status"].get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def stop(self) -> None:
        stop_process(self.proc, STOP_TIMEOUT_S)  # its session's group: it leads one
        self.proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def remove_cgroups(self) -> list[str]:
        """``rmdir`` the cgroup root's subtree in every hierarchy, deepest first (only
        empty cgroups can go: call once no container runs). Returns what is left."""
        left = []
        for hierarchy in cgroup_hierarchies():
            top = hierarchy / self.cgroup_root.lstrip("/")
            if not top.is_dir():
                continue
            dirs = [Path(d) for d, _, _ in os.walk(top)]
            for path in sorted(dirs, key=lambda p: -len(p.parts)):
                try:
                    path.rmdir()
                except OSError:
                    left.append(str(path))
        return left
