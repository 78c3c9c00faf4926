"""The demo's steps: Gym env, sidecar with the local store, Gym servers, rollouts, report.

:func:`run_demo` returns the process exit code (0 when every step worked and every
rollout got an answer). Every child process it starts is stopped before it returns or
raises, unless ``keep`` is set, in which case it waits for a stop signal first.

A stop signal (:mod:`gym_telemetry_demo.stopsignals`: Ctrl-C, SIGTERM or SIGHUP, once
``python -m gym_telemetry_demo`` installed the handler) raises
:class:`~gym_telemetry_demo.stopsignals.Stopped` wherever the demo is, and the same
``finally`` stops every child started so far, in order: the Gym servers (their last spans
reach the sidecar), the web view, the sidecar (it drains into the store), Jaeger. Each
child runs in a process group of its own that dies with the demo
(:mod:`gym_telemetry_demo.procs`).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import gym_telemetry_semconv as semconv
from gym_sidecar.inspect.render import rollouts_table, stats_table, trace_waterfall
from gym_sidecar.inspect.rl_render import rl_group
from gym_sidecar.store import db, queries, rl, stats
from gym_sidecar.store.config import default_data_dir
from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gym_telemetry_demo import hang
from gym_telemetry_demo.gym_servers import (
    AGENT,
    FAILING_AGENT,
    SERVERS,
    GymServers,
    load_configs,
    post_json,
    repo_root,
    run_body,
    telemetry_env,
)
from gym_telemetry_demo.jaeger import JaegerServer, jaeger_binary
from gym_telemetry_demo.procs import spawn, stop_process
from gym_telemetry_demo.sidecar import SidecarProcess
from gym_telemetry_demo.stopsignals import deferred
from gym_telemetry_demo.webview import WebViewChild

METRICS_INTERVAL_S: Final = 2.0
ENV_BUILD_TIMEOUT_S: Final = 1800


@dataclass(frozen=True)
class DemoOptions:
    """What ``python -m gym_telemetry_demo`` was asked to do."""

    rollouts: int
    concurrency: int
    failing: int
    store_dir: Path
    workdir: Path
    keep: bool
    gym_python: Path | None
    wait_s: float = 30.0
    repo: Path | None = None
    """The source tree (``--repo``); None: :func:`~gym_telemetry_demo.gym_servers.repo_root`."""
    jaeger: bool = False
    """Also forward to a Jaeger v2 built from source (``--jaeger``; needs Go)."""
    hang: bool = False
    """Then one rollout whose model call hangs: stalled, then lost (``--hang``, :mod:`.hang`)."""


def prepare_gym_env(console: Console, repo: Path) -> Path:
    """Build or reuse the cached Gym environment with ``repo``'s agent; its python.

    The build script and what it runs (pip) form a process group of their own, stopped
    as a whole when the demo stops meanwhile (an interrupted build is redone next time).
    """
    script = repo / "scripts" / "gym_env.py"
    cmd = [sys.executable, str(script), "install-agent"]
    with console.status("Preparing the NeMo Gym environment (first run: several minutes)..."):
        proc = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stderr is not None and proc.stdout is not None
            for raw in proc.stderr:
                line = raw.decode(errors="replace").rstrip()
                console.print(f"  [dim]{line}[/dim]", highlight=False)
            out = proc.stdout.read().decode(errors="replace")
            code = proc.wait(timeout=ENV_BUILD_TIMEOUT_S)
        finally:
            stop_process(proc, grace_s=10)
    if code != 0 or not out.strip():
        raise RuntimeError(f"scripts/gym_env.py install-agent failed with exit code {code}")
    return Path(out.strip().splitlines()[-1])


def _drive(console: Console, servers: GymServers, opts: DemoOptions) -> dict[str, int]:
    """Run the rollouts; returns answer counts by kind: ``ok 200``, ``failing 500``, ...
    (``error (...)`` when the agent could not be reached)."""
    base = (int(time.time()) % 100_000) * 1000  # rollout ids unique across demo runs
    failing_every = opts.rollouts // opts.failing if opts.failing else 0
    jobs: list[tuple[str, str, dict[str, Any]]] = []
    for i in range(opts.rollouts):
        if (
            failing_every
            and i % failing_every == failing_every - 1
            and i // failing_every < opts.failing
        ):
            body = run_body(base + i, 0, fail_verify=True)
            jobs.append(("failing", servers.url(FAILING_AGENT), body))
        else:
            jobs.append(("ok", servers.url(AGENT), run_body(base + i, 0)))
    outcomes: dict[str, int] = {}
    progress = Progress(
        TextColumn("[bold]rollouts"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    pool = ThreadPoolExecutor(opts.concurrency)
    try:
        with progress:
            task = progress.add_task("rollouts", total=len(jobs))
            futures = {pool.submit(post_json, url + "/run", body): kind for kind, url, body in jobs}
            for future in as_completed(futures):
                try:
                    status, _ = future.result()
                    key = f"{futures[future]} {status}"
                except OSError as exc:
                    key = f"{futures[future]} error ({type(exc).__name__})"
                outcomes[key] = outcomes.get(key, 0) + 1
                progress.advance(task)
    finally:
        # Stopped mid-run: the queued rollouts are dropped, and the demo goes on to stop
        # the servers without waiting for the ones in flight (they fail once it has).
        pool.shutdown(wait=False, cancel_futures=True)
    return outcomes


def _wait_for_store(path: Path, since_ns: int, expected: int, timeout_s: float) -> tuple[int, int]:
    """Poll the store until it holds ``expected`` rollouts started since ``since_ns`` and
    derived points for them; returns (rollouts, points) seen."""
    window_s = (time.time_ns() - since_ns) / 1e9 + 60
    deadline = time.monotonic() + timeout_s
    seen = (0, 0)
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError), closing(db.connect(path, readonly=True)) as c:
            n = len(queries.rollouts(c, since_s=window_s, limit=expected + 1000))
            points = stats.compute(c, window_s).rollout_points.count
            seen = (n, points)
            if n >= expected and points >= expected:
                return seen
        time.sleep(0.5)
    return seen


def _report(console: Console, path: Path, since_ns: int, failing: int) -> None:
    window_s = (time.time_ns() - since_ns) / 1e9 + 5
    with closing(db.connect(path, readonly=True)) as conn:
        recent = queries.rollouts(conn, since_s=window_s, limit=12)
        failed = queries.rollouts(conn, since_s=window_s, failed_only=True, limit=50)
        console.print(rollouts_table(recent, "Recent rollouts (gym-sidecar rollouts)"))
        console.print(rollouts_table(failed, "Failed rollouts (gym-sidecar rollouts --failed)"))
        shown = next((r for r in recent if not r.failed), recent[0] if recent else None)
        if shown is not None:
            console.print(f"\n[bold]gym-sidecar trace {shown.rollout_id}[/bold]")
            console.print(trace_waterfall(queries.trace_spans(conn, shown.trace_id)))
        console.print("\n[bold]gym-sidecar stats[/bold]")
        console.print(stats_table(stats.compute(conn, window_s)))
        console.print(
            "\n[bold]gym-sidecar envs[/bold] (reward, turns and tokens per environment; "
            "model calls; verifier rewards)"
        )
        console.print(
            rl_group(
                rl.environments(conn, window_s),
                rl.models(conn, window_s),
                rl.verifier_rewards(conn, window_s),
            )
        )
    if failing and not failed:
        console.print("[yellow]no failed verification reached the store[/yellow]")


def start_jaeger(console: Console, repo: Path, workdir: Path) -> JaegerServer:
    """Build (first run: minutes, needs Go; ``repo``'s ``scripts/jaeger_build.py``) or
    reuse Jaeger, and start it."""
    with console.status("Building or reusing Jaeger v2 (first run: several minutes, needs Go)..."):
        binary = jaeger_binary(
            repo, lambda line: console.print(f"  [dim]{line}[/dim]", highlight=False)
        )
        jaeger = JaegerServer(workdir / "jaeger", binary).start()
    console.print(
        f"Jaeger: OTLP gRPC {jaeger.otlp_grpc_endpoint}, query API {jaeger.query_url} "
        f"(log {jaeger.log_path})"
    )
    return jaeger


def _jaeger_report(
    console: Console,
    jaeger: JaegerServer,
    store: Path,
    since_ns: int,
    wait_s: float,
    *,
    webview: WebViewChild | None = None,
) -> bool:
    """Print the Jaeger API URL of a failed rollout's trace (found by its rollout id, as
    the UI's tag search finds it); False when Jaeger does not have it within ``wait_s``."""
    window_s = (time.time_ns() - since_ns) / 1e9 + 5
    with closing(db.connect(store, readonly=True)) as conn:
        failed = queries.rollouts(conn, since_s=window_s, failed_only=True, limit=1)
    if not failed:
        console.print("[yellow]no failed rollout to look up in Jaeger[/yellow]")
        return False
    rollout_id = failed[0].rollout_id
    service = f"nemo-gym/{FAILING_AGENT}"
    tags = {semconv.ROLLOUT_ID: rollout_id}
    deadline = time.monotonic() + wait_s
    found = jaeger.find_traces(service, tags)
    while not found and time.monotonic() < deadline:
        time.sleep(0.5)
        found = jaeger.find_traces(service, tags)
    if not found:
        console.print(f"[yellow]Jaeger has no trace of rollout {rollout_id}[/yellow]")
        return False
    trace = found[0]
    # plain lines, never wrapped: the URLs are meant to be copied
    console.print(
        f"\n[bold]Jaeger[/bold]: failed rollout {rollout_id}, {len(trace.spans)} spans from "
        f"{len(trace.services())} services:"
    )
    console.print(f"  {jaeger.trace_url(trace.trace_id)}", soft_wrap=True, highlight=False)
    console.print("The UI's search by rollout id, as an API call:")
    console.print(f"  {jaeger.search_url(service, tags)}", soft_wrap=True, highlight=False)
    console.print(
        "(A Jaeger built from the Go module serves a placeholder page instead of the UI; "
        "these are the calls the UI makes.)"
    )
    if webview is not None:
        console.print(f"The same failed rollout {rollout_id} in the web view:")
        console.print(f"  {webview.trace_url(failed[0].trace_id)}", soft_wrap=True, highlight=False)
        console.print("and through the web view's Jaeger-compatible API:")
        console.print(
            f"  {webview.url}/api/traces/{failed[0].trace_id}", soft_wrap=True, highlight=False
        )
    return True


def _next_steps(console: Console, store_dir: Path) -> None:
    flag = "" if store_dir == default_data_dir().resolve() else f" --store-dir {store_dir}"
    console.print(
        Panel(
            "The same data, any time later (the store keeps it, bounded by age and size):\n"
            f"  uv run gym-sidecar ui{flag}   (the web view, http://127.0.0.1:16687/)\n"
            f"  uv run gym-sidecar rollouts{flag} --failed\n"
            f"  uv run gym-sidecar trace{flag} ROLLOUT_ID\n"
            f"  uv run gym-sidecar stats{flag} --since 1h\n"
            f"  uv run gym-sidecar envs{flag}   (reward, turns, tokens per environment)\n\n"
            "The same traces in Jaeger (needs Docker): docker compose up --build, then open\n"
            "http://localhost:16686 (docs/deployment.md); without Docker, against Jaeger v2\n"
            "built from source (needs Go): bash scripts/demo.sh --jaeger.\n"
            "A sidecar in front of any OTLP backend keeps the local store too with:\n"
            "  gym-sidecar run --backend URL --local-store",
            title="next",
            title_align="left",
        )
    )


def _webview_report(
    console: Console, webview: WebViewChild, store: Path, since_ns: int, *, keep: bool
) -> None:
    """The last lines: the web view's URL (and a failed rollout's page in it)."""
    window_s = (time.time_ns() - since_ns) / 1e9 + 5
    with closing(db.connect(store, readonly=True)) as conn:
        failed = queries.rollouts(conn, since_s=window_s, failed_only=True, limit=1)
    # plain lines, never wrapped: the URLs are meant to be copied
    console.print("\n[bold]Web view[/bold] (rollouts, waterfalls, stats, service map):")
    console.print(f"  {webview.url}/", soft_wrap=True, highlight=False)
    console.print("reward, turns and tokens per environment:")
    console.print(f"  {webview.url}/envs", soft_wrap=True, highlight=False)
    console.print("rollouts in flight now, stalled ones first (the sidecar's live view):")
    console.print(f"  {webview.url}/live", soft_wrap=True, highlight=False)
    if failed:
        console.print(f"a failed rollout, {failed[0].rollout_id}:")
        console.print(f"  {webview.trace_url(failed[0].trace_id)}", soft_wrap=True, highlight=False)
    if not keep:
        console.print(
            "(it stops with the demo: --keep keeps it up; `uv run gym-sidecar ui` serves the "
            "store again)"
        )


@dataclass
class _Children:
    """What the demo started, stopped in :meth:`stop`'s order."""

    jaeger: JaegerServer | None = None
    sidecar: SidecarProcess | None = None
    webview: WebViewChild | None = None
    servers: GymServers | None = None

    def stop(self) -> int | None:
        """Stop every child started; the sidecar's exit code (None: never started).

        The Gym servers first (their last spans reach the sidecar), the web view, the
        sidecar (it drains into the store and Jaeger), Jaeger last. Each is stopped even
        when stopping one before it raised."""
        sidecar_code: list[int | None] = [None]
        sidecar = self.sidecar
        with contextlib.ExitStack() as stops:  # run last-pushed first
            if self.jaeger is not None:
                stops.callback(self.jaeger.stop)
            if sidecar is not None:
                stops.callback(lambda: sidecar_code.__setitem__(0, sidecar.stop()))
            if self.webview is not None:
                stops.callback(self.webview.stop)
            if self.servers is not None:
                stops.callback(self.servers.stop)
        return sidecar_code[0]


def run_demo(opts: DemoOptions, console: Console) -> int:
    """Run every step; see the module docstring."""
    console.rule("[bold]gym-telemetry demo")
    repo = repo_root(opts.repo)
    children = _Children()
    code = 0
    try:
        python = opts.gym_python or prepare_gym_env(console, repo)
        console.print(f"Gym environment: {python}")
        config: dict[str, Any] = {
            "span_groups": {"spec": "per_rollout"},
            "metrics": {"interval_s": METRICS_INTERVAL_S},
            "log_level": "warning",
        }
        if opts.hang:
            config["rollouts"] = hang.ROLLOUTS_CONFIG
        if opts.jaeger:
            children.jaeger = start_jaeger(console, repo, opts.workdir)
            # the local store is kept (--local-store), so the tables below still print;
            # Jaeger takes traces only, so the sidecar's OTLP metrics export is refused
            config["backend"] = {"url": children.jaeger.otlp_grpc_endpoint, "protocol": "grpc"}
        opts.workdir.mkdir(parents=True, exist_ok=True)
        store_path = opts.store_dir / "traces.db"
        with console.status("Starting the sidecar (local store) and the Gym servers..."):
            # each child is kept before it starts: start() stops it itself when it fails
            # or is interrupted, and the finally below stops it once started
            sidecar = children.sidecar = SidecarProcess(
                config=config,
                log_dir=opts.workdir,
                extra_args=["--local-store", "--store-dir", str(opts.store_dir)],
                new_session=True,
            )
            sidecar.start()
            console.print(
                f"sidecar: OTLP gRPC {sidecar.grpc_endpoint}, admin {sidecar.admin_url}, "
                f"store {store_path}"
            )
            webview = children.webview = WebViewChild(
                opts.store_dir, opts.workdir, admin_url=sidecar.admin_url
            )
            webview.start()
            env = telemetry_env(sidecar.grpc_endpoint, sidecar.admin_url)
            if opts.hang:
                env.update(hang.AGENT_ENV)
            gym_config = load_configs("stack.yaml", "failing_verifier.yaml", repo=repo)
            servers = children.servers = GymServers(
                python, gym_config, list(SERVERS), env, opts.workdir / "gym", repo=repo
            )
            servers.start()
            console.print(
                "Gym servers: "
                + ", ".join(f"{name} {p.url}" for name, p in servers.processes.items())
            )
        since_ns = time.time_ns()
        outcomes = _drive(console, servers, opts)
        console.print(
            "agent /run answers: "
            + ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items()))
            + " (failing: the verifier raised on purpose, so /run answers 500)"
        )
        if any(k.startswith("ok") and k != "ok 200" for k in outcomes):
            code = 1
        with console.status("Waiting for the spans and derived metrics to reach the store..."):
            seen = _wait_for_store(store_path, since_ns, opts.rollouts, opts.wait_s)
        if seen[0] < opts.rollouts:
            console.print(f"[yellow]only {seen[0]} of {opts.rollouts} rollouts stored[/yellow]")
            code = 1
        _report(console, store_path, since_ns, opts.failing)
        if opts.hang:
            shown = hang.run_hang(
                console, servers, sidecar.admin_url, webview.url, opts.workdir / "hang-release"
            )
            code = code if shown else 1
        if children.jaeger is not None and opts.failing:
            found = _jaeger_report(
                console, children.jaeger, store_path, since_ns, opts.wait_s, webview=webview
            )
            code = code if found else 1
        _next_steps(console, opts.store_dir)
        _webview_report(console, webview, store_path, since_ns, keep=opts.keep)
        if opts.keep:
            console.print(
                "[bold]--keep:[/bold] everything keeps running; Ctrl-C (or SIGTERM, SIGHUP) "
                "stops it."
            )
            while True:
                time.sleep(3600)
    finally:
        # deferred: a signal now (a second Ctrl-C, a repeated SIGTERM) must not cut the
        # stop in two; each child's stop is bounded by its grace period instead
        with deferred():
            with console.status("Stopping the Gym servers and the sidecar..."):
                exit_code = children.stop()
            if exit_code not in (0, None):
                assert children.sidecar is not None
                console.print(
                    f"[red]sidecar exited with {exit_code}[/red]; log: {children.sidecar.log_path}"
                )
                code = 1
            else:
                console.print("stopped cleanly.")
    return code
