"""Nothing internal leaks to a client, nothing lax passes: a failed upstream is
named by its replica name (never its address), a request body in a transfer
coding the server does not implement is refused with 501, and an SDK client
timeout that has as good as expired never reaches the engine."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from gateway.config.schema import ReplicaConfig
from gateway.sim.config import SimConfig
from tests.gwharness import RunningGateway, running_gateway
from tests.simkit import Sims, chat_body, running_sims


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[Sims, RunningGateway]]:
    with (
        running_sims([SimConfig(speed=50)]) as sims,
        running_gateway([ReplicaConfig(url=sims.urls[0], name="engine-a", kind="vllm")]) as gw,
    ):
        yield sims, gw


def test_a_failed_upstream_is_named_by_its_replica_not_its_address(
    env: tuple[Sims, RunningGateway],
) -> None:
    sims, gw = env
    sims.fault(0, clear=True, die_after_tokens=0, count=1)
    try:
        resp = httpx.post(gw.url + "/v1/chat/completions", json=chat_body(False, 20), timeout=30)
    finally:
        sims.fault(0, clear=True)
    assert resp.status_code == 502, resp.text
    message = resp.json()["error"]["message"]
    assert "engine-a" in message
    address = urlsplit(sims.urls[0])
    assert str(address.port) not in resp.text and "127.0.0.1" not in resp.text, resp.text


def _raw(gw: RunningGateway, head: str, body: bytes) -> bytes:
    parts = urlsplit(gw.url)
    with socket.create_connection((parts.hostname or "", parts.port or 0), timeout=10) as s:
        s.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize("coding", ["gzip, chunked", "deflate,chunked", "identity, chunked"])
def test_a_transfer_coding_besides_chunked_is_501(
    env: tuple[Sims, RunningGateway], coding: str
) -> None:
    sims, gw = env
    before = sims.stats()["totals"]["requests"]
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"Transfer-Encoding: {coding}\r\n"
    )
    answer = _raw(gw, head, b"2\r\n{}\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 501 "), answer[:200]
    assert b'"code": "unsupported_transfer_coding"' in answer
    assert b"x-should-retry: false" in answer
    assert sims.stats()["totals"]["requests"] == before
    # plain chunked still works
    plain = head.replace(coding, "chunked") + "Connection: close\r\n"
    ok = _raw(gw, plain, b"2\r\n{}\r\n0\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 400 ") and b"messages" in ok
