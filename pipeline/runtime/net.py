"""Small socket helpers for local servers."""

from __future__ import annotations

import socket

__all__ = ["free_port", "free_port_or", "port_open"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the system picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_port_or(preferred: int, host: str = "127.0.0.1") -> int:
    """``preferred`` if it is free, else a free port the system picks."""
    with socket.socket() as sock:
        try:
            sock.bind((host, preferred))
            return preferred
        except OSError:
            return free_port(host)


def port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False
