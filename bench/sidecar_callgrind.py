"""The whole sidecar process in instructions per span, under callgrind (a benchmark
harness; it asserts nothing).

    uv run --frozen python -m bench.sidecar_callgrind [--load rollouts] [--requests 112]
        [--spans 512] [--groups all] [--compression none|gzip]
        [--grpc-client auto|h2|grpcio] [--protocol grpc|http] [--no-derive]
        [--sidecar-src OTHER_TREE/sidecar/src] [--scanner auto|python] [--top 25]
        [--keep DIR]

What runs: a counting OTLP/gRPC sink (``python -m testkit.sink``), and ``gym-sidecar
run`` under ``valgrind --tool=callgrind --instr-atstart=no`` exporting to it (span
groups ``--groups``, derive on unless ``--no-derive``, two static enrich attributes, as
in the round-3 harness), with export compression ``--compression`` through gRPC client
``--grpc-client`` (``backend.grpc_client``; ``grpcio`` needs the sidecar's ``grpcio``
extra, which the dev environment has). Once the sidecar is
ready, ``bench.loadgen`` sends ``--warmup`` requests of the load (uninstrumented: every
cache, series and connection exists afterwards); then ``callgrind_control`` switches
instrumentation on and zeroes the counters, ``--requests`` requests are sent
(concurrency 4), the harness waits until the sidecar has exported all of their spans,
and the counters are dumped. Every thread of the process is counted (grpc core's
pollers, the export sender, the loop). Work that runs per wall-clock interval rather
than per span -- the derived-metrics export (``metrics.interval_s``), ``malloc_trim``
(``memory.malloc_trim_interval_s``), the span-group config watch -- is switched off for
the counted window unless ``--wall-clock-timers``: valgrind slows the process ~50x, so
those timers would fire ~50x as often per span as at full speed, and more often the
more loaded the machine is.

``--spans`` is the load generator's spans per (full) request: a small value (16) makes
the per-request cost of a transport -- the HTTP/1.1 server, grpc core -- stand out.

Printed: instructions per received span and per request; the self cost of each shared library (the
Python interpreter, upb's ``_message`` module, libc -- memcpy --, grpc core ...); the
inclusive cost of the protobuf parse and serialize entry points; the top functions by
self cost; and the top inclusive functions (``callgrind_annotate --inclusive=yes``;
the interpreter's and asyncio's frames lead that list, since Python functions are not
functions to callgrind). ``--sidecar-src`` puts another
checkout's ``sidecar/src`` first on the sidecar's path, for a before/after pair from
one environment (e.g. a ``git worktree`` of the base commit). ``--scanner python`` runs
the sidecar with ``GYM_SIDECAR_NATIVE=0`` (the pure-Python scanner where the native one
is installed; the report says which ran). ``--json`` writes the figures to a file.

Instruction counts are what to compare between runs (two runs of one script differ by
well under 0.1 %, whatever else the machine does); the wall clock under valgrind means
nothing. Start-up and warm-up run uninstrumented, ~10x faster than instrumented.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import yaml
from gym_telemetry_demo.ports import free_port
from gym_telemetry_demo.stopsignals import run_main

from bench.callgrind_support import TOTALS
from bench.loadgen import LOADS
from testkit.sink import RecordingSink

REPO = Path(__file__).resolve().parents[1]

ENRICH_ATTRIBUTES = {"deployment.environment.name": "bench", "k8s.cluster.name": "gym-bench"}
"""The round-3 harness's two static attributes."""

ENTRY_POINTS = {
    "upb parse": "PyUpb_Message_MergeFromString",
    "upb serialize": "PyUpb_Message_SerializeInternal",
}
"""Inclusive cost of these functions is reported: every ``ParseFromString`` /
``FromString`` goes through the first, every ``SerializeToString`` through the second."""


# -- reading a callgrind dump ---------------------------------------------------------


def _name(table: dict[str, str], spec: str) -> str:
    """Resolve callgrind's name compression: ``(12) name`` defines, ``(12)`` reuses."""
    m = re.match(r"\((\d+)\)\s*(.*)", spec)
    if m is None:
        return spec
    ident, name = m.groups()
    if name:
        table[ident] = name
        return name
    return table.get(ident, ident)


def self_costs(dump: Path) -> dict[tuple[str, str], int]:
    """Self instructions per (object, function) of a callgrind dump (one event, Ir)."""
    objects: dict[str, str] = {}
    functions: dict[str, str] = {}
    costs: dict[tuple[str, str], int] = defaultdict(int)
    ob = fn = ""
    skip_next = False  # the cost line after ``calls=`` is the call's inclusive cost
    with dump.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            c = line[:1]
            if c.isdigit() or c in "+-*":
                if skip_next:
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) >= 2:
                    costs[(ob, fn)] += int(parts[-1])
            elif line.startswith("ob="):
                ob = _name(objects, line[3:].strip())
            elif line.startswith("fn="):
                # fn'2 is fn's second recursion level: one function for self costs.
                fn = re.sub(r"'\d+$", "", _name(functions, line[3:].strip()))
            elif line.startswith("cob="):
                _name(objects, line[4:].strip())
            elif line.startswith("cfn=") or line.startswith("cfi="):
                if line.startswith("cfn="):
                    _name(functions, line[4:].strip())
            elif line.startswith("calls="):
                skip_next = True
    return costs


def by_object(costs: dict[tuple[str, str], int]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for (ob, _), n in costs.items():
        out[Path(ob).name or "?"] += n
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def inclusive(dump: Path, top: int) -> list[tuple[int, str]]:
    """``callgrind_annotate --inclusive=yes``'s rows: (instructions, file:function)."""
    done = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(dump)],
        capture_output=True,
        text=True,
        check=True,
    )
    rows: list[tuple[int, str]] = []
    for line in done.stdout.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*?):(\S+)(?: \[(.*)\])?$", line)
        if m is None or "'" in m.group(3):  # recursion levels (fn'2) count twice
            continue
        where = Path(m.group(4)).name if m.group(4) else Path(m.group(2)).name
        rows.append((int(m.group(1).replace(",", "")), f"{m.group(3)} [{where}]"))
    rows.sort(key=lambda r: -r[0])
    return rows


# -- running ------------------------------------------------------------------------


def _wait_exported(
    sink: RecordingSink, spans: int, timeout_s: float, proc: subprocess.Popen[bytes]
) -> None:
    """Until the sink holds ``spans`` spans, or (span groups that drop some) until its
    count has not moved for 10 s."""
    deadline = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while sink.span_count < spans:
        if proc.poll() is not None:
            raise SystemExit(f"sidecar exited ({proc.returncode}) before exporting")
        if sink.span_count != last:
            last, since = sink.span_count, time.monotonic()
        elif last > 0 and time.monotonic() - since > 10:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: the sink has {sink.span_count} of {spans} spans")
        time.sleep(0.2)


def _wait(predicate: object, timeout_s: float, what: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"sidecar exited ({proc.returncode}) while waiting for {what}")
        try:
            if predicate():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def _loadgen(target: str, protocol: str, load: str, requests: int, spans: int) -> dict[str, object]:
    cmd = [
        sys.executable,
        "-m",
        "bench.loadgen",
        "--target",
        target,
        "--protocol",
        protocol,
        "--load",
        load,
        "--requests",
        str(requests),
        "--spans",
        str(spans),
        "--concurrency",
        "4",
        "--progress-s",
        "3600",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"loadgen failed: {done.stdout[-800:]} {done.stderr[-800:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], capture_output=True, check=True, timeout=600)


def measure(args: argparse.Namespace, work: Path) -> dict[str, object]:
    """Run sink + sidecar under callgrind, send the load; return the dump's path and
    the spans sent while counting."""
    grpc_port, http_port, admin_port = (free_port() for _ in range(3))
    admin = f"http://127.0.0.1:{admin_port}"
    config: dict[str, object] = {
        "span_groups": {"spec": args.groups},
        "enrich": {"attributes": ENRICH_ATTRIBUTES},
        "metrics": {"enabled": not args.no_derive},
        "backend": {"grpc_client": args.grpc_client},
    }
    if not args.wall_clock_timers:
        # Work done per wall-clock interval, not per span: under valgrind's ~50x slowdown
        # it would fire ~50x as often per span as at full speed, and as often as the
        # machine's load stretches the run, so the counts would not repeat.
        config["metrics"] = {"enabled": not args.no_derive, "interval_s": 3600}
        config["memory"] = {"malloc_trim_interval_s": 0}
        config["span_groups"] = {"spec": args.groups, "watch_interval_s": 0}
    (work / "sidecar.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
    env["PYTHONHASHSEED"] = "0"
    if args.scanner == "python":
        env["GYM_SIDECAR_NATIVE"] = "0"
    if args.sidecar_src is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(args.sidecar_src.resolve()), *filter(None, [env.get("PYTHONPATH")])]
        )
    # The sink runs in this process: the harness learns what was exported without
    # asking the sidecar (a /metrics scrape would be counted as the sidecar's work).
    sink = RecordingSink(record=False).start()
    dump = work / "cg.out"
    sidecar_cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--separate-threads=no",
        f"--callgrind-out-file={dump}",
        sys.executable,
        "-m",
        "gym_sidecar.cli",
        "run",
        "--config",
        str(work / "sidecar.yaml"),
        "--grpc-listen",
        f"127.0.0.1:{grpc_port}",
        "--http-listen",
        f"127.0.0.1:{http_port}",
        "--admin-listen",
        f"127.0.0.1:{admin_port}",
        "--backend",
        f"http://{sink.endpoint}",
        "--backend-compression",
        args.compression,
        "--log-level",
        "info",
    ]
    sidecar_log = (work / "sidecar.out").open("wb")
    sidecar = subprocess.Popen(sidecar_cmd, stdout=sidecar_log, stderr=subprocess.STDOUT, env=env)
    target = (
        f"127.0.0.1:{grpc_port}" if args.protocol == "grpc" else f"http://127.0.0.1:{http_port}"
    )
    try:

        def ready() -> bool:
            with urllib.request.urlopen(admin + "/readyz", timeout=2) as resp:
                return bool(resp.status == 200)

        _wait(ready, 600, "the sidecar to be ready", sidecar)
        # Spans the sink should see: all of them with span groups that drop nothing,
        # else as many as stop arriving (waited for by a quiet second).
        if args.warmup:
            warm = _loadgen(target, args.protocol, args.load, args.warmup, args.spans)
            _wait_exported(sink, int(warm["spans"]), 600, sidecar)  # type: ignore[call-overload]
        before = sink.span_count
        _control("-i", "on", str(sidecar.pid))
        _control("-z", str(sidecar.pid))
        done = _loadgen(target, args.protocol, args.load, args.requests, args.spans)
        _wait_exported(sink, before + int(done["spans"]), 1800, sidecar)  # type: ignore[call-overload]
        _control("-d", str(sidecar.pid))
        _control("-i", "off", str(sidecar.pid))
        scanner = re.search(r"trace scanner: (\S+)", (work / "sidecar.out").read_text())
    finally:
        if sidecar.poll() is None:
            sidecar.send_signal(signal.SIGTERM)
            try:
                sidecar.wait(300)
            except subprocess.TimeoutExpired:
                sidecar.kill()
                sidecar.wait()
        sink.stop()
        sidecar_log.close()
    dumps = sorted(work.glob("cg.out*"), key=lambda p: p.stat().st_mtime)
    measured = [d for d in dumps if d.name != "cg.out"] or dumps
    return {
        "dump": str(measured[0]),
        "spans": int(done["spans"]),  # type: ignore[call-overload]
        "requests": int(done["requests"]),  # type: ignore[call-overload]
        "scanner": scanner.group(1) if scanner else "n/a",
    }


def report(args: argparse.Namespace, run: dict[str, object]) -> dict[str, object]:
    dump = Path(str(run["dump"]))
    spans = int(run["spans"])  # type: ignore[call-overload]
    requests = int(run["requests"])  # type: ignore[call-overload]
    m = TOTALS.search(dump.read_text(encoding="utf-8", errors="replace"))
    total = int(m.group(1)) if m else 0
    costs = self_costs(dump)
    objects = by_object(costs)
    rows = inclusive(dump, args.top)
    entry: dict[str, int] = {}
    for label, name in ENTRY_POINTS.items():
        found = [n for n, fn in rows if fn.split(" ", 1)[0] == name]
        entry[label] = found[0] if found else 0
    memcpy = sum(n for (ob, fn), n in costs.items() if "memcpy" in fn or "memmove" in fn)
    result: dict[str, object] = {
        "load": args.load,
        "groups": args.groups,
        "compression": args.compression,
        "grpc_client": args.grpc_client,
        "protocol": args.protocol,
        "derive": not args.no_derive,
        "wall_clock_timers": args.wall_clock_timers,
        "sidecar_src": str(args.sidecar_src or REPO / "sidecar" / "src"),
        "scanner": run["scanner"],
        "requests": run["requests"],
        "spans": spans,
        "spans_per_full_request": args.spans,
        "instructions": total,
        "per_span": total / spans if spans else 0.0,
        "per_request": total / requests if requests else 0.0,
        "objects_per_span": {k: v / spans for k, v in objects.items()},
        "entry_points_per_span": {k: v / spans for k, v in entry.items()},
        "memcpy_per_span": memcpy / spans if spans else 0.0,
        "top_self_per_span": [
            (f"{fn} [{Path(ob).name}]", n / spans)
            for (ob, fn), n in sorted(costs.items(), key=lambda kv: -kv[1])[: args.top]
        ],
        "top_inclusive": rows[: args.top],
    }
    print(
        f"{args.load}, groups {args.groups}, {args.protocol} in, export compression "
        f"{args.compression} ({args.grpc_client}), derive {'on' if not args.no_derive else 'off'}"
        f"{', wall-clock timers on' if args.wall_clock_timers else ''}, "
        f"scanner {run['scanner']}: {run['requests']} requests, {spans} spans, "
        f"{total:,} instructions = {result['per_span']:,.0f} per span, "
        f"{result['per_request']:,.0f} per request"
    )
    print("  self instructions per span, by shared object:")
    for ob, n in list(objects.items())[:12]:
        print(f"    {n / spans:>10,.0f}  {n / total:6.1%}  {ob}")
    print("  inclusive per span:")
    for label, n in entry.items():
        print(f"    {n / spans:>10,.0f}  {n / total:6.1%}  {label}")
    print(f"    {memcpy / spans:>10,.0f}  {memcpy / total:6.1%}  memcpy/memmove (self)")
    print(f"  top {args.top} functions by self instructions (per span, share):")
    for (ob, fn), n in sorted(costs.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"    {n / spans:>10,.0f}  {n / total:6.1%}  {fn[:80]} [{Path(ob).name}]")
    print(f"  top {args.top} inclusive functions (instructions, share):")
    for n, fn in rows[: args.top]:
        print(f"    {n:>14,}  {n / total:6.1%}  {fn[:110]}")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--load", choices=LOADS, default="rollouts")
    p.add_argument("--requests", type=int, default=112, help="requests counted")
    p.add_argument("--warmup", type=int, default=56, help="requests before counting")
    p.add_argument("--spans", type=int, default=512, help="spans per full request (loadgen)")
    p.add_argument("--groups", default="all", help="span_groups.spec")
    p.add_argument("--compression", choices=["none", "gzip"], default="none")
    p.add_argument(
        "--grpc-client", choices=["auto", "h2", "grpcio"], default="auto", help="export client"
    )
    p.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="sending")
    p.add_argument("--no-derive", action="store_true", help="metrics.enabled: false")
    p.add_argument(
        "--wall-clock-timers",
        action="store_true",
        help="keep the derived-metrics export, malloc_trim and config-watch timers firing",
    )
    p.add_argument("--sidecar-src", type=Path, help="another tree's sidecar/src, first")
    p.add_argument(
        "--scanner",
        choices=["auto", "python"],
        default="auto",
        help="python: GYM_SIDECAR_NATIVE=0 (auto: native where it is installed)",
    )
    p.add_argument("--top", type=int, default=30, help="inclusive functions to print")
    p.add_argument("--keep", type=Path, help="keep the dump and logs in this directory")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="sidecar-cg-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = report(args, measure(args, work))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    result["loadavg"] = os.getloadavg()[0]
    print(f"load average after: {result['loadavg']:.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
