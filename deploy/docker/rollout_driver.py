#!/usr/bin/env python3
"""A small rollout driver for the compose stack: POSTs rollouts to a Gym agent's /run.

Environment: ``AGENT_URL`` (default ``http://simple-agent:8000``), ``ROLLOUTS`` (default
5), ``TASK_INDEX`` (default 0), ``WAIT_S`` (how long to wait for the agent, default 300),
``REQUEST_TIMEOUT_S`` (default 60). Standard library only.

Each rollout is the ``example_single_tool_call`` task ("what's it like in sf?" with a
``get_weather`` tool) with ``_ng_task_index``/``_ng_rollout_index`` set, so Gym's rollout
id -- the ``nemo.gym.rollout.id`` span attribute to search in Jaeger -- is
``<task>-<rollout>``. Prints one line per rollout; exits 1 when any failed.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any


def rollout_body(task: int, rollout: int) -> dict[str, Any]:
    weather_tool = {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather of a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "city name"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": "what's it like in sf?"}],
            "tools": [weather_tool],
        },
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
    }


def wait_ready(base: str, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(base + "/health", timeout=5):
                return
        except (urllib.error.URLError, OSError) as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"agent at {base} not healthy after {wait_s}s: {exc}") from exc
            time.sleep(1)


def run_rollout(base: str, task: int, rollout: int, timeout_s: float) -> dict[str, Any]:
    request = urllib.request.Request(
        base + "/run",
        data=json.dumps(rollout_body(task, rollout)).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def main() -> int:
    base = os.environ.get("AGENT_URL", "http://simple-agent:8000").rstrip("/")
    count = int(os.environ.get("ROLLOUTS", "5"))
    task = int(os.environ.get("TASK_INDEX", "0"))
    timeout_s = float(os.environ.get("REQUEST_TIMEOUT_S", "60"))
    wait_ready(base, float(os.environ.get("WAIT_S", "300")))
    failures = 0
    for index in range(count):
        rollout_id = f"{task}-{index}"
        try:
            answer = run_rollout(base, task, index, timeout_s)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            failures += 1
            print(f"rollout {rollout_id}: FAILED {exc}", flush=True)
            continue
        print(f"rollout {rollout_id}: reward={answer.get('reward')}", flush=True)
    print(
        f"{count - failures}/{count} rollouts done; in Jaeger search the tag "
        f"nemo.gym.rollout.id={task}-0 (ids {task}-0 .. {task}-{count - 1})",
        flush=True,
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
