"""``HOST:PORT`` strings: split and validate, join again, show the port actually bound,
and bind a listening socket to one.

Standard library only; used by the configuration (listen addresses), the listeners and
the webhook.
"""

from __future__ import annotations

import ipaddress
import socket


def split_host_port(value: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` for IPv6) and validate both parts.

    Raises ValueError with a readable message. The host is an IP address or a host name
    (never empty: all interfaces only when written so, ``0.0.0.0`` or ``[::]``); port 0
    is allowed (the OS picks one; listeners log the port actually bound).
    """
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"invalid IPv6 address in {value!r}") from None
    elif ":" in host:
        raise ValueError(f"IPv6 addresses must be bracketed, e.g. [::1]:4317; got {value!r}")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port must be an integer in 0..65535, got {port_text!r}")
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    """``HOST:PORT`` again (IPv6 bracketed), e.g. with the port a ``:0`` listener got."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bound_address(listen: str, port: int | None) -> str:
    """``listen`` with the port actually bound (what logs show: ``127.0.0.1:0`` is not
    an address anyone can connect to)."""
    if port is None:
        return listen
    return join_host_port(split_host_port(listen)[0], port)


def bind_tcp(listen: str) -> socket.socket:
    """A listening-ready TCP socket bound to ``HOST:PORT`` (IPv4, IPv6 or a host name)."""
    host, port = split_host_port(listen)
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, address = infos[0]
    sock = socket.socket(family, socktype, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {listen}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock
