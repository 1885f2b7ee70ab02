"""Shared helpers for the simulator tests (bounded waits, bodies, SSE parsing)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import httpx

from gateway.sim import SimCluster

TIMEOUT = httpx.Timeout(10.0, connect=5.0)


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": content}], **extra}


def long_text(words: int, seed: str = "w") -> str:
    return " ".join(f"{seed}{i % 97}x{i % 13}" for i in range(words))


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.01) -> None:
    """Poll `predicate` until true; bounded by both time and iterations."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / interval) + 1):
        if predicate():
            return
        if time.monotonic() > deadline:
            break
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def totals(cluster: SimCluster, i: int = 0) -> dict[str, Any]:
    return cluster.stats(i, records=False)["totals"]  # type: ignore[no-any-return]


def queued(cluster: SimCluster, n: int, i: int = 0) -> Callable[[], bool]:
    """A predicate: replica `i` has exactly `n` requests waiting (or deferred)."""
    return lambda: bool(totals(cluster, i)["waiting"] == n)


def records(cluster: SimCluster, i: int = 0) -> list[dict[str, Any]]:
    return cluster.stats(i)["requests"]  # type: ignore[no-any-return]


def sse_data(lines: Iterable[str]) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


def sse_json(lines: Iterable[str]) -> list[dict[str, Any]]:
    return [json.loads(d) for d in sse_data(lines) if d != "[DONE]"]


def raw_request(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    """Send a POST over a plain socket and return it unread (to close it later)."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=5)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock.sendall(head + payload)
    return sock
