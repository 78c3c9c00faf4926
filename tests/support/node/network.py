"""The pods' network: one Linux bridge the test creates, and the CNI config that uses it.

The bridge (``gymt<4 hex>``) gets the first address of a /24 that no address or route of
the machine overlaps (chosen from ``10.237.0.0/16``) and is up before any pod runs, so
that a backend on the host can listen on that address (and only there) for the pods to
reach: there is no cluster DNS, a pod reaches the host by address. The CNI ``bridge``
plugin attaches each pod to it (a veth pair; ``isGateway`` keeps the address as the
pods' default route), ``host-local`` hands out addresses with its state in the test's
own directory, and ``ipMasq`` is off: pods talk to the host and to the test on this
bridge only, nothing is masqueraded to anywhere, and no firewall rule is written.

:meth:`PodNetwork.delete` removes the bridge (any veth left attached goes with it).
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POOL = ipaddress.ip_network("10.237.0.0/16")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60, check=check)


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    used: list[ipaddress.IPv4Network] = []
    for addr in json.loads(_ip("-j", "-4", "addr", "show").stdout or "[]"):
        for info in addr.get("addr_info", []):
            used.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default" and ":" not in dst:
            net = ipaddress.ip_network(dst if "/" in dst else dst + "/32", strict=False)
            if isinstance(net, ipaddress.IPv4Network):
                used.append(net)
    return used


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of :data:`POOL` that overlaps no address or route on the machine."""
    used = _networks_in_use()
    for subnet in POOL.subnets(new_prefix=24):
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise RuntimeError(f"no free /24 in {POOL} for the pod bridge")


@dataclass
class PodNetwork:
    """A bridge and a /24 for the node's pods; :meth:`create` and :meth:`delete` it."""

    subnet: ipaddress.IPv4Network
    bridge: str
    ipam_dir: Path

    @classmethod
    def choose(cls, ipam_dir: Path) -> PodNetwork:
        return cls(free_subnet(), f"gymt{secrets.token_hex(2)}", ipam_dir)

    @property
    def gateway(self) -> str:
        """The bridge's address: the host, as the pods reach it."""
        return str(next(self.subnet.hosts()))

    @property
    def name(self) -> str:
        """The CNI network's name (also in CNI's cache file names)."""
        return f"{self.bridge}-pods"

    def create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except subprocess.CalledProcessError:
            self.delete()
            raise

    def exists(self) -> bool:
        return _ip("link", "show", self.bridge, check=False).returncode == 0

    def delete(self) -> None:
        if self.exists():
            _ip("link", "delete", self.bridge)

    def conflist(self) -> dict[str, Any]:
        """The CNI network configuration list containerd's CRI plugin loads."""
        return {
            "cniVersion": "1.0.0",
            "name": self.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": str(self.subnet), "gateway": self.gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.ipam_dir),
                    },
                }
            ],
        }

    def write_conflist(self, conf_dir: Path) -> Path:
        conf_dir.mkdir(parents=True, exist_ok=True)
        path = conf_dir / "10-gym-telemetry.conflist"
        path.write_text(json.dumps(self.conflist(), indent=2))
        return path
