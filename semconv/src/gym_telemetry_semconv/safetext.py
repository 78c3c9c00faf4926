"""Untrusted text made safe for a terminal or a log line: the one rule both programs use.

Span names, attribute values, service names, status messages, request paths and a
backend's error messages are chosen by whoever can reach a port. Printed raw, their
control characters act on the operator's terminal (``ESC[2J`` clears it, an OSC 8
sequence plants a hyperlink whose visible text lies about its target, a carriage return
or backspace overwrites what was printed, a newline forges a table row or a log record).

``escape_controls(text)`` replaces every such character by a visible escape and leaves
all other text as it is, so the value stays readable and searchable:

- C0 controls U+0000-U+001F (NUL, BEL, BS, TAB, LF, CR, ESC, ...), DEL U+007F and the C1
  controls U+0080-U+009F (CSI U+009B, OSC U+009D, ...) become ``\\xNN``;
- the Unicode line and paragraph separators U+2028/U+2029 and the bidirectional
  embedding, override and isolate controls U+202A-U+202E, U+2066-U+2069 (which reorder
  what a terminal shows) become ``\\uNNNN``.

A backslash is left alone: the rule is about what a terminal does, not about a reversible
encoding. ``clip(text, max_chars)`` escapes and then cuts a value longer than
``max_chars`` visibly, ending it with ``…``, never inside an escape.

``SafeFormatter`` is a ``logging.Formatter`` whose records cannot carry control
characters: the message is escaped whole (a newline in it is ``\\x0a``, so one record is
one line), and the lines of a traceback or stack, escaped too, are indented with
``"  | "``, so a line that starts in column 0 is always a new record.

Standard library only.
"""

from __future__ import annotations

import logging
from typing import Final

ELLIPSIS: Final = "…"

_UNICODE_CONTROLS: Final = (0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_TABLE: Final[dict[int, str]] = {
    **{c: f"\\x{c:02x}" for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))},
    **{c: f"\\u{c:04x}" for c in _UNICODE_CONTROLS},
}
CONTINUATION_PREFIX: Final = "  | "
"""What each line of a traceback or stack after a log record's first line starts with."""


def is_control(char: str) -> bool:
    """Whether ``escape_controls`` replaces this one character."""
    return ord(char) in _TABLE


def escape_controls(text: str) -> str:
    """``text`` with every control character shown as a visible escape (module doc)."""
    return text.translate(_TABLE)


def clip(text: str, max_chars: int) -> str:
    """``escape_controls(text)``, cut to at most ``max_chars`` (>= 1) characters with a
    trailing ``…`` when it is longer; an escape is kept whole or left out."""
    out = escape_controls(text)
    if len(out) <= max_chars:
        return out
    budget = max(0, max_chars - len(ELLIPSIS))
    parts: list[str] = []
    used = 0
    for char in text:
        shown = _TABLE.get(ord(char), char)
        if used + len(shown) > budget:
            break
        parts.append(shown)
        used += len(shown)
    return "".join(parts) + ELLIPSIS


class SafeFormatter(logging.Formatter):
    """A ``logging.Formatter`` that escapes control characters (module doc). Thread-safe
    like its base; the record's ``message`` attribute holds the escaped text afterwards."""

    def format(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.getMessage())
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        blocks = [record.exc_text] if record.exc_text else []
        if record.stack_info:
            blocks.append(self.formatStack(record.stack_info))
        # the template's own text is code; only what it quotes is untrusted, but the
        # result is escaped whole so that a field such as %(name)s cannot slip past
        out = [escape_controls(line)]
        for block in blocks:
            out.extend(CONTINUATION_PREFIX + escape_controls(part) for part in block.split("\n"))
        return "\n".join(out)
