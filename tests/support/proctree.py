"""Every process a command started, found by an environment marker, and their ports.

A command's children may leave its process tree (a child in a session of its own is
still a child, but once the command dies its orphans belong to init): ancestry cannot
say afterwards what is left of it. The environment can. :func:`marked_env` adds a
variable with a fresh value to the environment the command is started with; every
process it starts inherits it (the demo's launchers pass the environment on), and
:func:`marked_processes` finds them all in ``/proc/<pid>/environ`` -- during the run and
after, wherever they were reparented. Linux only (``/proc``).

A zombie is dead (it holds no port and runs nothing); in a container whose init does not
reap, an orphaned zombie stays, so :meth:`Proc.running` counts it as gone.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

MARKER_VAR = "GYM_TELEMETRY_TEST_PROC_MARKER"
_PROC = Path("/proc")


def marked_env(env: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """``env`` plus a fresh marker; (the environment, the marker's ``VAR=value``)."""
    value = uuid.uuid4().hex
    return {**env, MARKER_VAR: value}, f"{MARKER_VAR}={value}"


@dataclass(frozen=True)
class Proc:
    pid: int
    start_ticks: int
    """Field 22 of ``/proc/<pid>/stat``: tells the process from a later one of that pid."""
    cmdline: str

    def running(self) -> bool:
        """Still this process, and not a zombie."""
        stat = _stat(self.pid)
        return stat is not None and stat[1] == self.start_ticks and stat[0] != "Z"


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start ticks) of ``pid``; None when there is no such process."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return fields[0], int(fields[19])


def marked_processes(marker: str) -> dict[int, Proc]:
    """The running (non-zombie) processes whose environment holds ``marker``."""
    found: dict[int, Proc] = {}
    wanted = marker.encode()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if wanted not in environ:
            continue
        stat = _stat(int(entry.name))
        if stat is None or stat[0] == "Z":
            continue
        found[int(entry.name)] = Proc(int(entry.name), stat[1], cmdline.strip())
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    try:
        fds = list((_PROC / str(pid) / "fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def listening_ports(pids: Iterable[int]) -> set[int]:
    """The TCP ports (IPv4 and IPv6) on which any of ``pids`` listens."""
    inodes: set[str] = set()
    for pid in pids:
        inodes |= _socket_inodes(pid)
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address (hex ip:port), ..., st (0A = LISTEN), ..., inode (field 9)
            if fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def port_free(port: int) -> bool:
    """Whether nothing listens on loopback ``port``: a listener can be bound there (with
    SO_REUSEADDR, so that connections closing in TIME_WAIT do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True
