"""Resident memory of the sidecar in its default configuration, idle and at a fixed rate.

    uv run --frozen python -m bench.sidecar_memory [--rounds 5] [--rate 10000] [--seconds 15]
        [--load varied|rollouts|...] [--protocol grpc|http] [--bytecode]
        [--variant NAME:K=V,K=V ...] [--source NAME=TREE ...] [--smaps] [--json FILE]
        [--container IMAGE [--container-variant NAME:K=V,K=V ...]]

A benchmark harness, not a test. Per round and variant (interleaved, order shuffled):
a fresh ``gym-sidecar run`` with no config file and only ``--backend`` set (gRPC export,
no compression: the defaults) pointing at a counting gRPC sink; its ``VmRSS`` once
``/readyz`` answers and after 2 s more (idle), and its ``VmHWM`` then (the start-up
peak); then the peak is reset (``/proc/<pid>/clear_refs``) and ``bench.loadgen`` paces
``--rate`` spans/s of ``--load`` into it over ``--protocol`` (gRPC by default; ``http``:
OTLP/HTTP protobuf, through the sidecar's HTTP/1.1 server) for ``--seconds`` (the
default span gating forwards part of it), and the figures are the RSS at the end, the
peak under load (``VmHWM`` since the reset) and the CPU share.

Variants: ``default`` (this tree, no extra environment) always runs. ``--variant``
adds one whose sidecar gets extra environment variables (e.g.
``arena2:MALLOC_ARENA_MAX=2``); ``--source NAME=TREE`` one that runs another checkout's
sidecar (``TREE/sidecar/src`` and ``TREE/semconv/src`` first on its path: a ``git
worktree`` or a ``git archive`` of another commit), for before/after pairs in one run.

``--container IMAGE``: the sidecar image too, as variant ``container`` (and one per
``--container-variant``, e.g. ``container-python:GYM_SIDECAR_NATIVE=0`` for the image's
pure-Python fallback), started with ``docker run --network host`` and measured through
its main process's ``/proc`` entry like the host process (:mod:`bench.sidecar_container`);
each such round line says which trace scanner the container reported on its
``/metrics``. Same rounds, same sink, same load: the ratios to ``default`` are the
figures to read.

``--bytecode``: the sidecar runs on compiled bytecode, as the sidecar image is built
(``UV_COMPILE_BYTECODE=1``): the interpreter's library, site-packages and every
variant's tree are compiled once into ``--pycache`` and the sidecar is started with
``PYTHONPYCACHEPREFIX`` there. Without it a development environment that sets
``PYTHONDONTWRITEBYTECODE`` (as this one does) compiles every module from source at
each start, which leaves ~2-3 MiB more resident and a start-up peak well above idle
(hpack's 168 KB Huffman table alone). ``--smaps`` prints, per variant, the largest
mappings of ``/proc/<pid>/smaps`` at idle and at the end of the load.

Prints medians and ranges, and the load average at start and end.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import random
import statistics
import sys
import sysconfig
import time
import warnings
from collections import Counter
from pathlib import Path

from gym_telemetry_demo.sidecar import SidecarProcess
from gym_telemetry_demo.stopsignals import run_main

from bench.loadgen import LOADS
from bench.sidecar_container import ContainerSidecar
from bench.sidecar_vs_rotel.procs import status_mib
from bench.sidecar_vs_rotel.runs import LoadSpec, run
from testkit.sink import RecordingSink

REPO = Path(__file__).resolve().parents[1]
FIGURES = ("idle", "startup", "end", "peak", "cpu")


def smaps(pid: int, top: int = 8) -> str:
    """The ``top`` mappings by resident size (anonymous ones summed), one line."""
    rss: Counter[str] = Counter()
    name = "[anon]"
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            head = line.split()
            if not head:
                continue
            if not head[0].endswith(":"):
                name = head[5].rsplit("/", 1)[-1] if len(head) > 5 else "[anon]"
            elif head[0] == "Rss:":
                rss[name] += int(head[1])
    total = sum(rss.values()) / 1024
    parts = ", ".join(f"{n} {kb / 1024:.1f}" for n, kb in rss.most_common(top))
    return f"{total:.1f} MiB: {parts}"


class DefaultSidecar:
    """``gym-sidecar run --backend URL``: nothing else configured."""

    def __init__(self, sink: str, env: dict[str, str], workdir: Path, show_smaps: bool) -> None:
        self.name = "sidecar"
        self.proc = SidecarProcess(
            backend=sink, extra_args=["--log-level", "warning"], env=env, log_dir=workdir
        )
        self.grpc_target = self.proc.grpc_endpoint
        self.http_target: str | None = self.proc.http_url
        self.pid: int | None = None
        self.idle_mib: float | None = None
        self.startup_mib: float | None = None
        self.show_smaps = show_smaps
        self.scanner: str | None = None

    def start(self) -> None:
        self.proc.start()
        assert self.proc.proc is not None
        self.pid = self.proc.proc.pid
        self.scanner = self.proc.trace_scanner()
        time.sleep(2.0)
        self.idle_mib = status_mib(self.pid, "VmRSS")
        self.startup_mib = status_mib(self.pid, "VmHWM")
        if self.show_smaps:
            print(f"  idle smaps {smaps(self.pid)}", flush=True)
        # From here VmHWM is the peak under load, not the start-up's (imports, the
        # configuration's validation).
        with open(f"/proc/{self.pid}/clear_refs", "w", encoding="ascii") as f:
            f.write("5")

    def stop(self) -> None:
        if self.show_smaps and self.pid is not None:
            print(f"  end smaps  {smaps(self.pid)}", flush=True)
        self.proc.stop()


def compile_bytecode(pycache: Path, trees: list[Path]) -> None:
    """Compile the stdlib, site-packages and ``trees`` into ``pycache`` (kept between runs)."""
    before = sys.pycache_prefix
    sys.pycache_prefix = str(pycache)  # compileall's workers are forked: they inherit it
    try:
        dirs = [Path(sysconfig.get_paths()[k]) for k in ("stdlib", "purelib", "platlib")]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the stdlib's test data has SyntaxWarnings
            for directory in dict.fromkeys([*dirs, *trees]):
                compileall.compile_dir(directory, quiet=2, workers=2)
    finally:
        sys.pycache_prefix = before


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):6.1f} ({min(values):.1f}-{max(values):.1f})"


def _loadavg() -> list[str]:
    with open("/proc/loadavg", encoding="ascii") as f:
        return f.read().split()[:3]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rate", type=float, default=10_000.0)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--load", choices=LOADS, default="varied")
    p.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="sending")
    p.add_argument("--variant", action="append", default=[], help="NAME:K=V,K=V")
    p.add_argument("--source", action="append", default=[], help="NAME=TREE")
    p.add_argument("--bytecode", action="store_true", help="run on compiled bytecode")
    p.add_argument("--pycache", type=Path, default=Path("/tmp/gym-bench-pycache"))
    p.add_argument("--smaps", action="store_true", help="print the largest mappings")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--container", help="also measure this sidecar image (variant container)")
    p.add_argument("--container-variant", action="append", default=[], help="NAME:K=V,K=V")
    args = p.parse_args(argv)
    variants: dict[str, dict[str, str]] = {"default": {}}
    containers: dict[str, dict[str, str]] = {}
    if args.container:
        containers["container"] = {}
        for spec in args.container_variant:
            name, _, kvs = spec.partition(":")
            containers[name] = dict(kv.split("=", 1) for kv in kvs.split(",") if kv)
    trees = [REPO / "sidecar" / "src", REPO / "semconv" / "src"]
    for spec in args.variant:
        name, _, kvs = spec.partition(":")
        variants[name] = dict(kv.split("=", 1) for kv in kvs.split(",") if kv)
    for spec in args.source:
        name, _, tree = spec.partition("=")
        root = Path(tree).resolve()
        paths = [root / "sidecar" / "src", root / "semconv" / "src"]
        variants[name] = {"PYTHONPATH": os.pathsep.join(map(str, paths))}
        trees += paths
    if args.bytecode:
        compile_bytecode(args.pycache, trees)
        for env in variants.values():
            env["PYTHONPYCACHEPREFIX"] = str(args.pycache)
    figures: dict[str, dict[str, list[float]]] = {
        v: {k: [] for k in FIGURES} for v in [*variants, *containers]
    }
    load_start = [float(x) for x in _loadavg()]
    rng = random.Random(args.seed)
    workdir = Path("/tmp") / f"bench-mem-{int(time.time())}"
    workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"load {args.load} at {args.rate:.0f} spans/s for {args.seconds:.0f} s, "
        f"over {args.protocol}, "
        f"{'compiled bytecode' if args.bytecode else 'modules compiled at import'}"
        f"{f', image {args.container}' if args.container else ''}; "
        f"load average at start: {_loadavg()}",
        flush=True,
    )
    with RecordingSink(record=False) as sink:
        for rnd in range(args.rounds):
            order = [*variants, *containers]
            rng.shuffle(order)
            for name in order:
                col: DefaultSidecar | ContainerSidecar
                if name in containers:
                    col = ContainerSidecar(
                        args.container, sink.endpoint, containers[name], workdir, name
                    )
                else:
                    col = DefaultSidecar(sink.endpoint, variants[name], workdir, args.smaps)
                spec = LoadSpec(args.protocol, 512, 0, 4, args.rate, args.seconds, args.load)
                res = run(col, sink, spec, rnd, lambda got, expected: None, settle_s=1.0)
                figs = figures[name]
                for key, value in (
                    ("idle", col.idle_mib),
                    ("startup", col.startup_mib),
                    ("end", res.rss_end_mib),
                    ("peak", res.peak_rss_mib),
                    ("cpu", res.cpu_pct),
                ):
                    if value is not None:
                        figs[key].append(value)
                scanner = getattr(col, "scanner", None)
                print(
                    f"round {rnd + 1} {name:12s}{f' [{scanner}]' if scanner else ''}"
                    f" idle {col.idle_mib:.1f}"
                    f" (start-up peak {col.startup_mib:.1f}) end {res.rss_end_mib:.1f}"
                    f" peak under load {res.peak_rss_mib:.1f} MiB cpu {res.cpu_pct:.1f}%"
                    f" delivered {res.spans_delivered}/{res.spans_sent}",
                    flush=True,
                )
    load_end = [float(x) for x in _loadavg()]
    print(f"load average at end: {_loadavg()}")
    head = ("idle MiB", "start-up peak", "end MiB", "peak under load", "CPU %")
    print(f"{'variant':14s} " + " ".join(f"{h:>20s}" for h in head))
    for name, figs in figures.items():
        cells = " ".join(f"{_fmt(figs[k]):>20s}" for k in FIGURES)
        print(f"{name:14s} {cells}")
    base = figures["default"]
    for name in [n for n in figures if n != "default"]:
        ratios = " ".join(
            f"{k} x{statistics.median(figures[name][k]) / statistics.median(base[k]):.2f}"
            for k in FIGURES
            if figures[name][k] and base[k] and statistics.median(base[k])
        )
        print(f"{name} / default (medians): {ratios}")
    if args.json:
        doc = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "load_start": load_start,
            "load_end": load_end,
            "variants": figures,
        }
        args.json.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
