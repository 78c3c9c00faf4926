"""What the callgrind benches share: the valgrind command, the switch that turns
instrumentation on in the child, and the pattern that reads a dump's total.

Standard library only: ``bench/gym_verify_callgrind_child.py`` runs under the Gym env's
python, outside the repository, and imports this as a sibling file (``callgrind_support``);
the benches in the repository import it as ``bench.callgrind_support``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

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
