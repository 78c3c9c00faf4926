"""The host source: ``host.name``, ``host.arch`` and ``os.type`` of the sidecar's host.

``os.type`` is ``platform.system()`` mapped onto the conventions' values (as the
OpenTelemetry SDK's OS detector does; the sidecar does not depend on the SDK, so it is
not imported here: the sidecar image has no SDK); ``host.arch`` is
``platform.machine()`` mapped onto the conventions' well-known values (``amd64``,
``arm64``, ...), passed through unchanged when unknown. In a pod or compose service the
sidecar shares its host with the Gym server it serves, so these describe that server.
"""

from __future__ import annotations

import platform
import socket

from gym_sidecar.enrich.attributes import AttributeValue
from gym_sidecar.enrich.keys import HOST_ARCH, HOST_NAME, OS_TYPE

_ARCH: dict[str, str] = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "arm32",
    "armv6l": "arm32",
    "i386": "x86",
    "i686": "x86",
    "ppc64le": "ppc64",
    "ppc64": "ppc64",
    "s390x": "s390x",
    "ia64": "ia64",
}


#: ``platform.system().lower()`` -> the conventions' ``os.type`` where the two differ.
_OS_TYPE: dict[str, str] = {
    "sunos": "solaris",
    "hp-ux": "hpux",
    "os/390": "z_os",
    "dragonfly": "dragonflybsd",
}


def os_type(system: str) -> str:
    """The semantic-convention ``os.type`` value for a ``platform.system()`` string."""
    lowered = system.lower()
    return _OS_TYPE.get(lowered, lowered)


def host_arch(machine: str) -> str:
    """The semantic-convention ``host.arch`` value for a ``platform.machine()`` string."""
    return _ARCH.get(machine.lower(), machine.lower())


def host_attributes() -> dict[str, AttributeValue]:
    """The host's attributes (computed once at startup; cheap, no I/O beyond uname)."""
    out: dict[str, AttributeValue] = {}
    name = socket.gethostname()
    if name:
        out[HOST_NAME] = name
    machine = platform.machine()
    if machine:
        out[HOST_ARCH] = host_arch(machine)
    system = platform.system()
    if system:
        out[OS_TYPE] = os_type(system)
    return out
