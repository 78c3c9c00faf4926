"""A TCP relay in front of the sink that counts the bytes a collector sends to it.

The collectors' exported bytes (HTTP/2 frames carrying gzip or plain protobuf) are the
honest measure of "equal output compression": spans per CPU-second only compare if the
output is about as small. ``ByteCountingRelay`` accepts on a free loopback port, opens a
connection to the sink per client connection, pumps both directions with two threads,
and counts the client-to-sink bytes (``sent``). Its CPU is spent in the harness
process, not in the collector's.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from gym_telemetry_demo.ports import free_port

_CHUNK = 256 * 1024


class ByteCountingRelay:
    """Relay ``127.0.0.1:<port>`` -> ``target`` (HOST:PORT); ``sent`` counts upstream bytes."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.sent = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> ByteCountingRelay:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()

    def __enter__(self) -> ByteCountingRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                dst.sendall(data)
                if count:
                    with self._lock:
                        self.sent += len(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
