#!/usr/bin/env python3
"""Build, cache and reuse Docker Compose v2 (the ``docker compose`` CLI plugin) from the
Go module proxy.

Usage::

    python3 scripts/compose_build.py ensure    # build if absent/incomplete; print the binary
    python3 scripts/compose_build.py path      # where the binary lives (no build)
    python3 scripts/compose_build.py version   # the Compose release that gets built

Why from source: Debian bookworm packages only ``docker-compose`` 1.29 (Python, the
deprecated v1), and no release binary can be downloaded here. ``go install
github.com/docker/compose/v2/cmd@v2.40.3`` refuses the module (its go.mod has
``exclude`` lines), and ``go get -tool`` of a dependent would ignore those lines, so
the recipe copies the module's own tree out of the shared module cache and runs ``go
build ./cmd`` inside it, with its own go.mod (:mod:`go_peers`, ``build_in_module``).
The version variable is the one Compose's Makefile sets, so ``docker compose version``
names the release.

The binary lands in ``<peers>/compose-v2.40.3/bin/docker-compose``; the engine tooling
(``tests/support/docker_daemon.py``) installs it as a CLI plugin under a
``DOCKER_CONFIG`` of its own. Caches, lock, marker and timings: :mod:`go_peers`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import go_peers

MODULE = "github.com/docker/compose/v2"
VERSION = "v2.40.3"

COMPOSE = go_peers.GoTool(
    name="compose",
    module=MODULE,
    version=VERSION,
    programs={"docker-compose": f"{MODULE}/cmd"},
    check=("version",),
    # -s -w as Compose's own Makefile: no symbol table / DWARF (a third of the size).
    ldflags=f"-s -w -X {MODULE}/internal.Version={VERSION}",
    build_in_module=True,
)


def ensure() -> Path:
    """The ``docker-compose`` plugin binary, built first when needed (blocks while built)."""
    return go_peers.ensure(COMPOSE, prefer_path=False)


def main(argv: list[str] | None = None) -> int:
    return go_peers.main_for(COMPOSE, argv, describe=(__doc__ or "").split("\n\n")[0])


if __name__ == "__main__":
    raise SystemExit(main())
