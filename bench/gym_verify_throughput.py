"""Throughput of a real NeMo Gym resources server's ``/verify``, instrumented vs not.

Copies of the shipped ``example_single_tool_call`` server run from the cached Gym
environment (``scripts/gym_env.py``), started like Gym's launcher starts them:

- ``bare``: no ``GYM_TELEMETRY`` (the agent is installed but inactive);
- ``groups_off``: ``GYM_TELEMETRY=1``, span groups ``none`` (every gate closed);
- ``groups_default_no_verify``: ``GYM_TELEMETRY=1``, ``default,-verify`` (per
  ``/verify`` request: the SERVER span; what ``default`` meant before issue 15.1);
- ``groups_default``: ``GYM_TELEMETRY=1``, the ``default`` spec, i.e. no configuration
  (per request: the SERVER span and ``gym.verify``, which is in ``metrics`` mode by
  default so that the sidecar derives ``gym.verify.*``);
- ``groups_all``: ``GYM_TELEMETRY=1``, span groups ``all`` (per request: the SERVER span
  and ``gym.verify``).

The activated variants export OTLP/gRPC to a counting sink process.

A separate client process (aiohttp, ``--concurrency`` keep-alive connections) POSTs a
realistic verify body with a ``traceparent`` and the rollout-id baggage, as the agent
does, for ``--duration`` seconds per round. Variants are measured in turn, ``--rounds``
times, interleaved; the median requests/s of each and the ratios to ``bare`` are printed.
Only ratios from the same run mean anything (shared, noisy 2-core machines). Besides
requests/s it prints the server process's CPU time per request (from ``/proc``), whose
ratio -- throughput per CPU-second -- is far less sensitive to other load on the box.

    uv run python bench/gym_verify_throughput.py [--duration 3] [--rounds 5] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gym_telemetry_demo.ports import free_port, wait_listening  # noqa: E402
from gym_telemetry_demo.stopsignals import run_main  # noqa: E402

from testkit.gym_stack import EXAMPLE_TASK, GymStack, load_configs  # noqa: E402

SERVER = "example_single_tool_call"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BAGGAGE = "nemo.gym.rollout.id=12-3"
VARIANTS: dict[str, dict[str, str]] = {
    "bare": {},
    "groups_off": {"GYM_TELEMETRY": "1", "GYM_TELEMETRY_SPAN_GROUPS": "none"},
    "groups_default_no_verify": {
        "GYM_TELEMETRY": "1",
        "GYM_TELEMETRY_SPAN_GROUPS": "default,-verify",
    },
    "groups_default": {"GYM_TELEMETRY": "1", "GYM_TELEMETRY_SPAN_GROUPS": "default"},
    "groups_all": {"GYM_TELEMETRY": "1", "GYM_TELEMETRY_SPAN_GROUPS": "all"},
}


def verify_body() -> dict[str, Any]:
    """What simple_agent sends to /verify: the run body plus the model's response."""
    return {
        **EXAMPLE_TASK,
        "response": {
            "id": "resp_bench",
            "object": "response",
            "created_at": 0,
            "model": "stub-model",
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "output": [
                {
                    "type": "function_call",
                    "id": "fc_bench",
                    "call_id": "call_bench",
                    "name": "get_weather",
                    "arguments": '{"city": "San Francisco"}',
                    "status": "completed",
                },
                {
                    "type": "message",
                    "id": "msg_bench",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "annotations": [], "text": "cold"}],
                },
            ],
        },
    }


# --- client process -------------------------------------------------------------------


async def _client(url: str, duration_s: float, concurrency: int) -> dict[str, float]:
    import aiohttp

    data = json.dumps(verify_body()).encode()
    headers = {
        "Content-Type": "application/json",
        "traceparent": TRACEPARENT,
        "baggage": BAGGAGE,
    }
    done = 0
    errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(deadline: float) -> None:
            nonlocal done, errors
            while time.monotonic() < deadline:
                async with session.post(url, data=data, headers=headers) as resp:
                    await resp.read()
                    if resp.status == 200:
                        done += 1
                    else:
                        errors += 1

        warm = time.monotonic() + 0.5
        await asyncio.gather(*(worker(warm) for _ in range(concurrency)))
        warm_up_done = done
        done = errors = 0
        start = time.monotonic()
        await asyncio.gather(*(worker(start + duration_s) for _ in range(concurrency)))
        elapsed = time.monotonic() - start
    # total: every request served, warm-up included (what the server's CPU paid for)
    return {"rps": done / elapsed, "errors": errors, "total": warm_up_done + done}


def client_main(url: str, duration_s: float, concurrency: int) -> None:
    print(json.dumps(asyncio.run(_client(url, duration_s, concurrency))), flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, duration_s: float, concurrency: int) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--client",
            url,
            "--duration",
            str(duration_s),
            "--concurrency",
            str(concurrency),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# --- orchestration --------------------------------------------------------------------


def _pid(stack: GymStack) -> int:
    proc = stack.processes[SERVER].proc
    assert proc is not None
    return proc.pid


def gym_python() -> Path:
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gym_env.py"), "install-agent"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def start_sink() -> tuple[subprocess.Popen[str], int]:
    """A counting OTLP/gRPC sink process (``testkit.sink``) on a free port, and
    that port. The caller waits for it to listen, then terminates it and reads its
    last stdout line (the counts)."""
    port = free_port()
    sink = subprocess.Popen(
        [sys.executable, "-m", "testkit.sink", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    return sink, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args.client, args.duration, args.concurrency)
        return

    python = gym_python()
    workdir = Path(tempfile.mkdtemp(prefix="gym-verify-bench-"))
    sink, sink_port = start_sink()
    stacks: dict[str, GymStack] = {}
    try:
        wait_listening(sink_port)
        for name, extra in VARIANTS.items():
            env = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"127.0.0.1:{sink_port}",
                "GYM_TELEMETRY_POLL_INTERVAL_S": "0",
                **extra,
            }
            stacks[name] = GymStack(
                python, load_configs("stack.yaml"), [SERVER], env, workdir / name
            ).start()
        urls = {name: stack.url(SERVER) + "/verify" for name, stack in stacks.items()}
        pids = {name: _pid(stack) for name, stack in stacks.items()}
        rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
        cpu_us: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for round_no in range(args.rounds):
            for name, url in urls.items():
                cpu_before = cpu_seconds(pids[name])
                result = measure(url, args.duration, args.concurrency)
                cpu_used = cpu_seconds(pids[name]) - cpu_before
                if result["errors"]:
                    raise SystemExit(f"{name}: {result['errors']} failed requests")
                # every request the server answered during the CPU window (warm-up included)
                requests = result.get("total") or result["rps"] * (args.duration + 0.5)
                rates[name].append(result["rps"])
                cpu_us[name].append(1e6 * cpu_used / requests)
                print(
                    f"round {round_no + 1} {name:>24}: {result['rps']:8.1f} req/s "
                    f"{cpu_us[name][-1]:8.0f} server CPU-us/req",
                    flush=True,
                )
    finally:
        for stack in stacks.values():
            stack.stop()
        sink.terminate()
        sink_out, _ = sink.communicate(timeout=30)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    cpu = {name: statistics.median(values) for name, values in cpu_us.items()}
    print(
        f"\n/verify of {SERVER}, {args.concurrency} connections, "
        f"{args.rounds} x {args.duration:g}s per variant (medians):"
    )
    for name, value in medians.items():
        print(
            f"  {name:>24}: {value:8.1f} req/s (ratio {value / medians['bare']:.3f})  "
            f"{cpu[name]:6.0f} server CPU-us/req (req per CPU-second, ratio to bare "
            f"{cpu['bare'] / cpu[name]:.3f})"
        )
    print(f"  sink: {sink_out.strip().splitlines()[-1] if sink_out.strip() else '?'}")


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
