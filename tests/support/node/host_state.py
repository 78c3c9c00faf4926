"""What a kubelet and containerd change on the host, read before and after, and compared.

A node changes the machine it runs on: the kubelet sets six kernel tunables
(``vm.overcommit_memory=1``, ``vm.panic_on_oom=0``, ``kernel.panic=10``,
``kernel.panic_on_oops=1``, ``kernel.keys.root_maxkeys``, ``kernel.keys.root_maxbytes``),
creates cgroups and mounts, the CNI bridge plugin turns on IP forwarding, and pods bring
network namespaces, veth pairs, CNI state under ``/var/lib/cni`` and log links under
``/var/log/containers``. :func:`snapshot` reads every one of those, :func:`differences`
names each thing that is not as it was, and :func:`restore_sysctls` writes the tunables
back. The test that runs pods takes a snapshot before the node starts and asserts that
the one taken after its teardown has no difference.

A Docker engine may run beside the node (the tests' own, or another test's containers),
and it changes some of the same things on its own schedule: its bridges (``docker0``,
``br-<id>``) and the veths attached to them, its mounts under its data and exec roots,
its cgroups under ``/docker`` and its firewall chains. Those are left out of the
comparison, by name; nothing the node creates has such a name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.docker_daemon import EXEC_ROOT, cache_dir

SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
)
"""The kubelet's kernel tunables (its ``setupKernelTunables``) and what the CNI bridge
plugin turns on for a gateway bridge."""
CGROUP_BASE = Path("/sys/fs/cgroup")
WATCHED_PATHS = (
    Path("/var/lib/cni"),
    Path("/var/log/pods"),
    Path("/var/log/containers"),
    Path("/run/netns"),
    Path("/var/lib/kubelet"),
    Path("/var/lib/containerd"),
    Path("/run/containerd"),
    Path("/etc/cni"),
    Path("/opt/cni"),
    Path("/opt/containerd"),
    Path("/etc/kubernetes"),
)
"""Where a kubelet, containerd or a CNI plugin writes by default. The node is configured
to write elsewhere wherever it can; these must stay as they were either way."""
CLEANED_PATHS = (
    Path("/var/lib/cni"),
    Path("/var/log/pods"),
    Path("/var/log/containers"),
    Path("/run/netns"),
)
"""The ones the node writes to whatever its configuration (CNI's cache, the kubelet's
container log links, pods' network namespaces): :func:`remove_new_entries` cleans these
and only these; a change to any other watched path is reported, never deleted."""
_MAX_ENTRIES = 20_000
_DOCKER_LINK = re.compile(r"^(docker\d*|br-[0-9a-f]{12})$")
_DOCKER_RULE = re.compile(r"DOCKER|docker\d|br-[0-9a-f]{12}")
_COUNTERS = re.compile(r"\[\d+:\d+\]")
_DOCKER_HAIRPIN = re.compile(r"-s (\S+)/32 -d \1/32 .*-j MASQUERADE")
"""Docker's per-published-port hairpin rule, which names no Docker chain or bridge."""


def _docker_roots() -> tuple[str, ...]:
    return (
        str(cache_dir() / "data"),
        str(EXEC_ROOT),
        "/var/lib/docker",
        "/run/docker",
        "/var/run/docker",
    )


@dataclass
class HostState:
    """One reading of everything :data:`SYSCTLS`, cgroups, mounts, links, paths and
    firewall tables hold (Docker's own parts left out: see the module docstring)."""

    sysctls: dict[str, str]
    cgroups: set[str]
    mounts: list[str]
    links: set[str]
    paths: dict[str, list[str] | None]
    iptables: dict[str, list[str]] = field(default_factory=dict)


def read_sysctl(name: str) -> str:
    return (Path("/proc/sys") / name.replace(".", "/")).read_text().strip()


def write_sysctl(name: str, value: str) -> None:
    (Path("/proc/sys") / name.replace(".", "/")).write_text(value + "\n")


def _cgroups() -> set[str]:
    found: set[str] = set()
    for hierarchy in sorted(CGROUP_BASE.iterdir()) if CGROUP_BASE.is_dir() else []:
        if not hierarchy.is_dir() or hierarchy.is_symlink():
            continue
        for dirpath, dirnames, _ in os.walk(hierarchy):
            rel = os.path.relpath(dirpath, hierarchy)
            if rel == "docker" or rel.startswith("docker/"):
                dirnames.clear()
                continue
            found.add(f"{hierarchy.name}:/{'' if rel == '.' else rel}")
    return found


def _mounts() -> list[str]:
    roots = _docker_roots()
    out: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        point = pre.split()[4].encode().decode("unicode_escape")
        if any(point == r or point.startswith(r + "/") for r in roots):
            continue
        out.append(f"{point} ({post.split()[0]})")
    return sorted(out)


def _links() -> set[str]:
    ip = shutil.which("ip")
    if ip is None:
        return set()
    done = subprocess.run([ip, "-j", "link", "show"], capture_output=True, text=True, check=True)
    links: set[str] = set()
    for link in json.loads(done.stdout or "[]"):
        name, master = link.get("ifname", ""), link.get("master", "")
        if _DOCKER_LINK.match(name) or _DOCKER_LINK.match(master):
            continue
        links.add(f"{name} master={master or '-'}")
    return links


def _listing(path: Path) -> list[str] | None:
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_dir():
        return ["<file>"]
    entries: list[str] = []
    for dirpath, dirnames, filenames in os.walk(path):
        for name in sorted(dirnames + filenames):
            entries.append(os.path.relpath(os.path.join(dirpath, name), path))
        if len(entries) > _MAX_ENTRIES:
            break
    return sorted(entries)


def _iptables() -> dict[str, list[str]]:
    tables: dict[str, list[str]] = {}
    for tool in ("iptables-save", "ip6tables-save"):
        found = shutil.which(tool)
        if found is None:
            continue
        done = subprocess.run([found], capture_output=True, text=True, check=False)
        lines = [
            _COUNTERS.sub("", line).rstrip()
            for line in done.stdout.splitlines()
            if line
            and not line.startswith("#")
            and not _DOCKER_RULE.search(line)
            and not _DOCKER_HAIRPIN.search(line)
        ]
        tables[tool] = lines
    return tables


def snapshot() -> HostState:
    """Read the host's state now (root needed for the firewall tables)."""
    return HostState(
        sysctls={name: read_sysctl(name) for name in SYSCTLS},
        cgroups=_cgroups(),
        mounts=_mounts(),
        links=_links(),
        paths={str(p): _listing(p) for p in WATCHED_PATHS},
        iptables=_iptables(),
    )


def differences(before: HostState, after: HostState) -> list[str]:
    """Every way ``after`` differs from ``before``, one readable line each."""
    out: list[str] = []
    for name in SYSCTLS:
        if before.sysctls[name] != after.sysctls[name]:
            out.append(f"sysctl {name}: {before.sysctls[name]} -> {after.sysctls[name]}")
    out += [f"cgroup added: {c}" for c in sorted(after.cgroups - before.cgroups)]
    out += [f"cgroup removed: {c}" for c in sorted(before.cgroups - after.cgroups)]
    for mount in sorted(set(before.mounts) | set(after.mounts)):
        if before.mounts.count(mount) != after.mounts.count(mount):
            out.append(
                f"mount {mount}: {before.mounts.count(mount)} -> {after.mounts.count(mount)}"
            )
    out += [f"link added: {link}" for link in sorted(after.links - before.links)]
    out += [f"link removed: {link}" for link in sorted(before.links - after.links)]
    for path, was in before.paths.items():
        now = after.paths[path]
        if was != now:
            shown = "absent" if now is None else f"{len(now)} entries {now[:8]}"
            out.append(f"{path}: {'absent' if was is None else len(was)} -> {shown}")
    for tool in sorted(set(before.iptables) | set(after.iptables)):
        was, now = before.iptables.get(tool, []), after.iptables.get(tool, [])
        out += [f"{tool} added: {rule}" for rule in now if rule not in was]
        out += [f"{tool} removed: {rule}" for rule in was if rule not in now]
    return out


def restore_sysctls(before: HostState) -> list[str]:
    """Write back every tunable of :data:`SYSCTLS` that changed; the names restored."""
    restored = []
    for name, value in before.sysctls.items():
        if read_sysctl(name) != value:
            write_sysctl(name, value)
            restored.append(name)
    return restored


def remove_new_entries(before: HostState) -> list[str]:
    """Remove what appeared under :data:`CLEANED_PATHS` since ``before`` (a path absent
    then goes entirely; in one that existed, only the new entries). Nothing else on the
    machine writes there while a node runs: these are the node's. Returns what went.
    Mount points must be unmounted first."""
    removed: list[str] = []
    for cleaned in CLEANED_PATHS:
        path_text = str(cleaned)
        was = before.paths[path_text]
        path = cleaned
        if not path.exists() and not path.is_symlink():
            continue
        if was is None:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
            removed.append(path_text)
            continue
        keep = set(was)
        now = _listing(path) or []
        for rel in sorted(now, key=lambda r: -r.count("/")):
            if rel in keep:
                continue
            target = path / rel
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
            removed.append(str(target))
    return removed
