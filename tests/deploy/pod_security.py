"""The Pod Security Standards' ``baseline`` and ``restricted`` profiles as a checker.

Written from the rules as the Kubernetes documentation states them
(https://kubernetes.io/docs/concepts/security/pod-security-standards/, the controls of
each profile with their restricted fields and allowed values), as the ``latest``
version of the profiles stands in Kubernetes 1.37, and held to the real PodSecurity
admission plugin of kube-apiserver v1.37.2 by ``tests/k8s/test_pod_security_real.py``
(same verdict and same controls on every pod of its corpus).
``restricted_violations(pod)`` lists every rule a pod breaks, so a test can assert that a
pod admitted by a ``pod-security.kubernetes.io/enforce: restricted`` namespace stays
admissible once the injector has added its sidecar. Windows-only exemptions are not
modelled (these pods are Linux pods).
"""

from __future__ import annotations

from typing import Any

# Baseline: capabilities a container may add (the container runtime's default set).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",  # from 1.32
        "net.ipv4.tcp_wmem",  # from 1.32
        "net.ipv4.tcp_slow_start_after_idle",
        "net.ipv4.tcp_notsent_lowat",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t"})
# Restricted: the only volume sources allowed.
RESTRICTED_VOLUME_SOURCES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SECCOMP_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _containers(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(key) or []:
            out.append((f"{key}[{container.get('name')}]", container))
    return out


def _probe_and_lifecycle_hosts(container: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, host) for each probe or lifecycle handler that names a host (from 1.34)."""
    handlers = [(p, container.get(p)) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
    lifecycle = container.get("lifecycle") or {}
    handlers += [(f"lifecycle.{h}", lifecycle.get(h)) for h in ("postStart", "preStop")]
    found = []
    for where, handler in handlers:
        for action in ("httpGet", "tcpSocket"):
            host = ((handler or {}).get(action) or {}).get("host")
            if host:
                found.append((f"{where}.{action}", str(host)))
    return found


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    """Every ``baseline`` rule the pod breaks, as ``"<control>: <where>"`` lines."""
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    bad: list[str] = []
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        bad.append("HostProcess: spec.securityContext.windowsOptions.hostProcess")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            bad.append(f"Host Namespaces: spec.{field}")
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            bad.append(f"HostPath Volumes: volume {volume.get('name')}")
    for key, value in annotations.items():
        if key.startswith(APPARMOR_ANNOTATION) and not (
            value == "runtime/default" or str(value).startswith("localhost/")
        ):
            bad.append(f"AppArmor: annotation {key}={value}")
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            bad.append(f"Sysctls: {sysctl.get('name')}")
    contexts = [("spec.securityContext", psc)]
    for where, container in _containers(spec):
        sc = container.get("securityContext") or {}
        contexts.append((f"{where}.securityContext", sc))
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            bad.append(f"HostProcess: {where}")
        if sc.get("privileged"):
            bad.append(f"Privileged Containers: {where}")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            bad.append(f"Capabilities: {where} adds {sorted(added - BASELINE_CAPABILITIES)}")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                bad.append(f"Host Ports: {where} hostPort {port['hostPort']}")
        if sc.get("procMount") not in (None, "Default"):
            bad.append(f"/proc Mount Type: {where}")
        for hook, host in _probe_and_lifecycle_hosts(container):
            bad.append(f"Host Probes / Lifecycle Hooks: {where}.{hook} host {host}")
    for where, sc in contexts:
        selinux = sc.get("seLinuxOptions") or {}
        if (
            selinux.get("type", "") not in SELINUX_TYPES
            or selinux.get("user")
            or (selinux.get("role"))
        ):
            bad.append(f"SELinux: {where}.seLinuxOptions")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            bad.append(f"Seccomp: {where}.seccompProfile Unconfined")
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            bad.append(f"AppArmor: {where}.appArmorProfile {apparmor}")
    return bad


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Every ``restricted`` rule (baseline included) the pod breaks."""
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    # The restricted volume rule supersedes baseline's hostPath rule: the real plugin
    # reports a hostPath volume once, as a restricted volume type.
    bad = [v for v in baseline_violations(pod) if not v.startswith("HostPath Volumes")]
    for volume in spec.get("volumes") or []:
        sources = set(volume) - {"name"}
        if not sources <= RESTRICTED_VOLUME_SOURCES:
            bad.append(f"Volume Types: volume {volume.get('name')} uses {sorted(sources)}")
    pod_non_root = psc.get("runAsNonRoot")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_non_root is False:
        bad.append("Running as Non-root: spec.securityContext.runAsNonRoot is false")
    if psc.get("runAsUser") == 0:
        bad.append("Running as Non-root user: spec.securityContext.runAsUser is 0")
    if pod_seccomp is not None and pod_seccomp not in SECCOMP_ALLOWED:
        bad.append(f"Seccomp: spec.securityContext.seccompProfile {pod_seccomp}")
    for where, container in _containers(spec):
        sc = container.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"Privilege Escalation: {where} allowPrivilegeEscalation is not false")
        non_root = sc.get("runAsNonRoot")
        if non_root is False or (non_root is None and pod_non_root is not True):
            bad.append(f"Running as Non-root: {where} runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            bad.append(f"Running as Non-root user: {where} runAsUser is 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp is None and pod_seccomp is None:
            bad.append(f"Seccomp: {where} has no seccompProfile, nor has the pod")
        elif seccomp is not None and seccomp not in SECCOMP_ALLOWED:
            bad.append(f"Seccomp: {where} seccompProfile {seccomp}")
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            bad.append(f"Capabilities: {where} does not drop ALL")
        added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            bad.append(f"Capabilities: {where} adds {sorted(added)}")
    return bad
