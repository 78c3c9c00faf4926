#!/usr/bin/env python3
"""One way to build, cache and reuse the Go programs the tests run as real peers.

Jaeger, kustomize and every other Go program the tests or benchmarks run (a Collector
distribution, Compose v2, a Kubernetes control plane) are compiled here from the Go
module proxy, once per machine, by :func:`ensure` on a :class:`GoTool` recipe.

Contract:
- Each build lives outside the repository in ``$GYM_TELEMETRY_PEERS_DIR`` (default
  ``~/.cache/gym-telemetry/peers``) ``/<name>-<version>/``, binaries under ``bin/``.
- A ``.complete`` marker holding the recipe is written only after the build and the
  recipe's version check succeeded; a directory without it (or with another recipe) is
  deleted and rebuilt. A lock file beside the directory serialises concurrent callers
  (they wait, then reuse the result).
- **One Go module cache and one build cache for every peer**: ``<peers>/go/mod`` and
  ``<peers>/go/build``. Two peers that share module versions compile them once.
- ``GOFLAGS=-mod=mod`` and ``GOTOOLCHAIN=local``: the machine's ``go`` is used as is and
  fetches no other toolchain.
- How a program is fetched is the recipe's: ``go get -tool`` in a throwaway module (the
  default: it works for modules whose go.mod has ``replace`` lines, which ``go install
  pkg@version`` refuses), optionally with ``replace`` lines of the recipe's own, or the
  module's own source copied out of the module cache and built in place (for modules
  whose go.mod has ``exclude`` lines, which ``go get`` of a dependent ignores), or a
  module the recipe generates itself (``generate``: for instance the Collector builder's
  output from a manifest), built in place.
- A binary of the pinned version already on the machine (on PATH) is used instead of a
  build when the recipe says how to recognise it (``path_version``).
- Timings (fetch, build) are printed on stderr; stdout carries only results.

Needs only the standard library and ``go`` on PATH (or ``$GO``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MARKER = ".complete"
BUILD_TIMEOUT_S = float(os.environ.get("GYM_TELEMETRY_GO_BUILD_TIMEOUT_S", "3600"))
"""Per build step. A cut build keeps what it compiled in the shared build cache, so the
next call resumes rather than restarts (a Kubernetes build at load average 40 took more
than one hour)."""


def _log(name: str, msg: str) -> None:
    print(f"go_peers[{name}]: {msg}", file=sys.stderr, flush=True)


def peers_dir() -> Path:
    """The cache directory shared by every peer the tests build or download."""
    default = Path.home() / ".cache" / "gym-telemetry" / "peers"
    return Path(os.environ.get("GYM_TELEMETRY_PEERS_DIR", default)).expanduser()


def go_binary() -> str:
    found = os.environ.get("GO") or shutil.which("go")
    if not found:
        raise RuntimeError("`go` is not on PATH (set GO=/path/to/go); peers are built from source")
    return found


def go_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every Go build step: the one shared module and build cache."""
    env = dict(os.environ)
    go_root = peers_dir() / "go"
    env.update(
        GOMODCACHE=str(go_root / "mod"),
        GOCACHE=str(go_root / "build"),
        GOPATH=str(go_root / "path"),
        GOFLAGS="-mod=mod -modcacherw",
        GOTOOLCHAIN="local",
    )
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class GoTool:
    """A recipe: what to fetch, what to build, how to check the result.

    ``programs`` maps each output binary name to its Go package path (``pkg@version``
    pins a package of another module at its own version; several programs are compiled
    by one ``go build`` invocation). ``module`` and
    ``version`` are what ``go get -tool`` fetches (or what is copied out of the module
    cache when ``build_in_module`` is true: then the packages are built inside the
    module's own tree, with its own go.mod). ``replaces`` are ``old => new`` lines added
    to the throwaway module. ``check`` is the argument list run on the first binary to
    prove it works (its output is logged). ``recipe`` is bumped when the steps change.
    """

    name: str
    module: str
    version: str
    programs: dict[str, str]
    check: tuple[str, ...] = ("--version",)
    ldflags: str = ""
    tags: str = ""
    replaces: tuple[str, ...] = ()
    extra_requires: tuple[str, ...] = ()
    build_in_module: bool = False
    env: dict[str, str] = field(default_factory=dict)
    recipe: str = "1"
    generate: Callable[[Path, dict[str, str]], None] | None = None
    """When set, called with a new, empty work directory and the Go build environment; it
    writes a complete Go module there (go.mod, go.sum, sources), and each of ``programs``
    is a package path relative to it (``"."``). ``module``/``version`` then only name the
    build; put what the generator reads (a manifest digest) into ``recipe`` so a changed
    input is rebuilt."""
    path_version: Callable[[str], bool] | None = None
    """Given a binary found on PATH under the first program's name, True when it is the
    pinned version (then no build happens)."""

    def root(self) -> Path:
        return peers_dir() / f"{self.name}-{self.version}"

    def binary(self, program: str | None = None) -> Path:
        return self.root() / "bin" / (program or next(iter(self.programs)))

    def marker_text(self) -> str:
        progs = ",".join(f"{k}={v}" for k, v in sorted(self.programs.items()))
        return (
            f"{self.module}@{self.version} [{progs}] ldflags={self.ldflags!r} tags={self.tags!r} "
            f"replaces={list(self.replaces)} recipe {self.recipe}\n"
        )

    def is_built(self) -> bool:
        try:
            return (self.root() / MARKER).read_text() == self.marker_text()
        except OSError:
            return False


def default_exec_name(package: str) -> str:
    """The file name ``go build -o DIR/`` gives a main package's binary."""
    parts = package.rstrip("/").split("/")
    last = parts[-1]
    if len(parts) > 1 and last[:1] == "v" and last[1:].isdigit():
        return parts[-2]
    return last


def _run(tool: GoTool, cmd: Sequence[str], cwd: Path, env: dict[str, str]) -> None:
    _log(tool.name, "$ " + " ".join(cmd))
    subprocess.run(list(cmd), check=True, cwd=cwd, env=env, stdout=2, timeout=BUILD_TIMEOUT_S)


def _copy_module_source(tool: GoTool, go: str, env: dict[str, str], dest: Path) -> None:
    """Download the module into the shared cache and copy its tree to ``dest`` (writable)."""
    out = subprocess.run(
        [go, "mod", "download", "-json", f"{tool.module}@{tool.version}"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=dest.parent,
        timeout=BUILD_TIMEOUT_S,
    ).stdout
    import json

    source = Path(json.loads(out)["Dir"])
    shutil.copytree(source, dest)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def _build(tool: GoTool) -> None:
    root = tool.root()
    if root.exists():
        _log(tool.name, f"removing incomplete build {root}")
        shutil.rmtree(root)
    (root / "bin").mkdir(parents=True)
    go, env = go_binary(), go_env(tool.env)
    started = time.monotonic()
    if tool.generate is not None:
        workdir = root / "src"
        workdir.mkdir()
        _log(tool.name, f"generating the module to build in {workdir}")
        tool.generate(workdir, env)
    elif tool.build_in_module:
        workdir = root / "src"
        _copy_module_source(tool, go, env, workdir)
        _run(tool, [go, "mod", "download"], workdir, env)
    else:
        workdir = root
        _run(tool, [go, "mod", "init", f"gym-telemetry.invalid/{tool.name}-build"], workdir, env)
        edits = [f"-replace={line.replace(' => ', '=')}" for line in tool.replaces]
        edits += [f"-require={req}" for req in tool.extra_requires]
        if edits:  # one invocation however many lines (a Kubernetes recipe has 33 replaces)
            _run(tool, [go, "mod", "edit", *edits], workdir, env)
        tools = [pkg if "@" in pkg else f"{pkg}@{tool.version}" for pkg in tool.programs.values()]
        _run(tool, [go, "get", "-tool", *tools], workdir, env)
    fetched = time.monotonic()
    flags: list[str] = ["-trimpath"]
    if tool.ldflags:
        flags += ["-ldflags", tool.ldflags]
    if tool.tags:
        flags += ["-tags", tool.tags]
    targets: dict[str, str] = {}
    for program, package in tool.programs.items():
        target = package.split("@", 1)[0]
        if tool.build_in_module and target.startswith(tool.module):
            target = "." + target[len(tool.module) :] or "."
        targets[program] = target
    if len(targets) == 1:
        ((program, target),) = targets.items()
        _run(tool, [go, "build", *flags, "-o", str(root / "bin" / program), target], workdir, env)
    else:
        # Several programs: one `go build` invocation, so the packages they share are
        # compiled once and the build runs them in parallel; then each binary is renamed
        # from Go's default name (the last path element, a /vN suffix skipped).
        staging = root / "bin" / ".build"
        staging.mkdir()
        _run(tool, [go, "build", *flags, "-o", f"{staging}/", *targets.values()], workdir, env)
        for program, target in targets.items():
            (staging / default_exec_name(target)).rename(root / "bin" / program)
        staging.rmdir()
    built = time.monotonic()
    if tool.build_in_module or tool.generate is not None:
        shutil.rmtree(workdir, ignore_errors=True)  # only the binaries are needed afterwards
    out = subprocess.run(
        [str(tool.binary()), *tool.check],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,  # the exit code is checked below, with the output in the message
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"{tool.binary()} {' '.join(tool.check)} exited {out.returncode}: {out.stderr[-2000:]}"
        )
    _log(
        tool.name, f"built; {' '.join(tool.check)} says {(out.stdout or out.stderr).strip()[:200]}"
    )
    (root / MARKER).write_text(tool.marker_text())
    _log(
        tool.name,
        f"{tool.module}@{tool.version} built in {built - started:.0f} s "
        f"(fetch {fetched - started:.0f} s, go build {built - fetched:.0f} s)",
    )


def on_path(tool: GoTool) -> Path | None:
    """A binary of the pinned version already on the machine, when the recipe can tell."""
    if tool.path_version is None:
        return None
    found = shutil.which(next(iter(tool.programs)))
    if found and tool.path_version(found):
        return Path(found)
    return None


def ensure(tool: GoTool, *, prefer_path: bool = True) -> Path:
    """Return the first program's binary, building the recipe first when needed.

    Blocks while another caller builds the same recipe. The other programs of the
    recipe sit beside it (``tool.binary(name)``); a binary taken from PATH is returned
    only for single-program recipes or when ``prefer_path`` names it so.
    """
    if prefer_path and (found := on_path(tool)) is not None:
        return found
    if tool.is_built():
        return tool.binary()
    root = tool.root()
    root.parent.mkdir(parents=True, exist_ok=True)
    with root.with_name(root.name + ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not tool.is_built():
                _log(tool.name, f"building {tool.module}@{tool.version} into {root} (once)")
                _build(tool)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return tool.binary()


def main_for(tool: GoTool, argv: list[str] | None = None, describe: str = "") -> int:
    """A small CLI for a recipe: ``ensure`` (build if needed, print the binary) or ``path``."""
    import argparse

    parser = argparse.ArgumentParser(description=describe or f"build {tool.name}")
    parser.add_argument("command", choices=["ensure", "path", "version"])
    args = parser.parse_args(argv)
    if args.command == "path":
        print(tool.binary())
        return 0
    if args.command == "version":
        print(tool.version)
        return 0
    try:
        print(ensure(tool))
    except subprocess.CalledProcessError as exc:
        _log(tool.name, f"failed: {' '.join(map(str, exc.cmd))} exited with {exc.returncode}")
        return 1
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        _log(tool.name, f"failed: {exc}")
        return 1
    return 0
