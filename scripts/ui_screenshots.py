"""Regenerate the web view's screenshots in docs/images/ (``make screenshots``).

Runs the demo (real Gym servers, a sidecar writing a fresh local store; first run builds
the cached Gym environment) unless ``--store-dir`` names a store that already has
rollouts, then serves that store with ``gym-sidecar ui`` and photographs each page in
Debian's Chromium (installed with apt when absent, as the browser tests do):
rollouts, failed rollouts, a failed rollout's waterfall with its failed verification's
details open, stats, the environments page (issue 41) and the service map.

    uv run --frozen python scripts/ui_screenshots.py [--store-dir DIR] [--out docs/images]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gym_telemetry_demo.procs import run_passing_signals  # noqa: E402
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store-dir", type=Path, help="photograph this store (no demo run)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ui-shots-") as tmp:
        store_dir = args.store_dir
        if store_dir is None:
            store_dir = Path(tmp) / "store"
            run_demo(store_dir, Path(tmp) / "work")
        with WebViewChild(store_dir, Path(tmp)).start(timeout_s=60) as view:
            for path in shoot(view.url, args.out):
                print(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop the demo and the web view as Ctrl-C does
