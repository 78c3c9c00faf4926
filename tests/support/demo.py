"""Running ``scripts/demo.sh`` (what ``make demo`` runs) as a user would, for the tests.

:func:`demo_env` is this process's environment without the ``GYM_SIDECAR_*`` settings (the
demo configures its own sidecar) and with a wide terminal so that rich tables are not cut;
:func:`run_demo` runs the script from the repository root and returns what it printed.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def demo_env() -> dict[str, str]:
    """The environment for the demo: ours, less ``GYM_SIDECAR_*``, with ``COLUMNS=200``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
    env["COLUMNS"] = "200"
    return env


def run_demo(
    *,
    rollouts: int,
    failing: int,
    concurrency: int,
    store_dir: Path,
    workdir: Path,
    env: dict[str, str],
    timeout_s: float,
    extra_args: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """``bash scripts/demo.sh [extra_args] --rollouts ... --workdir ...``; output captured.

    Does not check the exit code: the caller asserts on it with the output in the message.
    """
    return subprocess.run(
        [
            "bash",
            str(REPO / "scripts" / "demo.sh"),
            *extra_args,
            "--rollouts",
            str(rollouts),
            "--failing",
            str(failing),
            "--concurrency",
            str(concurrency),
            "--store-dir",
            str(store_dir),
            "--workdir",
            str(workdir),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
