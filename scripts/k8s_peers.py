#!/usr/bin/env python3
"""A Kubernetes cluster for the tests: etcd, kube-apiserver, kubectl and a kubelet, built
once, plus the CNI plugins the kubelet's pods are networked with.

Usage::

    python3 scripts/k8s_peers.py ensure    # build if needed; print the four binaries
    python3 scripts/k8s_peers.py cni       # build the CNI plugins if needed; print them
    python3 scripts/k8s_peers.py path      # where they live (no build)
    python3 scripts/k8s_peers.py version   # the Kubernetes release they are

**The pins, in one place** (Kubernetes minor 1.37):

- ``k8s.io/kubernetes`` v1.37.2 for ``kube-apiserver``, ``kubectl`` and ``kubelet``. Its
  go.mod points each of its 33 staging modules (``k8s.io/api``, ``k8s.io/apiserver``, ...) at
  ``./staging/...``, which a dependent module cannot follow, so the throwaway build module
  replaces each by its published ``v0.37.2``.
- ``go.etcd.io/etcd/server/v3`` v3.7.0: the etcd that Kubernetes v1.37.2's own go.mod
  requires (its client libraries are v3.7.0 too), so it joins the same module graph at no
  version change, and etcd, kube-apiserver and kubectl share every common package.
- ``kubectl`` v1.37.2 embeds kustomize v5.8.1 (its go.mod's
  ``sigs.k8s.io/kustomize/kustomize/v5``); the tests render with ``kubectl kustomize``.

All four are compiled by one ``go build`` in one throwaway module through
:mod:`go_peers` (the shared Go module and build cache under
``~/.cache/gym-telemetry/peers/go/``, a lock, a ``.complete`` marker, timings on stderr),
into ``~/.cache/gym-telemetry/peers/kubernetes-v1.37.2/bin/``: the kubelet shares every
package it has in common with the API server (client-go, apimachinery, the API types)
and adds only its own. ``CGO_ENABLED=0`` and the version ``-ldflags`` are those of
Kubernetes' own ``hack/lib`` build of the static binaries, so ``kube-apiserver
--version``, ``kubelet --version`` and ``kubectl version`` name the release (the
kubelet runs here without cgo: it reads cgroups and talks to containerd over its socket).

- ``github.com/containernetworking/plugins`` v1.10.0 (``CNI_PLUGINS_VERSION``): the
  ``bridge``, ``host-local`` and ``loopback`` plugins, one ``go build`` of their own
  module (its dependencies are not Kubernetes'), with the same Go caches, into
  ``~/.cache/gym-telemetry/peers/cni-plugins-v1.10.0/bin/``. Built only by the tests that
  run pods (:func:`ensure_cni`).

Binaries of the pinned versions already on PATH (all four) are used instead of a build.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import go_peers

KUBERNETES_MINOR = "1.37"
KUBERNETES_VERSION = "v1.37.2"
STAGING_VERSION = "v0.37.2"  # the published staging modules of KUBERNETES_VERSION
ETCD_VERSION = "v3.7.0"  # what KUBERNETES_VERSION's go.mod requires
KUSTOMIZE_IN_KUBECTL = "v5.8.1"  # what KUBERNETES_VERSION's go.mod requires
CNI_PLUGINS_VERSION = "v1.10.0"
CNI_PLUGINS = ("bridge", "host-local", "loopback")

STAGING_MODULES = (
    "api",
    "apiextensions-apiserver",
    "apimachinery",
    "apiserver",
    "cli-runtime",
    "client-go",
    "cloud-provider",
    "cluster-bootstrap",
    "code-generator",
    "component-base",
    "component-helpers",
    "controller-manager",
    "cri-api",
    "cri-client",
    "cri-streaming",
    "csi-translation-lib",
    "dynamic-resource-allocation",
    "endpointslice",
    "externaljwt",
    "kms",
    "kube-aggregator",
    "kube-controller-manager",
    "kube-proxy",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "metrics",
    "mount-utils",
    "pod-security-admission",
    "sample-apiserver",
    "sample-cli-plugin",
    "sample-controller",
    "streaming",
)


def _version_ldflags() -> str:
    major, minor = KUBERNETES_MINOR.split(".")
    values = {"gitVersion": KUBERNETES_VERSION, "gitMajor": major, "gitMinor": minor}
    values["gitTreeState"] = "clean"
    return " ".join(
        f"-X {pkg}.{key}={value}"
        for key, value in values.items()
        for pkg in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version")
    )


TOOL = go_peers.GoTool(
    name="kubernetes",
    module="k8s.io/kubernetes",
    version=KUBERNETES_VERSION,
    programs={
        "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
        "kubectl": "k8s.io/kubernetes/cmd/kubectl",
        "kubelet": "k8s.io/kubernetes/cmd/kubelet",
        "etcd": f"go.etcd.io/etcd/server/v3@{ETCD_VERSION}",
    },
    check=("--version",),
    ldflags=_version_ldflags(),
    replaces=tuple(f"k8s.io/{m} => k8s.io/{m}@{STAGING_VERSION}" for m in STAGING_MODULES),
    env={"CGO_ENABLED": "0"},
    recipe="1",
)

PROGRAMS = tuple(TOOL.programs)

_CNI_PACKAGES = {
    "bridge": "plugins/main/bridge",
    "host-local": "plugins/ipam/host-local",
    "loopback": "plugins/main/loopback",
}
CNI_TOOL = go_peers.GoTool(
    name="cni-plugins",
    module="github.com/containernetworking/plugins",
    version=CNI_PLUGINS_VERSION,
    programs={
        name: f"github.com/containernetworking/plugins/{_CNI_PACKAGES[name]}"
        for name in CNI_PLUGINS
    },
    check=("--version",),  # CNI plugins print "CNI bridge plugin v1.10.0" and exit 0 with no env
    ldflags=(
        "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion="
        + CNI_PLUGINS_VERSION
    ),
    env={"CGO_ENABLED": "0"},
    recipe="1",
)


def _path_version_ok(program: str, path: str) -> bool:
    want = {
        "kube-apiserver": (["--version"], f"Kubernetes {KUBERNETES_VERSION}"),
        "kubectl": (["version", "--client"], f"Client Version: {KUBERNETES_VERSION}"),
        "kubelet": (["--version"], f"Kubernetes {KUBERNETES_VERSION}"),
        "etcd": (["--version"], f"etcd Version: {ETCD_VERSION.lstrip('v')}"),
    }[program]
    try:
        out = subprocess.run(
            [path, *want[0]], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return re.search(rf"^{re.escape(want[1])}$", out.stdout, re.MULTILINE) is not None


def on_path() -> dict[str, Path] | None:
    """The four programs from PATH when every one is the pinned version."""
    found: dict[str, Path] = {}
    for program in PROGRAMS:
        path = shutil.which(program)
        if path is None or not _path_version_ok(program, path):
            return None
        found[program] = Path(path)
    return found


def ensure(prefer_path: bool = True) -> dict[str, Path]:
    """``{"etcd": ..., "kube-apiserver": ..., "kubectl": ..., "kubelet": ...}``, building
    them once if needed."""
    if prefer_path and (found := on_path()) is not None:
        return found
    go_peers.ensure(TOOL, prefer_path=False)
    return {program: TOOL.binary(program) for program in PROGRAMS}


def ensure_cni() -> Path:
    """The directory holding the CNI plugins (``bridge``, ``host-local``, ``loopback``),
    building them once if needed: the kubelet's containerd is pointed at it."""
    go_peers.ensure(CNI_TOOL, prefer_path=False)
    return CNI_TOOL.binary().parent


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="build etcd, kube-apiserver, kubectl, kubelet")
    parser.add_argument("command", choices=["ensure", "cni", "path", "version"])
    args = parser.parse_args(argv)
    if args.command == "version":
        print(
            f"kubernetes {KUBERNETES_VERSION} (minor {KUBERNETES_MINOR}) etcd {ETCD_VERSION} "
            f"cni-plugins {CNI_PLUGINS_VERSION}"
        )
        return 0
    if args.command == "path":
        for program in PROGRAMS:
            print(TOOL.binary(program))
        return 0
    try:
        if args.command == "cni":
            cni = ensure_cni()
            for plugin in CNI_PLUGINS:
                print(f"{plugin} {cni / plugin}")
            return 0
        for program, path in ensure().items():
            print(f"{program} {path}")
    except subprocess.CalledProcessError as exc:
        print(f"k8s_peers: {' '.join(map(str, exc.cmd))} exited {exc.returncode}", file=sys.stderr)
        return 1
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        print(f"k8s_peers: failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
