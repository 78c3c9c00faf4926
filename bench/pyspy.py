"""Sampling profiles of a benchmark's target process with py-spy (dev dependency).

``start(pid, seconds, out)`` runs ``py-spy record`` against a running process in the
background (raw "folded stacks" output); ``top_frames(out)`` reads such a file back and
returns the frames with the largest inclusive share of the samples, line numbers
dropped, so "where does the time go" can be printed next to a benchmark's figures.
py-spy needs ptrace rights over the target (root, or ``kernel.yama.ptrace_scope=0``).
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

_LINE = re.compile(r":\d+\)$")


def start(pid: int, seconds: float, out: Path, native: bool = False) -> subprocess.Popen[bytes]:
    """Start sampling ``pid`` for ``seconds`` into ``out`` (raw folded stacks)."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds)))]
    # --nonblocking: sample without pausing the target (pausing it cuts its throughput).
    cmd += ["--rate", "250", "--nonblocking", "--format", "raw", "-o", str(out)]
    if native:  # py-spy cannot unwind native stacks without pausing
        cmd.remove("--nonblocking")
        cmd.append("--native")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top_frames(
    path: Path, top: int = 20, match: tuple[str, ...] = ("",)
) -> tuple[int, list[tuple[float, str]]]:
    """(total samples, [(inclusive %, frame)]) for frames containing one of ``match``."""
    total = 0
    incl: collections.Counter[str] = collections.Counter()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        for frame in {_LINE.sub(")", f) for f in stack.split(";")}:
            if any(m in frame for m in match):
                incl[frame] += n
    if not total:
        return 0, []
    return total, [(100.0 * n / total, f) for f, n in incl.most_common(top)]
