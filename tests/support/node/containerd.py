"""Debian's containerd as the kubelet's container runtime (CRI), beside the Docker engine.

:func:`install` puts Debian's ``containerd`` (1.6, CRI plugin built in) and ``runc`` on
the machine with apt when they are missing (``docker.io`` already depends on both).
:class:`Containerd` runs one on its own configuration, never the system's
``/etc/containerd``: its own root (kept under the cache, so imported images survive
between runs, as Docker's data root does), its own state directory and socket under
``/run/gym-telemetry-node/``, its ``opt`` plugin directory inside its root, the CNI
plugins and configuration the node gives it, and what this VM needs (the notes in
docs/testing.md): ``SystemdCgroup = false`` (cgroup v1, no systemd),
``restrict_oom_score_adj = true`` (no ``CAP_SYS_RESOURCE``: without it every sandbox fails
with "can't get final child's PID from pipe: EOF") and a local sandbox image.

Images reach it without a registry: ``docker save REF | ctr -n k8s.io images import -``,
labelled with the Docker image id so an unchanged image is not imported again.

:meth:`Containerd.stop` stops the daemon, then every runc shim it started (shims outlive
their daemon by design), and unmounts whatever is still mounted under its root and state.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import IO

from gym_telemetry_demo.procs import stop_process

from tests.support.docker_daemon import Engine

APT_TIMEOUT_S = 1800
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
IMPORT_TIMEOUT_S = 1800.0
NAMESPACE = "k8s.io"
"""containerd's namespace for everything the CRI plugin (so the kubelet) sees."""
DOCKER_ID_LABEL = "org.gym-telemetry.docker-id"


class RuntimeUnavailable(RuntimeError):
    """containerd or runc could not be installed or started; the message says why."""


def install() -> dict[str, Path]:
    """``containerd``, ``ctr``, ``containerd-shim-runc-v2`` and ``runc``; apt-installed
    (Debian's packages) when any is missing. Root only."""
    wanted = ("containerd", "ctr", "containerd-shim-runc-v2", "runc")
    if any(shutil.which(p) is None for p in wanted):
        if os.geteuid() != 0:
            raise RuntimeUnavailable("containerd/runc are missing and apt needs root")
        apt = ["apt-get", "-o", "DPkg::Lock::Timeout=900"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = [*apt, "install", "-y", "--no-install-recommends", "containerd", "runc"]
        if subprocess.run(cmd, env=env, stdout=2, timeout=APT_TIMEOUT_S, check=False).returncode:
            subprocess.run([*apt, "update"], env=env, stdout=2, timeout=APT_TIMEOUT_S, check=False)
            done = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT_S, check=False
            )
            if done.returncode:
                raise RuntimeUnavailable(f"apt-get install containerd runc: {done.stderr[-2000:]}")
    found = {p: shutil.which(p) for p in wanted}
    missing = [p for p, path in found.items() if path is None]
    if missing:
        raise RuntimeUnavailable(f"installed, but not on PATH: {', '.join(missing)}")
    return {p: Path(path) for p, path in found.items() if path is not None}


def config_toml(
    root: Path, state: Path, socket: Path, runc: Path, cni_bin: Path, cni_conf: Path, sandbox: str
) -> str:
    """containerd 1.6's configuration (version 2 format) for the node."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    disabled = ", ".join(
        f'"io.containerd.snapshotter.v1.{name}"' for name in ("aufs", "btrfs", "devmapper", "zfs")
    )
    return f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [{disabled}]

[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"

[{cri}]
  sandbox_image = "{sandbox}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{runc}"
[{cri}.cni]
  bin_dir = "{cni_bin}"
  conf_dir = "{cni_conf}"
  max_conf_num = 1
"""


def containerd_name(tag: str) -> str:
    """The full name containerd gives a Docker tag (``gym-server:0.1.0`` is
    ``docker.io/library/gym-server:0.1.0``), as Docker's reference normalisation does."""
    first, _, rest = tag.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return tag
    return f"docker.io/{tag}" if rest else f"docker.io/library/{tag}"


class Containerd:
    """One containerd process on the node's own paths (see the module docstring)."""

    def __init__(
        self,
        *,
        root: Path,
        state: Path,
        cni_bin: Path,
        cni_conf: Path,
        sandbox_image: str,
        log: Path,
    ) -> None:
        self.binaries = install()
        self.root, self.state = root, state
        self.socket = state / "containerd.sock"
        self.config = state / "config.toml"
        self.cni_bin, self.cni_conf = cni_bin, cni_conf
        self.sandbox_image = sandbox_image
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The CRI endpoint the kubelet is given."""
        return f"unix://{self.socket}"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            config_toml(
                self.root,
                self.state,
                self.socket,
                self.binaries["runc"],
                self.cni_bin,
                self.cni_conf,
                self.sandbox_image,
            )
        )
        self._log_file = self.log.open("ab")
        self.proc = subprocess.Popen(
            [str(self.binaries["containerd"]), "--config", str(self.config)],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.ctr("version", check=False, timeout=30).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeUnavailable(f"containerd did not start: {self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 300, input: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``ctr --address <socket> -n k8s.io ARGS``."""
        done = subprocess.run(
            [str(self.binaries["ctr"]), "--address", str(self.socket), "-n", NAMESPACE, *args],
            capture_output=True,
            timeout=timeout,
            input=input,
            check=False,
        )
        out = subprocess.CompletedProcess(
            done.args,
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )
        if check and out.returncode:
            raise RuntimeError(f"ctr {' '.join(args)} exited {out.returncode}: {out.stderr}")
        return out

    def image_label(self, ref: str) -> str | None:
        """The Docker id recorded on image ``ref`` (a full containerd name), or None."""
        listed = self.ctr("images", "ls", f"name=={ref}").stdout.splitlines()[1:]
        for line in listed:
            for token in line.split()[-1].split(","):
                key, _, value = token.partition("=")
                if key == DOCKER_ID_LABEL:
                    return value
        return None

    def import_image(self, engine: Engine, tag: str) -> tuple[str, float]:
        """Import Docker image ``tag`` unless the same image is there; its containerd name
        and the seconds the import took (0 when skipped)."""
        docker_id = engine.docker("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
        name = containerd_name(tag)
        if self.image_label(name) == docker_id:
            return name, 0.0
        started = time.monotonic()
        client = shutil.which("docker") or "docker"
        save = subprocess.Popen([client, "save", tag], stdout=subprocess.PIPE, env=engine.env)
        assert save.stdout is not None
        importing = subprocess.run(
            [
                str(self.binaries["ctr"]), "--address", str(self.socket), "-n", NAMESPACE,
                "images", "import", "-",
            ],
            stdin=save.stdout,
            capture_output=True,
            timeout=IMPORT_TIMEOUT_S,
            check=False,
        )  # fmt: skip
        save.stdout.close()
        if save.wait(timeout=IMPORT_TIMEOUT_S) or importing.returncode:
            raise RuntimeError(
                f"docker save {tag} | ctr images import failed: {importing.stderr.decode()[-2000:]}"
            )
        self.ctr("images", "label", name, f"{DOCKER_ID_LABEL}={docker_id}")
        return name, time.monotonic() - started

    def remove_containers(self) -> list[str]:
        """Kill and delete every task and container left in the namespace (the kubelet
        removes its own; this is the fallback). Returns the containers removed."""
        for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            self.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for task in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            while self.ctr("tasks", "delete", task, check=False).returncode:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        removed = []
        for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            if self.ctr("containers", "delete", container, check=False).returncode == 0:
                removed.append(container)
        return removed

    def shims(self) -> list[int]:
        """Pids of the runc shims serving this containerd (found by its socket)."""
        pids = []
        needle = str(self.socket).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and needle in argv:
                pids.append(int(entry.name))
        return pids

    def stop(self) -> None:
        """Stop containerd, then its leftover shims; unmount what stays under its paths."""
        stop_process(self.proc, STOP_TIMEOUT_S)  # its session's group: it leads one
        self.proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        for pid in self.shims():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        unmount_under(self.state, self.root)


def mount_points_under(*dirs: Path) -> list[str]:
    """Mount points at or below ``dirs``, deepest first."""
    prefixes = [str(d) for d in dirs]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            points.append(point)
    return sorted(points, key=lambda p: (-p.count("/"), p))


def unmount_under(*dirs: Path) -> list[str]:
    """Unmount (lazily, deepest first) every mount at or below ``dirs``; what went."""
    gone = []
    for point in mount_points_under(*dirs):
        if subprocess.run(["umount", "-l", point], capture_output=True, check=False).returncode:
            continue
        gone.append(point)
    return gone
