"""Resident memory of the sidecar in its default configuration, idle and at a fixed rate.

    uv run --frozen python -m bench.sidecar_memory [--rounds 5] [--rate 10000] [--seconds 15]
        [--variant NAME:K=V,K=V ...]

A benchmark harness, not a test. Per round and variant (interleaved, order shuffled):
a fresh ``gym-sidecar run`` with no config file and only ``--backend`` set (gRPC export,
no compression: the defaults) pointing at a counting gRPC sink; its ``VmRSS`` once
``/readyz`` answers and after 2 s more (idle); then ``bench.loadgen`` paces ``--rate``
spans/s (``varied`` load) into it over gRPC for ``--seconds`` (the default span gating
forwards part of it), and the figures are the
RSS at the end, the peak (``VmHWM``) and the CPU share. ``--variant`` adds a variant
whose sidecar gets extra environment variables (e.g. ``arena2:MALLOC_ARENA_MAX=2``);
``default`` (no extra environment) always runs. Prints medians and ranges and, with
``--modules``, the modules a default sidecar has loaded.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from gym_telemetry_demo.sidecar import SidecarProcess

from bench.sidecar_vs_rotel.procs import status_mib
from bench.sidecar_vs_rotel.runs import LoadSpec, run
from testkit.sink import RecordingSink


class DefaultSidecar:
    """``gym-sidecar run --backend URL``: nothing else configured."""

    def __init__(self, sink: str, env: dict[str, str], workdir: Path) -> None:
        self.name = "sidecar"
        self.proc = SidecarProcess(
            backend=sink, extra_args=["--log-level", "warning"], env=env, log_dir=workdir
        )
        self.grpc_target = self.proc.grpc_endpoint
        self.http_target: str | None = self.proc.http_url
        self.pid: int | None = None
        self.idle_mib: float | None = None

    def start(self) -> None:
        self.proc.start()
        assert self.proc.proc is not None
        self.pid = self.proc.proc.pid
        time.sleep(2.0)
        self.idle_mib = status_mib(self.pid, "VmRSS")

    def stop(self) -> None:
        self.proc.stop()


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):6.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rate", type=float, default=10_000.0)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--variant", action="append", default=[], help="NAME:K=V,K=V")
    p.add_argument("--seed", type=int, default=3)
    args = p.parse_args(argv)
    variants: dict[str, dict[str, str]] = {"default": {}}
    for spec in args.variant:
        name, _, kvs = spec.partition(":")
        variants[name] = dict(kv.split("=", 1) for kv in kvs.split(",") if kv)
    figures: dict[str, dict[str, list[float]]] = {
        v: {"idle": [], "end": [], "peak": [], "cpu": []} for v in variants
    }
    rng = random.Random(args.seed)
    workdir = Path("/tmp") / f"bench-mem-{int(time.time())}"
    workdir.mkdir(parents=True, exist_ok=True)
    with open("/proc/loadavg", encoding="ascii") as f:
        print(f"load average at start: {f.read().split()[:3]}")
    with RecordingSink(record=False) as sink:
        for rnd in range(args.rounds):
            order = list(variants)
            rng.shuffle(order)
            for name in order:
                col = DefaultSidecar(sink.endpoint, variants[name], workdir)
                spec = LoadSpec("grpc", 512, 0, 4, args.rate, args.seconds, "varied")
                res = run(col, sink, spec, rnd, lambda got, expected: None, settle_s=1.0)
                figs = figures[name]
                if col.idle_mib is not None:
                    figs["idle"].append(col.idle_mib)
                for key, value in (
                    ("end", res.rss_end_mib),
                    ("peak", res.peak_rss_mib),
                    ("cpu", res.cpu_pct),
                ):
                    if value is not None:
                        figs[key].append(value)
                print(
                    f"round {rnd + 1} {name:12s} idle {col.idle_mib:.1f} end {res.rss_end_mib:.1f}"
                    f" peak {res.peak_rss_mib:.1f} MiB cpu {res.cpu_pct:.1f}%"
                    f" delivered {res.spans_delivered}/{res.spans_sent}",
                    flush=True,
                )
    with open("/proc/loadavg", encoding="ascii") as f:
        print(f"load average at end: {f.read().split()[:3]}")
    print(f"{'variant':14s} {'idle MiB':>20s} {'end MiB':>20s} {'peak MiB':>20s} {'CPU %':>20s}")
    for name, figs in figures.items():
        cells = " ".join(f"{_fmt(figs[k]):>20s}" for k in ("idle", "end", "peak", "cpu"))
        print(f"{name:14s} {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
