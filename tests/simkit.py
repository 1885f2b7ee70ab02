"""Simulated replicas on loopback for the cancellation, deadline and retry tests
(and bench/cancel.py): start them, read `/sim/stats`, wait for a condition."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from gateway.http.serving import BackgroundServers, Listener, free_port
from gateway.sim.app import SimReplica
from gateway.sim.config import SimConfig

T = TypeVar("T")
MSG = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


@dataclass
class Sims:
    replicas: list[SimReplica]
    urls: list[str]
    servers: BackgroundServers

    def stats(self, i: int = 0) -> dict[str, Any]:
        data = httpx.get(self.urls[i] + "/sim/stats", timeout=10).json()
        assert isinstance(data, dict)
        return data

    def records(self, i: int = 0) -> list[dict[str, Any]]:
        recs = self.stats(i)["requests"]
        assert isinstance(recs, list)
        return recs

    def all_records(self) -> list[dict[str, Any]]:
        return [r for i in range(len(self.urls)) for r in self.records(i)]

    def fault(self, i: int, **changes: Any) -> None:
        resp = httpx.post(self.urls[i] + "/sim/fault", json=changes, timeout=10)
        assert resp.status_code == 200, resp.text

    def reset(self) -> None:
        for url in self.urls:
            httpx.post(url + "/sim/reset", json={}, timeout=10).raise_for_status()


@contextmanager
def running_sims(configs: Sequence[SimConfig]) -> Iterator[Sims]:
    replicas = [SimReplica(c) for c in configs]
    ports = [free_port() for _ in configs]
    servers = BackgroundServers(
        [Listener(r.app, "127.0.0.1", p) for r, p in zip(replicas, ports, strict=True)]
    )
    with servers:
        yield Sims(replicas, [f"http://127.0.0.1:{p}" for p in ports], servers)


def wait_for(probe: Callable[[], T | None], timeout: float = 10.0, step: float = 0.01) -> T:
    """Poll a test-side probe (never the gateway's own logic) until it returns a value."""
    end = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)


def chat_body(stream: bool, max_tokens: int = 20000, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "sim-model",
        "messages": MSG,
        "stream": stream,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    body.update(extra)
    return body


def metrics_when(gw: Any, name: str, value: float, timeout: float = 10.0, **labels: str) -> str:
    """The gateway's metrics text once `name{labels}` equals `value`."""

    def probe() -> str | None:
        text: str = gw.metrics_text()
        return text if metric(text, name, **labels) == value else None

    return wait_for(probe, timeout)


def settled(gw: Any) -> str:
    """The gateway's metrics once nothing is in flight."""
    return metrics_when(gw, "gateway_in_flight_requests", 0)


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total
