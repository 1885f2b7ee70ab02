"""What a client disconnect does to a running llama-server (b11434) request.

Findings pinned here (see golden/NOTES.md): a streaming request is cancelled within
milliseconds; a non-streaming one only when the HTTP thread waiting for it sees 1 s with no
result for *any* task on the server - another active stream (or fast /slots or /metrics
polling) keeps it generating to the end.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from .llamaserver import LlamaServer

pytestmark = [pytest.mark.engine]

N_PREDICT = 2000
LONG: dict[str, Any] = {"prompt": "Once upon a time", "n_predict": N_PREDICT, "ignore_eos": True}


def _raw_post(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def _busy(url: str) -> list[int]:
    return [s["id"] for s in httpx.get(f"{url}/slots").json() if s["is_processing"]]


def _predicted(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total "):
            return float(line.split()[1])
    raise AssertionError("llamacpp:tokens_predicted_total missing")


def _wait_busy(url: str, n: int = 1) -> None:
    for _ in range(500):
        if len(_busy(url)) >= n:
            return
        time.sleep(0.01)
    pytest.fail(f"{url}: fewer than {n} slots became busy")


def test_stream_disconnect_frees_slot_fast(
    llama_server: str, llama_reset: Callable[..., None]
) -> None:
    before = _predicted(llama_server)
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", f"{llama_server}/completion", json={**LONG, "stream": True}) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
        t0 = time.monotonic()  # leaving the block closed the connection
    while _busy(llama_server):
        assert time.monotonic() - t0 < 3.0, "streaming request not cancelled within 3 s"
        time.sleep(0.02)
    assert _predicted(llama_server) - before < N_PREDICT / 4


def test_non_stream_disconnect_freed_when_server_quiet(
    start_llama_server: Callable[..., LlamaServer],
) -> None:
    server = start_llama_server()  # private: no other traffic may wake its HTTP threads
    sock = _raw_post(server.url, "/completion", LONG)
    _wait_busy(server.url)
    time.sleep(0.5)
    sock.close()
    time.sleep(3.0)  # no polling meanwhile: the 1 s wait must time out to notice the close
    assert _busy(server.url) == []
    assert _predicted(server.url) < N_PREDICT / 2


def test_non_stream_disconnect_not_cancelled_while_another_stream_runs(
    start_llama_server: Callable[..., LlamaServer],
) -> None:
    server = start_llama_server()
    stream = _raw_post(server.url, "/completion", {**LONG, "prompt": "Hi", "stream": True})
    drained = threading.Event()

    def drain() -> None:
        with contextlib.suppress(OSError):
            while stream.recv(65536):
                pass
        drained.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    _wait_busy(server.url)
    plain = _raw_post(server.url, "/completion", LONG)
    _wait_busy(server.url, 2)
    plain.close()
    time.sleep(3.0)
    still_busy = _busy(server.url)
    # end the stream: once the server is quiet the closed non-stream request is cancelled
    stream.shutdown(socket.SHUT_RDWR)
    stream.close()
    reader.join(10)
    deadline = time.monotonic() + 15
    while _busy(server.url) and time.monotonic() < deadline:
        time.sleep(1.5)  # slow polling on purpose (see wait_slots_idle)
    assert len(still_busy) == 2, f"closed non-stream request was cancelled: {still_busy}"
    assert _busy(server.url) == []
    assert _predicted(server.url) < 2 * N_PREDICT
