"""HTML building blocks: every value from the store goes through :func:`e` (escaped for
text and for quoted attributes), so a span's name, attribute or service can never
become markup. Values longer than a page should hold are cut by :func:`clip`.

The layout links only ``/static/ui.css`` and ``/static/ui.js``; :data:`SECURITY_HEADERS`
(sent with every response) make the browser refuse anything else: inline scripts,
inline event handlers, ``javascript:`` URLs, styles or images from elsewhere, framing.
"""

from __future__ import annotations

import html
import json
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Final

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}
MAX_CELL_CHARS: Final = 200
"""Longest value shown in a table cell (the span details show up to MAX_DETAIL_CHARS)."""
MAX_DETAIL_CHARS: Final = 4000

ACTIVE: Final = ' class="active" aria-current="page"'
NAV: Final = (
    ("/rollouts", "Rollouts"),
    ("/envs", "Environments"),
    ("/live", "Live"),
    ("/stats", "Stats"),
    ("/map", "Service map"),
)


def e(value: object) -> str:
    """``value`` as text safe inside an element or a quoted attribute."""
    return html.escape(str(value), quote=True)


def clip(value: object, limit: int = MAX_CELL_CHARS) -> str:
    """Escaped ``value``, cut to ``limit`` characters with a note of how many were left."""
    text = str(value)
    if len(text) <= limit:
        return e(text)
    return f'{e(text[:limit])}<span class="cut">… ({len(text) - limit:,} more characters)</span>'


def url(path: str, params: Mapping[str, object] | None = None) -> str:
    """A same-site URL: ``path`` (its segments already quoted with :func:`seg`) plus
    the non-empty ``params``, escaped for an attribute."""
    query = {k: str(v) for k, v in (params or {}).items() if v not in (None, "", False)}
    text = path + ("?" + urllib.parse.urlencode(query) if query else "")
    return e(text)


def seg(value: str) -> str:
    """One URL path segment (every reserved character quoted)."""
    return urllib.parse.quote(value, safe="")


def table(headers: Iterable[str], rows: Iterable[str], cls: str = "") -> str:
    """A table of pre-rendered ``<tr>`` rows under escaped ``headers``."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join(rows)
    return f'<table class="{e(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def value_text(value: object) -> str:
    """An attribute value as text: JSON spelling for booleans, lists and maps."""
    if isinstance(value, (bool, list, dict)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def kv_table(items: Mapping[str, object], cls: str = "kv") -> str:
    """Keys and values (both from span data) as a two-column table, values clipped."""
    rows = "".join(
        f"<tr><th>{clip(k)}</th><td>{clip(value_text(v), MAX_DETAIL_CHARS)}</td></tr>"
        for k, v in items.items()
    )
    return f'<table class="{e(cls)}"><tbody>{rows}</tbody></table>'


def page(title: str, body: str, *, active: str = "", refresh_s: int | None = None) -> str:
    """A whole document. ``refresh_s``: without JavaScript the page reloads itself that
    often (``static/ui.js`` refreshes ``[data-refresh]`` regions in place instead)."""
    nav = "".join(
        f'<a href="{href}"{ACTIVE if href == active else ""}>{e(label)}</a>' for href, label in NAV
    )
    refresh = (
        f'<noscript><meta http-equiv="refresh" content="{int(refresh_s)}"></noscript>'
        if refresh_s
        else ""
    )
    return (
        "<!doctype html>"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · gym-telemetry</title>{refresh}"
        '<link rel="stylesheet" href="/static/ui.css">'
        '<script src="/static/ui.js" defer></script>'
        f'</head><body><header><span class="brand">gym-telemetry</span><nav>{nav}</nav>'
        f"</header><main><h1>{e(title)}</h1>{body}</main></body></html>"
    )


def fmt_ms(ms: float | None) -> str:
    """``12.3 ms`` / ``4.56 s`` (``-`` for None)."""
    if ms is None:
        return "-"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 10:
        return f"{ms:.0f} ms"
    return f"{ms:.2f} ms"
