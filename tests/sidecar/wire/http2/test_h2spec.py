"""h2spec, the HTTP/2 conformance suite, against the gRPC listener of a real
``gym-sidecar`` process (cleartext HTTP/2 with prior knowledge, as gRPC without TLS).

h2spec v2.2.1 is built from the Go module proxy on first use (``scripts/h2spec_build.py``;
minutes cold, cached under ``~/.cache/gym-telemetry/peers/`` after) and run whole, with
``--max-header-length 250000`` so that its HEADERS frame of five dummy headers exceeds
the 1 MiB SETTINGS_MAX_FRAME_SIZE the receiver advertises (at h2spec's default of 4,000
bytes, 4.2/3 sends a frame the receiver may accept, and answers) and its CONTINUATION
test sends a header block over the receiver's bound.

Every case must pass but the gRPC-inherent ones below, each explained (the wire
package's README lists them too). Four must pass by name: the frame-size errors (4.2/2,
4.2/3: FRAME_SIZE_ERROR, RFC 9113 4.2), the PING of the wrong length (5.4.1/1) and the
oversized header block (6.10/1: the call answered before the GOAWAY): each of them used
to end in "connection reset by peer", the GOAWAY lost to a close with the client's data
unread.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sidecar_proc import SidecarProcess

pytestmark = pytest.mark.timeout(1800)  # the first run builds h2spec: minutes, cold

REPO = Path(__file__).resolve().parents[4]

INHERENT: dict[str, str] = {
    "generic/2/2": (
        "a WINDOW_UPDATE on a half-closed (remote) stream: h2spec's request (GET /, no "
        "gRPC content-type) is refused at once with a trailers-only answer (one HEADERS "
        "frame, UNIMPLEMENTED), while h2spec waits for a DATA frame"
    ),
    "generic/2/3": "the same with a PRIORITY frame: a trailers-only answer has no DATA",
    "http2/5.1.2/1": (
        "streams over SETTINGS_MAX_CONCURRENT_STREAMS: each of h2spec's requests is "
        "answered and closed as soon as its HEADERS arrive, so the open streams never "
        "exceed the limit and there is nothing to refuse"
    ),
}
"""Failures that follow from a gRPC server answering a plain HTTP request at once."""

RACY: dict[str, str] = {
    "http2/8.1/1": (
        "a second HEADERS without END_STREAM: the first HEADERS is refused (no gRPC "
        "content-type) and the stream reset (NO_ERROR, RFC 9113 8.1) before the "
        "violation arrives, unless both come in one read"
    ),
    "http2/6.9.1/3": (
        "two WINDOW_UPDATEs overflowing a stream's window after a HEADERS without "
        "END_STREAM: the same race (failed once in about 20 whole-suite runs, 2026-12-05)"
    ),
    "http2/8.1.2.1/3": "a pseudo-header in trailers: the same race",
    "http2/8.1.2.6/1": (
        "content-length unlike the one DATA frame sent: the same race (failed once in a "
        "fresh-clone CI run, 2026-12-06; passed in the 3 runs after it)"
    ),
    "http2/8.1.2.6/2": "content-length unlike the DATA sent: the same race",
}
"""Cases that pass or fail by the order in which frames are read (RFC 9113 permits both
answers): allowed to fail, not required to."""

SKIPPED: frozenset[str] = frozenset(
    {"http2/6.5.3/1", "http2/6.9.1/1", "http2/6.9.2/1", "http2/6.9.2/2"}
)
"""h2spec skips these itself: they need a response with a DATA body of some size to
GET /, which a gRPC server does not give."""

REQUIRED = ("http2/4.2/2", "http2/4.2/3", "http2/5.4.1/1", "http2/6.10/1")
SUITE_CASES = 145
"""How many cases h2spec 2.2.1 has (generic, http2 and hpack together)."""
TIMEOUT_S = 10
"""h2spec's wait for each expected frame (its default, 2 s, is short for a busy machine)."""


def h2spec_binary() -> Path:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import h2spec_build
    finally:
        sys.path.pop(0)
    path: Path = h2spec_build.ensure()
    return path


@pytest.fixture(scope="module")
def sidecar() -> Iterator[SidecarProcess]:
    with SidecarProcess() as sc:
        yield sc


def run_h2spec(port: int, report: Path, *args: str) -> dict[str, str]:
    """Run the suite; ``{case id: passed|failed|skipped}``, ids as h2spec prints them
    (``http2/4.2/2``: the second case of section 4.2)."""
    cmd = [str(h2spec_binary()), "-h", "127.0.0.1", "-p", str(port), "-o", str(TIMEOUT_S)]
    done = subprocess.run(  # exit 1 when any case fails: the report says which
        [*cmd, "-j", str(report), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    results: dict[str, str] = {}
    for suite in ET.parse(report).getroot().iter("testsuite"):
        for index, case in enumerate(suite.iter("testcase"), start=1):
            if case.find("skipped") is not None:
                outcome = "skipped"
            elif case.find("failure") is not None or case.find("error") is not None:
                outcome = "failed"
            else:
                outcome = "passed"
            results[f"{suite.get('package')}/{index}"] = outcome
    return results


def test_h2spec_passes_but_the_grpc_inherent_cases(sidecar: SidecarProcess, tmp_path: Path) -> None:
    results = run_h2spec(
        sidecar.grpc_port, tmp_path / "h2spec.xml", "--max-header-length", "250000"
    )
    assert len(results) == SUITE_CASES, sorted(results)
    failed = {case for case, outcome in results.items() if outcome == "failed"}
    assert failed - INHERENT.keys() - RACY.keys() == set()
    assert {case for case, outcome in results.items() if outcome == "skipped"} == SKIPPED
    for case in REQUIRED:
        assert results[case] == "passed", case
    assert sidecar.proc is not None and sidecar.proc.poll() is None  # still serving
    refusals = sidecar.metric("gym_sidecar_http2_refusals_total", reason="frame_too_large")
    assert refusals >= 2  # 4.2/2 and 4.2/3 reached the guard, not only h2
