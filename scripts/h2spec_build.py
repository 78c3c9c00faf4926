#!/usr/bin/env python3
"""Build, cache and reuse h2spec, the HTTP/2 conformance suite, from the Go module proxy.

Usage::

    python3 scripts/h2spec_build.py ensure    # build if absent/incomplete; print the binary
    python3 scripts/h2spec_build.py path      # where the binary lives (no build)
    python3 scripts/h2spec_build.py version   # the h2spec release that gets built

The suite runs against the sidecar's gRPC listener in ``make test``
(``tests/sidecar/wire/http2/test_h2spec.py``). h2spec v2.2.1 is served by the module
proxy as ``v2.2.1+incompatible`` (``go list -m -versions github.com/summerwind/h2spec``
lists ``v1.5.0 v2.2.1+incompatible``): the module has no go.mod, so nothing in it pins
its dependencies and ``go get`` would resolve them to whatever is newest on the day.
The recipe pins them (``extra_requires``: the versions ``go get`` resolved when the
recipe was written and the suite was run), so every machine compiles the same program.
The version variables are the ones h2spec's Makefile sets, so ``h2spec --version``
names the release, and a binary of that version already on PATH is used as it is.

The binary lands in ``<peers>/h2spec-v2.2.1+incompatible/bin/h2spec``. Caches, lock,
marker and timings: :mod:`go_peers` (cold, on 2 busy cores: ~7 s of fetch and 2-3 min
of ``go build``, most of it golang.org/x/net and x/sys, which other peers share).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import go_peers

MODULE = "github.com/summerwind/h2spec"
VERSION = "v2.2.1+incompatible"
RELEASE = "2.2.1"


def _is_pinned(path: str) -> bool:
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return f"Version: {RELEASE} " in out.stdout + out.stderr


H2SPEC = go_peers.GoTool(
    name="h2spec",
    module=MODULE,
    version=VERSION,
    programs={"h2spec": f"{MODULE}/cmd/h2spec"},
    check=("--version",),
    ldflags=f"-s -w -X main.VERSION={RELEASE} -X main.COMMIT=v{RELEASE}",
    extra_requires=(
        "github.com/fatih/color@v1.19.0",
        "github.com/inconshreveable/mousetrap@v1.1.0",
        "github.com/mattn/go-colorable@v0.1.14",
        "github.com/mattn/go-isatty@v0.0.20",
        "github.com/spf13/cobra@v1.10.2",
        "github.com/spf13/pflag@v1.0.9",
        "golang.org/x/net@v0.63.0",
        "golang.org/x/sys@v0.50.0",
        "golang.org/x/text@v0.44.0",
    ),
    path_version=_is_pinned,
)


def ensure() -> Path:
    """The ``h2spec`` binary: one of the pinned release on PATH, else the cached build
    (built first when needed; blocks while built)."""
    return go_peers.ensure(H2SPEC)


def main(argv: list[str] | None = None) -> int:
    return go_peers.main_for(H2SPEC, argv, describe=(__doc__ or "").split("\n\n")[0])


if __name__ == "__main__":
    raise SystemExit(main())
