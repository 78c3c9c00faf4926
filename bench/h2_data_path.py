"""The gRPC client's DATA path: ``h2``'s public one against the sidecar's copy-free one
(a benchmark harness; it asserts nothing).

    uv run --frozen python -m bench.h2_data_path [--body-kib 1024] [--frame-kib 16]
        [--repeats 7] [--rounds 200]

Both send one body of ``--body-kib`` on one stream, as the exporter sends a batch, to a
peer whose SETTINGS_MAX_FRAME_SIZE is ``--frame-kib`` (16 KiB is every gRPC server's
default), and hand the bytes to write out of the connection; no socket:

- ``public``: ``h2``'s own way: ``send_data`` of frame-sized slices of the body (more
  raises FrameTooLargeError), then ``data_to_send()``: one flat buffer, the body
  copied on the way (slicing, hyperframe's serialisation, ``h2``'s output buffer,
  ``data_to_send``);
- ``copy-free``: :class:`gym_sidecar.wire.http2.connection.H2Connection`'s
  ``send_data_unsplit`` then ``take()``: 9-byte headers and memoryviews of the body,
  through the override of ``h2``'s private ``_prepare_for_sending``.

Printed: CPU µs per MiB sent (process time, the best of ``--repeats`` runs of
``--rounds`` bodies each, one stream per body on one connection set up untimed) and the
ratio, and the bytes each hands over (must be equal).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
from gym_sidecar.wire.http2.connection import H2Connection

HEADERS = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/opentelemetry.proto.collector.trace.v1.TraceService/Export"),
    (b":authority", b"127.0.0.1:4317"),
    (b"content-type", b"application/grpc"),
]
WINDOW = 2**31 - 1


def _connected(conn: h2.connection.H2Connection, frame_bytes: int) -> None:
    """``conn`` (a client) as after the server's SETTINGS: its frame size, open windows,
    no stream limit."""
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    server.initiate_connection()
    server.update_settings(
        {
            h2.settings.SettingCodes.MAX_FRAME_SIZE: frame_bytes,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 2**31 - 1,
        }
    )
    server.increment_flow_control_window(WINDOW - 65535)
    conn.initiate_connection()
    server.receive_data(conn.data_to_send())
    conn.receive_data(server.data_to_send())


def public(conn: h2.connection.H2Connection, body: bytes, frame_bytes: int) -> int:
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, HEADERS)
    view = memoryview(body)
    for start in range(0, len(body), frame_bytes):
        chunk = view[start : start + frame_bytes]
        conn.send_data(stream, chunk, end_stream=start + frame_bytes >= len(body))
    return len(conn.data_to_send())


def copy_free(conn: h2.connection.H2Connection, body: bytes, frame_bytes: int) -> int:
    assert isinstance(conn, H2Connection)
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, HEADERS)
    conn.send_data_unsplit(stream, body, end_stream=True)
    return sum(len(piece) for piece in conn.take())


def _public_conn() -> h2.connection.H2Connection:
    return h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )


def _copy_free_conn() -> h2.connection.H2Connection:
    return H2Connection.for_grpc(client_side=True)


Send = Callable[[h2.connection.H2Connection, bytes, int], int]
Make = Callable[[], h2.connection.H2Connection]


def _ready(make: Make, frame: int) -> h2.connection.H2Connection:
    """A connected client from ``make``, its set-up output taken."""
    conn = make()
    _connected(conn, frame)
    if isinstance(conn, H2Connection):
        conn.take()
    else:
        conn.data_to_send()
    return conn


def _best_us(make: Make, send: Send, body: bytes, frame: int, args: Any) -> float:
    """The best of ``repeats`` runs: CPU time per body sent (one stream each), one
    connection per run (set up outside the timing)."""
    best = float("inf")
    for _ in range(args.repeats):
        conn = _ready(make, frame)
        start = time.process_time()
        for _ in range(args.rounds):
            send(conn, body, frame)
        best = min(best, time.process_time() - start)
    return best / args.rounds * 1e6


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--body-kib", type=int, default=1024)
    p.add_argument("--frame-kib", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rounds", type=int, default=200)
    args = p.parse_args(argv)
    body = os.urandom(args.body_kib * 1024)
    frame = args.frame_kib * 1024
    sizes = {
        send(_ready(make, frame), body, frame)
        for make, send in ((_public_conn, public), (_copy_free_conn, copy_free))
    }
    print(f"load average {os.getloadavg()}; body {args.body_kib} KiB, frames {frame} B")
    print(f"bytes handed over: {sorted(sizes)} (equal: {len(sizes) == 1})")
    mib = args.body_kib / 1024
    pub = _best_us(_public_conn, public, body, frame, args) / mib
    free = _best_us(_copy_free_conn, copy_free, body, frame, args) / mib
    print(f"public (send_data + data_to_send): {pub:.0f} µs CPU per MiB")
    print(f"copy-free (send_data_unsplit + take): {free:.0f} µs CPU per MiB")
    print(f"public / copy-free: {pub / free:.2f}x")


if __name__ == "__main__":
    main()
