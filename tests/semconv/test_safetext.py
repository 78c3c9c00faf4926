"""The one rule for untrusted text in terminal output and logs (``safetext``)."""

from __future__ import annotations

import io
import logging

from gym_telemetry_semconv.safetext import (
    CONTINUATION_PREFIX,
    ELLIPSIS,
    SafeFormatter,
    clip,
    escape_controls,
    is_control,
)


def test_every_c0_c1_and_del_is_escaped_and_nothing_else_below_0x100() -> None:
    for code in range(0x100):
        char = chr(code)
        shown = escape_controls(char)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            assert shown == f"\\x{code:02x}" and is_control(char)
        else:
            assert shown == char and not is_control(char)


def test_line_separators_and_bidi_controls_are_escaped() -> None:
    for code in (0x2028, 0x2029, 0x202A, 0x202E, 0x2066, 0x2069):
        assert escape_controls(chr(code)) == f"\\u{code:04x}"
    assert escape_controls("é 日本 ü [bold]\\x") == "é 日本 ü [bold]\\x"


def test_an_injected_sequence_stays_readable() -> None:
    text = "tool\x1b[2J\x1b]8;;http://x\x1b\\click\x07\r\nforged"
    assert escape_controls(text) == (
        "tool\\x1b[2J\\x1b]8;;http://x\\x1b\\click\\x07\\x0d\\x0aforged"
    )


def test_clip_cuts_visibly_and_never_inside_an_escape() -> None:
    assert clip("short", 5) == "short"
    assert clip("longer", 5) == "long" + ELLIPSIS
    assert len(clip("a" * 100, 10)) == 10
    # "ab\x1b" escapes to 6 characters; with a budget of 4 the escape is left out whole
    assert clip("ab\x1bcd", 5) == "ab" + ELLIPSIS
    assert clip("ab\x1bcd", 7) == "ab\\x1b" + ELLIPSIS
    assert clip("ab\x1b", 6) == "ab\\x1b"


def _format(record_msg: str, *args: object, exc: bool = False) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(SafeFormatter("%(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("tests.safetext")
    log.propagate = False
    log.addHandler(handler)
    try:
        if exc:
            try:
                raise ValueError(args[0])
            except ValueError:
                log.exception(record_msg, *args)
        else:
            log.warning(record_msg, *args)
    finally:
        log.removeHandler(handler)
    return stream.getvalue()


def test_a_client_string_cannot_start_a_log_line() -> None:
    out = _format("span %s refused", "x\x1b[2J\nWARNING forged: y\r")
    assert out == "WARNING tests.safetext: span x\\x1b[2J\\x0aWARNING forged: y\\x0d refused\n"


def test_traceback_lines_are_escaped_and_indented() -> None:
    out = _format("failed for %s", "svc\nERROR forged\x1b[5m", exc=True)
    first, *rest = out.rstrip("\n").split("\n")
    assert first == "ERROR tests.safetext: failed for svc\\x0aERROR forged\\x1b[5m"
    assert rest and all(line.startswith(CONTINUATION_PREFIX) for line in rest)
    assert "\x1b" not in out
    # the exception message's own newline became a continuation line, never a record
    assert f"{CONTINUATION_PREFIX}ERROR forged\\x1b[5m" in rest
