"""A Kubernetes node for the tests: Debian's containerd and a kubelet on this machine,
joined to the tests' control plane, with the project's images imported; torn down so
that the host is as it was.

:class:`Node` (a context manager) does, in order, each step timed (``Node.timings``):

1. takes the machine-wide node lock (``~/.cache/gym-telemetry/node/node.lock``: one node
   per machine at a time; a second test run waits) and a :mod:`host_state` snapshot;
2. builds or reuses the kubelet (with the control plane) and the CNI plugins
   (scripts/k8s_peers.py), installs containerd and runc (apt), builds the pause image;
3. creates the pods' bridge (:mod:`network`), starts containerd, imports the pause
   image and the images asked for (``docker save | ctr import``), starts the kubelet
   and waits for the node to be Ready.

:meth:`Node.teardown` undoes it all, also after a failure half-way: it deletes every pod
on the node and waits for the kubelet to stop their sandboxes (CNI teardown, network
namespaces), stops the kubelet, removes any container left (the fallback), stops
containerd and its shims, unmounts what is left under the node's directories and in
``/run/netns``, deletes the bridge, removes the kubelet's cgroups, writes back the kernel
tunables the kubelet changed, removes what appeared under ``/var/lib/cni``,
``/var/log/containers`` and the other default paths, deletes the Node object, and
returns the :func:`host_state.differences` between the snapshot before and one after
(empty when the host is as it was).
"""

from __future__ import annotations

import fcntl
import json
import secrets
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tests.support.control_plane import REPO, ControlPlane
from tests.support.docker_daemon import Engine
from tests.support.node import host_state, pause
from tests.support.node.containerd import Containerd, install, unmount_under
from tests.support.node.kubelet import NODE_NAME, Kubelet
from tests.support.node.network import PodNetwork

RUN_DIR = Path("/run/gym-telemetry-node")
"""The node's runtime state: containerd's state and socket (short paths: unix sockets)."""
DRAIN_TIMEOUT_S = 300.0


def cache_dir() -> Path:
    """``~/.cache/gym-telemetry/node``: containerd's root (images kept), the lock."""
    return Path.home() / ".cache" / "gym-telemetry" / "node"


def _k8s_peers() -> Any:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import k8s_peers
    finally:
        sys.path.pop(0)
    return k8s_peers


class Node:
    """See the module docstring."""

    def __init__(self, plane: ControlPlane, engine: Engine, workdir: Path) -> None:
        self.plane, self.engine, self.workdir = plane, engine, workdir
        self.timings: dict[str, float] = {}
        self.images: dict[str, str] = {}
        """Docker tag -> containerd name of every imported image."""
        self.before: host_state.HostState | None = None
        self.network: PodNetwork | None = None
        self.containerd: Containerd | None = None
        self.kubelet: Kubelet | None = None
        self.teardown_notes: list[str] = []
        """What the teardown had to clean up beyond the normal stop (for the test log)."""
        self._lock: IO[str] | None = None
        self._torn_down = False

    def _timed(self, step: str, started: float) -> None:
        self.timings[step] = round(time.monotonic() - started, 1)

    def start(self, images: Sequence[str]) -> None:
        cache = cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        self._lock = (cache / "node.lock").open("w")
        started = time.monotonic()
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self._timed("waited for the node lock", started)
        self.before = host_state.snapshot()
        try:
            self._start(images)
        except BaseException:
            self.teardown()
            raise

    def _start(self, images: Sequence[str]) -> None:
        t = time.monotonic()
        cni_bin = _k8s_peers().ensure_cni()
        self._timed("CNI plugins (build or reuse)", t)
        t = time.monotonic()
        install()
        self._timed("containerd and runc (apt or present)", t)
        t = time.monotonic()
        sandbox = pause.ensure_image(self.engine)
        self._timed("pause image", t)

        self.network = PodNetwork.choose(self.workdir / "cni-ipam")
        self.network.create()
        conf_dir = self.workdir / "cni-conf"
        self.network.write_conflist(conf_dir)

        self.containerd = Containerd(
            root=cache_dir() / "containerd-root",
            state=RUN_DIR / "containerd",
            cni_bin=cni_bin,
            cni_conf=conf_dir,
            sandbox_image=sandbox,
            log=self.workdir / "containerd.log",
        )
        t = time.monotonic()
        self.containerd.start()
        self._timed("containerd start", t)
        for tag in (sandbox, *images):
            name, seconds = self.containerd.import_image(self.engine, tag)
            self.images[tag] = name
            self.timings[f"import {tag}"] = round(seconds, 1)

        self.kubelet = Kubelet(
            binary=self.plane.bins["kubelet"],
            plane=self.plane,
            runtime_endpoint=self.containerd.endpoint,
            root_dir=cache_dir() / "kubelet",
            workdir=self.workdir / "kubelet",
            cgroup_root=f"/gym-telemetry-node-{secrets.token_hex(3)}",
        )
        t = time.monotonic()
        self.kubelet.start()
        self._timed("kubelet start to node Ready", t)

    # -- teardown ---------------------------------------------------------------------

    def _pods_on_node(self) -> list[tuple[str, str]]:
        out = self.plane.kubectl(
            "get", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={NODE_NAME}",
            "-o", "json", check=False,
        )  # fmt: skip
        if out.returncode:
            return []
        items = json.loads(out.stdout).get("items") or []
        return [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in items]

    def _drain(self) -> None:
        """Delete every pod on the node and wait until containerd runs no task."""
        for namespace, name in self._pods_on_node():
            self.plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=false", check=False)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            tasks: list[str] = []
            if self.containerd is not None and self.containerd.proc is not None:
                tasks = self.containerd.ctr("tasks", "ls", "-q", check=False).stdout.split()
            if not self._pods_on_node() and not tasks:
                return
            time.sleep(1)

    def teardown(self) -> list[str]:
        """Undo everything (module docstring); the host's differences from before."""
        if self._torn_down or self.before is None:
            return []
        self._torn_down = True
        notes = self.teardown_notes
        t = time.monotonic()
        try:
            if self.kubelet is not None and self.kubelet.proc is not None:
                self._drain()
            if self.kubelet is not None:
                self.kubelet.stop()
            if self.containerd is not None and self.containerd.proc is not None:
                removed = self.containerd.remove_containers()
                if removed:
                    notes.append(f"containers left by the kubelet, removed: {len(removed)}")
            if self.containerd is not None:
                self.containerd.stop()
            new_netns = set(host_state._listing(Path("/run/netns")) or []) - set(
                self.before.paths.get("/run/netns") or []
            )
            leftover = unmount_under(
                RUN_DIR, cache_dir() / "kubelet", *(Path("/run/netns") / n for n in new_netns)
            )
            if leftover:
                notes.append(f"unmounted after the node stopped: {leftover}")
            if self.network is not None:
                self.network.delete()
            if self.kubelet is not None:
                left = self.kubelet.remove_cgroups()
                if left:
                    notes.append(f"cgroups that could not be removed: {left}")
            restored = host_state.restore_sysctls(self.before)
            if restored:
                notes.append(f"sysctls written back: {', '.join(restored)}")
            removed_paths = host_state.remove_new_entries(self.before)
            if removed_paths:
                notes.append(f"removed: {len(removed_paths)} entries under the default paths")
            shutil.rmtree(cache_dir() / "kubelet", ignore_errors=True)
            shutil.rmtree(RUN_DIR, ignore_errors=True)
            self.plane.kubectl("delete", "node", NODE_NAME, "--wait=false", check=False)
            self._timed("teardown", t)
            # Read while the lock is held: no other node can be changing the host.
            return host_state.differences(self.before, host_state.snapshot())
        finally:
            if self._lock is not None:
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                self._lock.close()
                self._lock = None


@contextmanager
def running_node(
    plane: ControlPlane, engine: Engine, workdir: Path, images: Sequence[str]
) -> Iterator[Node]:
    node = Node(plane, engine, workdir)
    node.start(images)
    try:
        yield node
    finally:
        node.teardown()
