"""Regenerate the web view's screenshots in docs/images/ (``make screenshots``).

Runs the demo (real Gym servers, a sidecar writing a fresh local store; first run builds
the cached Gym environment) unless ``--store-dir`` names a store that already has
rollouts, then serves that store with ``gym-sidecar ui`` and photographs each page in
Debian's Chromium (installed with apt when absent, as the browser tests do):
rollouts, failed rollouts, a failed rollout's waterfall with its failed verification's
details open, stats, the environments page (issue 41) and the service map. Then the live
page (``webview-live.png``) over a live scene of its own: real Gym servers with the agent
sending to a sidecar with short thresholds, one rollout lost (its agent server killed),
one stalled at a model call that hangs, two running (``--no-live`` skips it).

    uv run --frozen python scripts/ui_screenshots.py [--store-dir DIR] [--out docs/images]
        [--no-live]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gym_sidecar.inspect.render import make_console  # noqa: E402
from gym_telemetry_demo import hang  # noqa: E402
from gym_telemetry_demo.gym_servers import (  # noqa: E402
    AGENT,
    FAILING_AGENT,
    SERVERS,
    GymServers,
    load_configs,
    telemetry_env,
)
from gym_telemetry_demo.procs import run_passing_signals  # noqa: E402
from gym_telemetry_demo.run import prepare_gym_env  # noqa: E402
from gym_telemetry_demo.sidecar import SidecarProcess  # noqa: E402
from gym_telemetry_demo.stopsignals import run_main  # noqa: E402
from gym_telemetry_demo.webview import WebViewChild  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from tests.support.browser import launch  # noqa: E402

VIEWPORT = {"width": 1400, "height": 900}


def run_demo(store_dir: Path, workdir: Path) -> None:
    cmd = [
        "bash",
        str(REPO / "scripts" / "demo.sh"),
        "--rollouts",
        "30",
        "--failing",
        "3",
        "--concurrency",
        "6",
        "--store-dir",
        str(store_dir),
        "--workdir",
        str(workdir),
    ]
    print("ui_screenshots: running the demo for a store to photograph...", file=sys.stderr)
    # a stop signal sent to this script is passed on: the demo stops what it started
    done = run_passing_signals(cmd, grace_s=120, capture=True)
    if done.returncode != 0:
        raise SystemExit(f"ui_screenshots: the demo failed ({done.returncode}):\n{done.stdout}")


def shoot(base: str, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
        page.set_default_timeout(60_000)

        def snap(name: str, path: str, full: bool = True) -> None:
            page.goto(base + path)
            target = out / f"webview-{name}.png"
            page.screenshot(path=str(target), full_page=full)
            written.append(target)

        snap("rollouts", "/rollouts")
        snap("rollouts-failed", "/rollouts?failed=1")
        page.goto(base + "/rollouts?failed=1")
        href = page.locator("[data-testid=rollout-row] a").first.get_attribute("href")
        page.goto(base + str(href))
        page.locator("details[data-name='gym.verify'] summary").click()
        target = out / "webview-trace.png"
        page.screenshot(path=str(target), full_page=True)
        written.append(target)
        snap("stats", "/stats")
        snap("envs", "/envs")
        snap("map", "/map")
        browser.close()
    return written


LIVE_STALL_S = 15.0
LIVE_LOST_S = 5.0


def shoot_live(out: Path, tmp: Path) -> Path:
    """``webview-live.png``: the /live page over the live scene (module docstring)."""
    python = prepare_gym_env(make_console(), REPO)
    (tmp / "live").mkdir(parents=True, exist_ok=True)
    release = tmp / "release-the-hangs"
    marker = f"WAIT_FILE:{release}"
    rollouts = {"stall_after_s": LIVE_STALL_S, "lost_after_s": LIVE_LOST_S}
    config = {"rollouts": {**rollouts, "check_interval_s": 0.5}, "log_level": "warning"}
    with SidecarProcess(config=config, log_dir=tmp / "live") as sc:
        env = {**telemetry_env(sc.grpc_endpoint, sc.admin_url), **hang.AGENT_ENV}
        configs = load_configs("stack.yaml", "failing_verifier.yaml", repo=REPO)
        servers = GymServers(python, configs, list(SERVERS), env, tmp / "live" / "gym", repo=REPO)
        with servers:
            try:
                # a rollout of the failing agent, then that agent killed: lost
                hang.start_hung_rollout(servers.url(FAILING_AGENT), 7, marker)
                found = hang.wait_view(sc.admin_url, lambda v: next(iter(v.in_flight), None))
                assert found is not None, "no rollout in flight"
                process = servers.processes[FAILING_AGENT].proc
                assert process is not None
                process.kill()
                # one that hangs at its model call until it stalls
                hang.start_hung_rollout(servers.url(AGENT), 12, marker)
                assert hang.wait_view(sc.admin_url, hang.lost_rollout(found.trace_id))
                assert hang.wait_view(sc.admin_url, hang.stalled_on(AGENT))
                # two that just started: running
                for index in (13, 14):
                    hang.start_hung_rollout(servers.url(AGENT), index, marker)
                assert hang.wait_view(
                    sc.admin_url,
                    lambda v: v.in_flight[-1] if v.in_flight_total == 3 else None,
                )
                with (
                    WebViewChild(tmp / "store", tmp / "live", admin_url=sc.admin_url).start(
                        timeout_s=60
                    ) as view,
                    sync_playwright() as p,
                ):
                    browser = launch(p)
                    page = browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
                    page.goto(view.url + "/live")
                    page.locator("details summary").click()  # the instances, unfolded
                    target = out / "webview-live.png"
                    page.screenshot(path=str(target), full_page=True)
                    browser.close()
            finally:
                release.touch()
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store-dir", type=Path, help="photograph this store (no demo run)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    parser.add_argument("--no-live", action="store_true", help="skip the live page's scene")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ui-shots-") as tmp:
        store_dir = args.store_dir
        if store_dir is None:
            store_dir = Path(tmp) / "store"
            run_demo(store_dir, Path(tmp) / "work")
        with WebViewChild(store_dir, Path(tmp)).start(timeout_s=60) as view:
            written = shoot(view.url, args.out)
        if not args.no_live:
            written.append(shoot_live(args.out, Path(tmp)))
        for path in written:
            print(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop the demo and the web view as Ctrl-C does
