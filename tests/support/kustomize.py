"""kustomize for the deployment tests: the one embedded in the pinned kubectl.

``kubectl kustomize DIR`` renders with the kustomize that kubectl v1.37.2 embeds
(v5.8.1), the kubectl that ``scripts/k8s_peers.py`` builds once per machine together
with kube-apiserver and etcd (one ``go build``, the shared Go caches). No separate
kustomize is built: a cold ``make test`` compiles kustomize once, inside kubectl.

:func:`kustomize_build` raises :class:`KustomizeUnavailable` when kubectl cannot be had
(no ``go`` to build it, or the build failed); the caller skips or fails.
"""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path

from tests.support.control_plane import ControlPlaneError, binaries


class KustomizeUnavailable(RuntimeError):
    """The pinned kubectl could not be built (its message says why)."""


@cache
def kustomize_command() -> tuple[str, ...]:
    """``(kubectl, "kustomize")``; the directory goes last. Builds kubectl on first use."""
    try:
        return (str(binaries()["kubectl"]), "kustomize")
    except ControlPlaneError as exc:
        raise KustomizeUnavailable(str(exc)) from exc


def kustomize_build(directory: Path) -> str:
    """The rendered YAML stream of the kustomization in ``directory``."""
    return subprocess.run(
        [*kustomize_command(), str(directory)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout


if __name__ == "__main__":
    print(" ".join(kustomize_command()), file=sys.stdout)
