"""What the callgrind benches share: the valgrind command, the switch that turns
instrumentation on in the child, and the pattern that reads a dump's total.

Standard library only: ``bench/gym_verify_callgrind_child.py`` runs under the Gym env's
python, outside the repository, and imports this as a sibling file (``callgrind_support``);
the benches in the repository import it as ``bench.callgrind_support``.
"""

from __future__ import annotations

import collections
import os
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TOTALS = re.compile(r"^(?:totals|summary):\s*(\d+)", re.MULTILINE)


def valgrind_command(out_dir: Path, *options: str) -> list[str]:
    """``valgrind --tool=callgrind`` with start-up uninstrumented, counters zeroed at
    ``os.getpgrp()`` and dumped at ``os.getsid(0)``, ``options`` and the dump files
    ``out_dir/cg.<pid>``; the command to run follows."""
    return [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--zero-before=getpgrp",
        "--dump-before=getsid",
        *options,
        f"--callgrind-out-file={out_dir}/cg.%p",
    ]


_EXIT_DUMP = re.compile(r"cg\.\d+-(\d+)$")
_WINDOW_DUMP = re.compile(r"cg\.\d+\.1-01$")


_EVENTS = re.compile(r"^events:\s*(.+)$", re.MULTILINE)
_SUMMARY = re.compile(r"^(?:summary|totals):\s*(.+)$", re.MULTILINE)


def _total(path: Path) -> int:
    m = TOTALS.search(path.read_text(errors="replace"))
    return int(m.group(1)) if m else 0


def _events(path: Path) -> dict[str, int]:
    """Every event's total in one callgrind file (``Ir``; with ``--cache-sim=yes`` also
    ``Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw``)."""
    text = path.read_text(errors="replace")
    names, summary = _EVENTS.search(text), _SUMMARY.search(text)
    if names is None or summary is None:
        return {}
    values = [int(v) for v in summary.group(1).split()]
    return {
        name: (values[i] if i < len(values) else 0) for i, name in enumerate(names.group(1).split())
    }


def window_events(out_dir: Path) -> list[dict[str, int]]:
    """``window_threads`` for every event callgrind recorded: one dict per thread."""
    window = [f for f in out_dir.iterdir() if _WINDOW_DUMP.search(f.name)]
    if not window:
        return []
    others = []
    for f in sorted(out_dir.iterdir()):
        m = _EXIT_DUMP.search(f.name)
        if m and int(m.group(1)) >= 2:
            others.append(_events(f))
    return [_events(window[0]), *others]


def estimated_cycles(events: dict[str, int]) -> float:
    """Cycles estimated from simulated cache misses, as KCachegrind's ``CEst`` without
    branch simulation: ``Ir + 10 x L1 misses + 100 x last-level misses`` (a model, not a
    measurement: what the misses an instruction count cannot see would add)."""
    l1 = events.get("I1mr", 0) + events.get("D1mr", 0) + events.get("D1mw", 0)
    ll = events.get("ILmr", 0) + events.get("DLmr", 0) + events.get("DLmw", 0)
    return events.get("Ir", 0) + 10 * l1 + 100 * ll


def window_threads(out_dir: Path) -> list[int]:
    """Instructions per thread of the measured window, main thread first (empty when the
    window was never dumped).

    The dump at ``getsid`` (part 1, ``cg.<pid>.1-01``) holds only the thread that called
    it: callgrind's function-triggered dumps and zeroing act on the calling thread. The
    other threads (the batch processor's worker, gRPC's) are read from the dump at exit
    (``cg.<pid>-<thread>``), which counts them from the moment instrumentation was
    switched on (``instrument_on``, right before the window) to the exit right after
    it; the child does nothing else in between.
    """
    window = [f for f in out_dir.iterdir() if _WINDOW_DUMP.search(f.name)]
    if not window:
        return []
    others = []
    for f in sorted(out_dir.iterdir()):
        m = _EXIT_DUMP.search(f.name)
        if m and int(m.group(1)) >= 2:
            others.append(_total(f))
    return [_total(window[0]), *others]


def instrument_on() -> None:
    """Under callgrind started with ``--instr-atstart=no`` (``BENCH_CALLGRIND=1``): switch
    instrumentation on now (start-up ran uninstrumented, ~10x faster) and wait for it."""
    if os.environ.get("BENCH_CALLGRIND") != "1":
        return
    import subprocess

    done = subprocess.run(
        ["callgrind_control", "-i", "on", str(os.getpid())],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode or "OK" not in done.stdout:
        raise RuntimeError(f"callgrind_control failed: {done.stdout} {done.stderr}")


def kernel_counters(before: Any, after: Any) -> dict[str, float]:
    """What an instruction count cannot see, between two ``resource.getrusage`` results of
    the process: user and kernel CPU seconds, minor page faults and context switches."""
    return {
        "user_s": after.ru_utime - before.ru_utime,
        "system_s": after.ru_stime - before.ru_stime,
        "minor_faults": after.ru_minflt - before.ru_minflt,
        "voluntary_switches": after.ru_nvcsw - before.ru_nvcsw,
        "involuntary_switches": after.ru_nivcsw - before.ru_nivcsw,
    }


def rusage() -> Any:
    """This process's ``resource.getrusage`` (the argument :func:`kernel_counters` takes)."""
    return resource.getrusage(resource.RUSAGE_SELF)


def live_requests_sent() -> int:
    """Live-event requests the agent has sent so far in this process (0 without the
    agent): one per interval of wall clock, whatever the requests."""
    live = sys.modules.get("gym_telemetry._live")
    return int(live.stats()["requests_sent"]) if live is not None else 0


def live_clock_env(factor: float) -> dict[str, str]:
    """The agent's environment that multiplies its live-event and lag-probe intervals by
    ``factor`` (the benches' ``--live-clock-x``: under callgrind a request takes ~50x its
    native wall time, so the heartbeats per request are as many times more); empty at 1."""
    if factor == 1.0:
        return {}
    from gym_telemetry_semconv import live  # the harness's env only, not the child's

    return {
        "GYM_TELEMETRY_LIVE_INTERVAL_S": str(live.DEFAULT_INTERVAL_S * factor),
        "GYM_TELEMETRY_LAG_PROBE_INTERVAL_S": str(live.DEFAULT_LAG_PROBE_INTERVAL_S * factor),
    }


def gym_env_python() -> Path:
    """The cached Gym environment's python (built by ``scripts/gym_env.py`` when absent).

    The environment is shared by every checkout on the machine, so the benches do not
    reinstall the agent into it: they put a source tree first on ``PYTHONPATH``
    (``agent_path``)."""
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gym_env.py"), "ensure"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def agent_path(agent_src: str | None = None) -> str:
    """``PYTHONPATH`` putting an agent source tree (default: this tree's ``agent/src``)
    and this tree's ``semconv/src`` ahead of what the Gym environment has installed."""
    return os.pathsep.join(
        [agent_src or str(REPO / "agent" / "src"), str(REPO / "semconv" / "src")]
    )


class OpcodeProfile:
    """Bytecodes executed and calls made per Python function on the calling thread, between
    ``start()`` and ``stop()`` (``sys.settrace`` with opcode events; natively only, it
    slows the code ~50x). A coroutine resumed after an ``await`` counts as a call: each
    resumption costs a frame switch. The bytecode count is what an instruction count of
    Python code mostly follows, function by function."""

    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self._names: dict[Any, str] = {}

    def _name(self, code: Any) -> str:
        name = self._names.get(code)
        if name is None:
            where = code.co_filename.rpartition("site-packages/")[2]
            where = where.rpartition("/agent/src/")[2]
            name = self._names[code] = f"{where}:{code.co_firstlineno}:{code.co_qualname}"
        return name

    def _trace(self, frame: Any, event: str, arg: Any) -> Any:
        name = self._name(frame.f_code)
        if event == "call":
            self.calls[name] += 1
        frame.f_trace_opcodes = True
        ops = self.ops

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "opcode":
                ops[name] += 1
            return local

        return local

    def start(self) -> None:
        sys.settrace(self._trace)

    def stop(self) -> None:
        sys.settrace(None)

    def result(self, per: int) -> dict[str, dict[str, float]]:
        """``{"ops": {function: per unit}, "calls": {...}}`` divided by ``per``."""
        return {
            "ops": {k: v / per for k, v in self.ops.items()},
            "calls": {k: v / per for k, v in self.calls.items()},
        }


def print_profile_diff(
    base: dict[str, dict[str, float]], other: dict[str, dict[str, float]], top: int, unit: str
) -> None:
    """The functions whose bytecode counts differ most between two ``OpcodeProfile``
    results, with their call-count differences."""
    ops_a, ops_b = base["ops"], other["ops"]
    calls_a, calls_b = base["calls"], other["calls"]
    total_a, total_b = sum(ops_a.values()), sum(ops_b.values())
    print(
        f"    bytecodes per {unit}: {total_a:,.0f} -> {total_b:,.0f} ({total_b - total_a:+,.0f}); "
        f"Python calls {sum(calls_a.values()):,.1f} -> {sum(calls_b.values()):,.1f}"
    )
    diff = [(ops_b.get(k, 0.0) - ops_a.get(k, 0.0), k) for k in set(ops_a) | set(ops_b)]
    diff.sort(key=lambda item: -abs(item[0]))
    for d, k in diff[:top]:
        if abs(d) < 0.5:
            break
        c = calls_b.get(k, 0.0) - calls_a.get(k, 0.0)
        print(f"    {d:+9.1f} bytecodes {c:+7.1f} calls  {k}")
