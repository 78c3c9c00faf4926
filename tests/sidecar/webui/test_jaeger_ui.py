"""``gym-sidecar ui --jaeger-ui DIR`` over real HTTP, with a UI directory made here
holding the markers a built Jaeger UI's ``index.html`` leaves for its server (both
lines'): index rewriting (base path, capabilities, version), the pages' CSP, assets,
page routes, the API under ``/jaeger/api``, and a directory that is no UI.

The real Jaeger UI of both lines, built from its repository and driven in Chromium:
tests/sidecar/webui/test_real_jaeger_ui.py (docs/testing.md)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gym_sidecar.webui.app import ViewConfig
from gym_sidecar.webui.jaeger_ui import CAPABILITIES, JaegerUi, JaegerUiError

from tests.sidecar.webui.data import AGENT, gym_trace, request, write
from tests.sidecar.webui.serve import get, serve

INLINE = """
      function getJaegerBackendCapabilities() {
        const DEFAULT_BACKEND_CAPABILITIES = { archiveStorage: false, metricsStorage: false };
        const JAEGER_BACKEND_CAPABILITIES = DEFAULT_BACKEND_CAPABILITIES;
        return JAEGER_BACKEND_CAPABILITIES;
      }
      function getJaegerStorageCapabilities() {
        const DEFAULT_STORAGE_CAPABILITIES = { "archiveStorage": false };
        const JAEGER_STORAGE_CAPABILITIES   =  DEFAULT_STORAGE_CAPABILITIES;
        return JAEGER_STORAGE_CAPABILITIES;
      }
      function getJaegerVersion() {
        const DEFAULT_VERSION = {'gitCommit':'', 'gitVersion':'', 'buildDate':''};
        const JAEGER_VERSION = DEFAULT_VERSION;
        return JAEGER_VERSION;
      }
"""
INDEX = f"""<!doctype html><html><head>
<base href="/" data-inject-target="BASE_URL" />
<script>{INLINE}</script>
<script type="module" crossorigin src="./static/app.js"></script>
<script nomodule id="legacy" data-src="./static/legacy.js">System.import('x')</script>
</head><body><div id="root"></div></body></html>"""


@pytest.fixture
def ui_dir(tmp_path: Path) -> Path:
    root = tmp_path / "build"
    (root / "static").mkdir(parents=True)
    (root / "index.html").write_text(INDEX)
    (root / "static" / "app.js").write_text("console.log('app');\n")
    (tmp_path / "secret.txt").write_text("not served")
    return root


def _sha(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


def test_index_is_rewritten_as_jaegers_query_service_does(ui_dir: Path, tmp_path: Path) -> None:
    tid, specs = gym_trace("0-0", 1_700_000_000_000_000_000)
    write(tmp_path / "traces.db", [request(tid, specs)])
    with serve(ViewConfig(tmp_path / "traces.db", jaeger_ui=JaegerUi(ui_dir))) as url:
        redirect = get(url + "/jaeger")
        assert redirect.status == 200 and "JAEGER_BACKEND_CAPABILITIES = {" in redirect.text
        for path in (
            "/jaeger/",
            "/jaeger/search?service=x",
            "/jaeger/trace/abc",
            "/jaeger/monitor",
        ):
            page = get(url + path)
            assert page.status == 200 and page.headers["content-type"].startswith("text/html")
            html = page.text
            assert '<base href="/jaeger/"' in html
            caps = re.search(r"JAEGER_BACKEND_CAPABILITIES = (\{.*?\});", html)
            assert caps is not None and json.loads(caps.group(1)) == CAPABILITIES
            assert CAPABILITIES["metricsStorage"] and CAPABILITIES["searchWithoutServiceName"]
            storage = re.search(r"JAEGER_STORAGE_CAPABILITIES = (\{.*?\});", html)
            assert storage is not None
            assert json.loads(storage.group(1)) == {"archiveStorage": False, "metricsStorage": True}
            version = re.search(r"JAEGER_VERSION = (\{.*?\});", html)
            assert version is not None
            assert json.loads(version.group(1))["gitVersion"].startswith("gym-sidecar")
            # the CSP allows exactly the served inline scripts
            csp = page.headers["content-security-policy"]
            inline = re.findall(r"<script(?![^>]*\ssrc=)[^>]*>(.*?)</script>", html, re.S)
            assert len(inline) == 2
            for script in inline:
                assert _sha(script) in csp
            assert _sha(INLINE) not in csp  # the unrewritten script is not allowed
            assert "'unsafe-eval'" not in csp.replace("'wasm-unsafe-eval'", "")
            assert "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
        asset = get(url + "/jaeger/static/app.js")
        assert asset.status == 200 and asset.text == "console.log('app');\n"
        assert "javascript" in asset.headers["content-type"]
        assert "content-security-policy" in asset.headers
        # outside the directory: not served (a page of the UI instead)
        for path in (
            "/jaeger/../secret.txt",
            "/jaeger/%2e%2e/secret.txt",
            "/jaeger/static/../../secret.txt",
        ):
            assert "not served" not in get(url + path).text
        # the API of both lines under the UI's base path, as at /api
        for path in ("/api/services", "/api/v3/services", f"/api/traces/{tid.hex()}"):
            ours, theirs = get(url + "/jaeger" + path), get(url + path)
            assert ours.status == 200 and ours.json() == theirs.json()
        assert AGENT in get(url + "/jaeger/api/v3/services").json()["services"]
        missing = get(url + "/jaeger/api/nothing")
        assert missing.status == 404 and missing.json()["errors"][0]["code"] == 404
        # the web view itself is untouched
        assert get(url + "/rollouts").status == 200
        assert get(url + "/static/ui.js").status == 200


def test_no_jaeger_ui_no_jaeger_routes(tmp_path: Path) -> None:
    write(tmp_path / "traces.db", [])
    with serve(ViewConfig(tmp_path / "traces.db")) as url:
        assert get(url + "/jaeger/search").status == 404
        assert get(url + "/jaeger/api/services").status == 404


def test_a_directory_that_is_no_ui_is_refused(tmp_path: Path) -> None:
    with pytest.raises(JaegerUiError, match="no index\\.html"):
        JaegerUi(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "gym_sidecar.cli", "ui", "--store-dir", str(tmp_path),
         "--jaeger-ui", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "--jaeger-ui" in done.stderr and "no index.html" in done.stderr
