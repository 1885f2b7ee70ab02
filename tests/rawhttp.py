"""A raw HTTP/1.1 client over a plain socket, for cancellation tests and the
cancel benchmark: it closes the connection at an exact moment and records
when (`time.time()`, comparable with the simulator's `abort_wall`)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit


class RawRequest:
    """POST `body` as JSON; read as much as wanted; close whenever."""

    def __init__(
        self,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        parts = urlsplit(url)
        data = json.dumps(body).encode()
        lines = [
            f"POST {parts.path} HTTP/1.1",
            f"Host: {parts.netloc}",
            "Content-Type: application/json",
            f"Content-Length: {len(data)}",
        ]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.sock = socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 80), timeout=timeout
        )
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
        self.received = b""
        self.closed_wall: float | None = None

    def read_until(self, marker: bytes, count: int = 1, timeout: float = 30.0) -> bytes:
        """Read until `marker` was seen `count` times (or the peer closed)."""
        end = time.monotonic() + timeout
        while self.received.count(marker) < count:
            self.sock.settimeout(max(0.01, end - time.monotonic()))
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.received += chunk
        return self.received

    def read_all(self, timeout: float = 30.0) -> bytes:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.sock.settimeout(max(0.01, end - time.monotonic()))
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.received += chunk
        return self.received

    @property
    def status(self) -> int | None:
        head = self.received.split(b"\r\n", 1)[0]
        return int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else None

    def close(self) -> float:
        """Close the connection; returns the wall time of the close."""
        self.closed_wall = time.time()
        self.sock.close()
        return self.closed_wall
