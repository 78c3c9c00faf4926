"""The real PodSecurity admission plugin (kube-apiserver v1.37.2) against the project's
own checker, ``tests/deploy/pod_security.py``, on one corpus of pods: one compliant pod
per shape, one breach per control. The two must agree on every pod (admitted exactly
when the checker finds nothing, and refused for the control the checker names), and the
injector must never turn an admitted pod into a refused one.

The offline tests keep using the checker (no control plane needed); this is what keeps
it honest.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.deploy.pod_security import restricted_violations
from tests.k8s.conftest import INJECT, dry_run_pod, is_injected, pod
from tests.support.control_plane import ControlPlane

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(3600)]

Pod = dict[str, Any]

# The checker's control (prefix of its line) -> what the plugin's refusal says for it.
PLUGIN_WORDS = {
    "HostProcess": "hostProcess",
    "Host Namespaces": "host namespaces",
    "HostPath Volumes": "hostPath volumes",
    "AppArmor": "AppArmor",
    "Sysctls": "forbidden sysctls",
    "Privileged Containers": "privileged",
    "Capabilities": "capabilities",
    "Host Ports": "hostPort",
    "/proc Mount Type": "procMount",
    "SELinux": "seLinuxOptions",
    "Seccomp": "seccompProfile",
    "Volume Types": "restricted volume types",
    "Privilege Escalation": "allowPrivilegeEscalation != false",
    "Running as Non-root user": "runAsUser=0",
    "Running as Non-root": "runAsNonRoot != true",
    "Host Probes / Lifecycle Hooks": "probe or lifecycle host",
}


def _app(p: Pod) -> dict[str, Any]:
    sc: dict[str, Any] = p["spec"]["containers"][0]["securityContext"]
    return sc


def _set(key: str, value: Any) -> Callable[[Pod], None]:
    def change(p: Pod) -> None:
        _app(p)[key] = value

    return change


def _spec(key: str, value: Any) -> Callable[[Pod], None]:
    def change(p: Pod) -> None:
        p["spec"][key] = value

    return change


def _drop(key: str) -> Callable[[Pod], None]:
    def change(p: Pod) -> None:
        del _app(p)[key]

    return change


def _pod_level(p: Pod) -> None:
    """runAsNonRoot and seccomp at pod level instead of per container."""
    p["spec"]["securityContext"] = {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for c in p["spec"]["containers"]:
        del c["securityContext"]["runAsNonRoot"]
        del c["securityContext"]["seccompProfile"]


def _probe_host(p: Pod) -> None:
    p["spec"]["containers"][0]["readinessProbe"] = {
        "httpGet": {"host": "127.0.0.1", "port": 8080, "path": "/"}
    }


def _unmasked_proc(p: Pod) -> None:
    p["spec"]["hostUsers"] = False  # what the API server requires of procMount Unmasked
    _app(p)["procMount"] = "Unmasked"


def _localhost_seccomp(p: Pod) -> None:
    _app(p)["seccompProfile"] = {"type": "Localhost", "localhostProfile": "profiles/gym.json"}


COMPLIANT: dict[str, Callable[[Pod], None]] = {
    "per-container": lambda p: None,
    "pod-level": _pod_level,
    "seccomp-localhost": _localhost_seccomp,
    "net-bind-service": _set("capabilities", {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}),
    "run-as-user-1000": _set("runAsUser", 1000),
    "safe-sysctl": _spec(
        "securityContext",
        {"sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65000"}]},
    ),
    "allowed-volumes": _spec(
        "volumes",
        [
            {"name": "scratch", "emptyDir": {}},
            {"name": "cfg", "configMap": {"name": "cfg"}},
            {"name": "sec", "secret": {"secretName": "sec"}},
            {"name": "pvc", "persistentVolumeClaim": {"claimName": "data"}},
        ],
    ),
    "safe-sysctl-tcp-rmem": _spec(
        "securityContext",
        {"sysctls": [{"name": "net.ipv4.tcp_rmem", "value": "4096 87380 6291456"}]},
    ),
    "probe-without-host": lambda p: p["spec"]["containers"][0].update(
        readinessProbe={"tcpSocket": {"port": 8080}}
    ),
    "selinux-container-t": _set("seLinuxOptions", {"type": "container_t", "level": "s0:c1,c2"}),
    "apparmor-runtime-default": _set("appArmorProfile", {"type": "RuntimeDefault"}),
}

BREACHES: dict[str, Callable[[Pod], None]] = {
    "privilege-escalation-unset": _drop("allowPrivilegeEscalation"),
    "privilege-escalation-true": _set("allowPrivilegeEscalation", True),
    "run-as-non-root-false": _set("runAsNonRoot", False),
    "run-as-non-root-unset": _drop("runAsNonRoot"),
    "run-as-user-0": _set("runAsUser", 0),
    "seccomp-unset": _drop("seccompProfile"),
    "seccomp-unconfined": _set("seccompProfile", {"type": "Unconfined"}),
    "capabilities-not-dropped": _set("capabilities", {"drop": ["NET_RAW"]}),
    "capability-added": _set("capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
    "privileged": lambda p: _app(p).update(privileged=True, allowPrivilegeEscalation=True),
    "host-network": _spec("hostNetwork", True),
    "host-pid": _spec("hostPID", True),
    "host-path": _spec("volumes", [{"name": "host", "hostPath": {"path": "/var/log"}}]),
    "nfs-volume": _spec("volumes", [{"name": "n", "nfs": {"server": "nfs.invalid", "path": "/"}}]),
    "host-port": lambda p: p["spec"]["containers"][0].update(
        ports=[{"containerPort": 8080, "hostPort": 8080}]
    ),
    "unsafe-sysctl": _spec(
        "securityContext", {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}
    ),
    "selinux-user": _set("seLinuxOptions", {"user": "system_u"}),
    "apparmor-unconfined": _set("appArmorProfile", {"type": "Unconfined"}),
    "proc-mount-unmasked": _unmasked_proc,
    "probe-host": _probe_host,
    "lifecycle-host": lambda p: p["spec"]["containers"][1].update(
        lifecycle={"preStop": {"httpGet": {"host": "127.0.0.2", "port": 80, "path": "/"}}}
    ),
}


def corpus() -> dict[str, tuple[Pod, bool]]:
    """id -> (pod, compliant?) ; every pod opts out of injection (annotation false)."""
    out: dict[str, tuple[Pod, bool]] = {}
    for cases, compliant in ((COMPLIANT, True), (BREACHES, False)):
        for case, change in cases.items():
            p = pod(f"psa-{case}", {INJECT: "false"})
            change(p)
            out[case] = (p, compliant)
    return out


def real_verdict(plane: ControlPlane, namespace: str, body: Pod) -> tuple[bool, str]:
    """(admitted?, the API server's refusal) for a server-side dry-run create."""
    out = plane.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        "-o",
        "json",
        input=json.dumps(body),
        check=False,
    )
    return out.returncode == 0, out.stderr.strip()


def test_the_checker_agrees_with_the_real_plugin_on_every_pod(
    control_plane: ControlPlane, restricted_namespace: str
) -> None:
    disagreements = []
    for case, (body, compliant) in corpus().items():
        admitted, refusal = real_verdict(control_plane, restricted_namespace, body)
        local = restricted_violations(body)
        if not admitted:
            assert 'violates PodSecurity "restricted:latest"' in refusal, (case, refusal)
        if admitted != compliant:
            disagreements.append(f"{case}: fixture says {compliant}, plugin {admitted}: {refusal}")
        if admitted != (local == []):
            disagreements.append(f"{case}: plugin admitted={admitted} ({refusal}); checker {local}")
            continue
        for line in local:  # each control the checker names, the plugin names too
            control = next(c for c in PLUGIN_WORDS if line.startswith(c))
            if PLUGIN_WORDS[control] not in refusal:
                disagreements.append(f"{case}: checker {line!r}, plugin: {refusal}")
    assert not disagreements, "\n".join(disagreements)


def test_injection_never_turns_an_admitted_pod_into_a_refused_one(
    control_plane: ControlPlane, restricted_namespace: str
) -> None:
    for case, (body, compliant) in corpus().items():
        if not compliant:
            continue
        opted_in = copy.deepcopy(body)
        opted_in["metadata"]["annotations"][INJECT] = "true"
        stored = dry_run_pod(control_plane, restricted_namespace, opted_in)  # raises if refused
        assert is_injected(stored), case
        assert restricted_violations(stored) == [], case  # the checker on the real result
