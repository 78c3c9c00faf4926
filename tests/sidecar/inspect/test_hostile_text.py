"""Hostile span data through a real sidecar reaches no terminal raw (issue 29).

One rollout is sent over OTLP/HTTP JSON to a ``gym-sidecar run`` writing its local store.
Its service name, span names, rollout id, attributes and status message carry terminal
control sequences: clear screen, an OSC 8 hyperlink, blink, BEL, backspaces, a bare
carriage return, a newline that would forge a row, NUL, DEL, the C1 CSI and a bidi
override. Then every inspection command runs as a process, once with its output in a file
and once under a pseudo-terminal (``pty``, 200 columns, where rich writes its own colours):

- in a file, not one control character but the line feeds;
- on the terminal, no escape sequence but rich's own SGR colour codes, no BEL, BS, NUL,
  DEL, C1 or bidi control, and every CR is part of the terminal's CR LF;
- the text is still there, readable and findable: each value's marker word (``NSVC``,
  ``NSPAN``, ...) is printed, and the escapes show as ``\\x1b[2J`` and the like.

``check-config`` is checked the same way on a config holding such values, valid and
invalid, and the sidecar's own log (at debug level, quoting a hostile request path)
holds one line per record.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
import yaml

from tests.support.sidecar_proc import SidecarProcess

CLEAR = "\x1b[2J"
LINK = "\x1b]8;;mailto:ops@elsewhere.invalid\x1b\\"  # no "/": services show after the last one
BLINK = "\x1b[5m"
BEL = "\x07"
BACKSPACES = "\x08\x08\x08"
CR = "\r"
LF = "\n"
CSI_C1 = "\x9b2J"
BIDI = "\u202e"
ALL = CLEAR + LINK + "shown" + BLINK + BEL + BACKSPACES + CR + CSI_C1 + BIDI + "\x7f"


def hostile(marker: str) -> str:
    """A value starting with ``marker`` followed by every injected sequence."""
    return f"{marker}{ALL}{LF}│ forged │"


SERVICE = hostile("NSVC")
ROLLOUT_ID = hostile("NROLL")
SPAN_NAME = hostile("NSPAN")
ROUTE = hostile("NROUTE") + "\x00"
STATUS_MESSAGE = hostile("NSTATUS")
ERROR_TYPE = hostile("NERR")
MARKERS = ("NSVC", "NROLL", "NSPAN", "NROUTE", "NSTATUS", "NERR")
TRACE_ID = "5eed" * 8
SGR = re.compile(r"\x1b\[[0-9;]*m")
CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def _span(span_id: str, parent: str, name: str, start: int, **extra: Any) -> dict[str, Any]:
    return {
        "traceId": TRACE_ID,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": 2,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + 20_000_000),
        **extra,
    }


def _request(start: int) -> dict[str, Any]:
    """One rollout: a server span, its gym.rollout span and a failed gym.verify span."""
    scopes = [
        (
            semconv.GROUP_SERVER,
            _span(
                "0000000000000001",
                "",
                SPAN_NAME,
                start,
                attributes=[_attr(semconv.HTTP_ROUTE, ROUTE)],
            ),
        ),
        (
            semconv.GROUP_ROLLOUT,
            _span(
                "0000000000000002",
                "0000000000000001",
                semconv.SPAN_ROLLOUT,
                start + 1_000,
                attributes=[_attr(semconv.ROLLOUT_ID, ROLLOUT_ID)],
                status={"code": 2, "message": STATUS_MESSAGE},
            ),
        ),
        (
            semconv.GROUP_VERIFY,
            _span(
                "0000000000000003",
                "0000000000000002",
                semconv.SPAN_VERIFY,
                start + 2_000,
                attributes=[
                    _attr(semconv.ROLLOUT_ID, ROLLOUT_ID),
                    _attr(semconv.VERIFY_SUCCEEDED, False),
                    _attr(semconv.ERROR_TYPE, ERROR_TYPE),
                ],
                status={"code": 2, "message": STATUS_MESSAGE},
            ),
        ),
    ]
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [_attr(semconv.SERVICE_NAME, SERVICE)]},
                "scopeSpans": [
                    {"scope": {"name": semconv.scope_name(group)}, "spans": [span]}
                    for group, span in scopes
                ],
            }
        ]
    }


def _post(url: str, body: bytes, content_type: str = "application/json") -> int:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)


@dataclass
class Store:
    config: Path
    log: str


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    workdir = tmp_path_factory.mktemp("hostile")
    sidecar = SidecarProcess(
        config={
            "local_store": {"data_dir": str(workdir / "store")},
            "span_groups": {"spec": "per_rollout"},  # keep the verify span
            "log_level": "debug",
        },
        log_dir=workdir,
    ).start()
    try:
        body = json.dumps(_request(time.time_ns() - 60 * 1_000_000_000)).encode()
        assert _post(sidecar.http_url + "/v1/traces", body) == 200
        # a client-chosen path the receiver refuses and logs (percent-decoded: ESC, LF)
        forged = "%1b%5b2J%0a2026-01-01 00:00:00,000 ERROR gym_sidecar: NPATH forged"
        assert _post(sidecar.http_url + "/v1/" + forged.replace(" ", "%20"), b"{}") == 404
        deadline = time.monotonic() + 120  # generous: a loaded machine writes slowly
        while time.monotonic() < deadline:
            if sidecar.metric("gym_sidecar_store_written_items_total", signal="traces") >= 3:
                break
            time.sleep(0.1)
        assert sidecar.metric("gym_sidecar_store_written_items_total", signal="traces") >= 3
    finally:
        assert sidecar.stop() == 0
    assert sidecar.config_path is not None
    yield Store(sidecar.config_path, sidecar.log_text())


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GYM_SIDECAR_", "NO_COLOR"))}
    env.update({"TERM": "xterm-256color", "COLUMNS": "200", "LINES": "50"})
    env.pop("FORCE_COLOR", None)
    return env


def to_file(args: list[str], path: Path) -> tuple[int, str]:
    """Run ``gym-sidecar ARGS`` with stdout and stderr in ``path``; (exit code, text)."""
    with path.open("wb") as out:
        code = subprocess.run(
            [sys.executable, "-m", "gym_sidecar.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
            timeout=120,
            check=False,
        ).returncode
    return code, path.read_bytes().decode("utf-8")


def on_pty(args: list[str]) -> tuple[int, str]:
    """Run ``gym-sidecar ARGS`` with a 200x50 pseudo-terminal as stdin, stdout, stderr."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gym_sidecar.cli", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=_env(),
            start_new_session=True,
        )
    finally:
        os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, b"".join(chunks).decode("utf-8")


def assert_clean_file(text: str) -> None:
    found = sorted({repr(c) for c in CONTROLS.findall(text)})
    assert not found, f"control characters in the file output: {found}\n{text}"


def assert_clean_terminal(text: str) -> None:
    assert SGR.search(text), f"no colour at all: not rich's terminal path\n{text!r}"
    rest = SGR.sub("", text).replace("\r\n", "\n")
    found = sorted({repr(c) for c in CONTROLS.findall(rest)})
    assert not found, f"on the terminal beyond rich's SGR and CR LF: {found}\n{text!r}"


def assert_findable(text: str, markers: tuple[str, ...]) -> None:
    plain = SGR.sub("", text)
    missing = [m for m in markers if m not in plain]
    assert not missing, f"markers not printed: {missing}\n{plain}"
    assert "\\x1b[2J" in plain, plain  # the escape is shown, visibly
    # the newline stayed in its cell: no line of its own starting with the forged row
    assert not any(line.startswith("│ forged") for line in plain.splitlines()), plain


COMMANDS: dict[str, list[str]] = {
    "rollouts": ["rollouts"],
    "rollouts --failed": ["rollouts", "--failed"],
    "rollouts --service": ["rollouts", "--service", "NSVC"],
    "rollouts --slowest": ["rollouts", "--slowest", "5"],
    "trace ROLLOUT_ID": ["trace", ROLLOUT_ID],
    "trace TRACE_ID": ["trace", TRACE_ID[:16]],
    "stats": ["stats"],
}
SHOWN: dict[str, tuple[str, ...]] = {
    "rollouts": ("NROLL", "NSVC"),
    "rollouts --failed": ("NROLL", "NSVC"),
    "rollouts --service": ("NROLL", "NSVC"),
    "rollouts --slowest": ("NROLL", "NSVC"),
    "trace ROLLOUT_ID": MARKERS,
    "trace TRACE_ID": MARKERS,
    "stats": (),
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_inspection_commands_escape_hostile_text(store: Store, name: str, tmp_path: Path) -> None:
    args = [*COMMANDS[name], "--config", str(store.config)]
    code, text = to_file(args, tmp_path / "out.txt")
    assert code == 0, text
    assert_clean_file(text)
    code, tty = on_pty(args)
    assert code == 0, tty
    assert_clean_terminal(tty)
    if SHOWN[name]:
        assert_findable(text, SHOWN[name])
        assert_findable(tty, SHOWN[name])
    else:
        assert "rollout duration" in text and "verify duration" in SGR.sub("", tty)


def test_unknown_hostile_id_is_echoed_escaped(store: Store, tmp_path: Path) -> None:
    args = ["trace", hostile("NUNKNOWN"), "--config", str(store.config)]
    code, text = to_file(args, tmp_path / "out.txt")
    assert code == 1
    assert_clean_file(text)
    assert "NUNKNOWN" in text
    code, tty = on_pty(args)
    assert code == 1
    assert_clean_terminal(tty)


def test_check_config_escapes_values_and_keys(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"enrich": {"attributes": {"team": hostile("NTEAM")}}}))
    code, text = to_file(["check-config", str(good)], tmp_path / "good.txt")
    assert code == 0, text
    assert_clean_file(text)
    assert "NTEAM" in text and "\\e[2J" in text  # YAML's own escape, in a quoted scalar
    code, tty = on_pty(["check-config", str(good)])
    assert code == 0, tty
    assert_clean_file(tty.replace("\r\n", "\n"))  # check-config writes no colour

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({hostile("NKEY"): 1, "log_level": hostile("NLEVEL")}))
    code, text = to_file(["check-config", str(bad)], tmp_path / "bad.txt")
    assert code == 2, text
    assert_clean_file(text)
    assert "NKEY" in text and "\\x1b[2J" in text
    # one line per error: the forged row stays inside its error's line
    assert not any(line.startswith("│ forged") for line in text.splitlines()), text
    code, tty = on_pty(["check-config", str(bad)])
    assert code == 2, tty
    assert_clean_file(tty.replace("\r\n", "\n"))


def test_sidecar_log_quotes_a_hostile_path_on_one_line(store: Store) -> None:
    lines = store.log.splitlines()
    quoting = [line for line in lines if "NPATH" in line]
    assert quoting, store.log  # the refusal was logged (debug), with the path
    assert_clean_file(store.log)
    record = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
    for line in quoting:
        assert record.match(line), line
        assert "\\x1b[2J\\x0a2026-01-01" in line, line
    # the forged timestamp never starts a line of its own
    assert not any(line.startswith("2026-01-01 00:00:00,000") for line in lines), store.log
