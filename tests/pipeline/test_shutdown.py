"""SIGTERM / SIGINT: a real `gateway serve` process drains, then ends what is
left with a word, releases everything and exits 0.

The gateway runs as a process (tests/fleet.py) in front of a slow simulated
vLLM replica, with its leases in a real `redis-server` (so the test can see
them released, not merely gone with the process).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway.sim import SimCluster, SimConfig
from tests.fleet import GatewayProcess
from tests.redisserver import RedisServer, redis_server

pytestmark = pytest.mark.redis

# The simulator's time runs at half speed: a 15 ms engine step takes 30 ms,
# so 1,000 tokens take ~30 s, far beyond the grace periods below.
SPEED = 0.5


def body(max_tokens: int, stream: bool, seed: int) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": f"request {seed} " + "word " * 40}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


@contextmanager
def gateway(
    tmp_path: Path, grace_s: float, **admission: Any
) -> Iterator[tuple[SimCluster, RedisServer, GatewayProcess]]:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "default.yaml").write_text("name: default\n")
    with ExitStack() as stack:
        sims = stack.enter_context(SimCluster([SimConfig(speed=SPEED, kv_tokens=65536)]))
        server = stack.enter_context(redis_server())
        cfg = {
            "replicas": [{"name": "sim-0", "url": sims.urls[0], "kind": "vllm"}],
            "policies": str(tmp_path / "policies"),
            "listen": {"graceful_timeout_s": grace_s},
            "admission": {"poll_interval_s": 0.05, **admission},
            # a lease outliving the process would expire only after 60 s: one
            # gone right after exit was released
            "state": {"backend": "redis", "redis": {"url": server.url, "lease_ttl_s": 60}},
        }
        gw = stack.enter_context(GatewayProcess(cfg, tmp_path))
        yield sims, server, gw


class Call(threading.Thread):
    """One request in a thread: its status, headers and (streamed) body."""

    def __init__(self, url: str, payload: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.payload = url, payload
        self.status = 0
        self.headers: httpx.Headers | None = None
        self.text = ""
        self.error: BaseException | None = None
        self.first_byte = threading.Event()

    def run(self) -> None:
        try:
            with (
                httpx.Client(timeout=60.0) as client,
                client.stream("POST", self.url + "/v1/chat/completions", json=self.payload) as r,
            ):
                self.status, self.headers = r.status_code, r.headers
                for chunk in r.iter_text():  # httpx raises on an incomplete chunked body
                    self.text += chunk
                    self.first_byte.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.first_byte.set()


def events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def wait_exit(gw: GatewayProcess, timeout: float) -> int:
    assert gw.proc is not None
    return gw.proc.wait(timeout=timeout)


def kv_leased(server: RedisServer) -> int:
    client = redis.Redis.from_url(server.url)
    base, live = client.hmget("gw:adm:{sim-0}:kv", "b", "l")
    return int(base or 0) + int(live or 0)


def test_sigterm_ends_streams_and_waiting_requests_with_a_word_and_exits_0(
    tmp_path: Path,
) -> None:
    with gateway(tmp_path, grace_s=1.0, max_in_flight=2) as (sims, server, gw):
        stream = Call(gw.url, body(1000, True, 1))
        blocking = Call(gw.url, body(1000, False, 2))
        queued = Call(gw.url, body(1000, False, 3))  # max_in_flight 2: it waits in the queue
        for call in (stream, blocking):
            call.start()
        assert stream.first_byte.wait(20)
        time.sleep(0.3)
        queued.start()
        time.sleep(0.5)
        assert kv_leased(server) > 0
        assert gw.proc is not None
        sent = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)

        # Readiness goes at once: the listener stops accepting (or answers 503).
        time.sleep(0.2)
        try:
            ready = httpx.get(gw.url + "/readyz", timeout=2.0).status_code
        except httpx.TransportError:
            ready = 503
        assert ready == 503

        assert wait_exit(gw, timeout=20) == 0
        took = time.monotonic() - sent
        for call in (stream, blocking, queued):
            call.join(10)
            assert not call.is_alive()
            assert call.error is None, repr(call.error)

        # The stream got its grace, then an SSE error event and [DONE].
        assert stream.status == 200
        data = events(stream.text)
        assert data[-1] == "[DONE]", data[-3:]
        err = json.loads(data[-2]).get("error")
        assert err is not None, data[-3:]
        assert err["code"] == "shutting_down"
        assert sum(1 for d in data if '"delta"' in d) >= 10  # tokens flowed during the grace
        # The answers that had not started: 503 shutting_down, retry elsewhere.
        for call in (blocking, queued):
            assert call.status == 503
            assert json.loads(call.text)["error"]["code"] == "shutting_down"
            assert call.headers is not None and call.headers["retry-after"] == "1"
        assert 1.0 <= took < 12.0
        assert kv_leased(server) == 0  # released, not expired (the lease TTL is 60 s)
        assert sims.stats(0, records=False)["totals"]["running"] == 0  # engine work aborted
        assert "Traceback" not in gw.log()


def test_requests_that_finish_within_the_grace_period_finish_normally(tmp_path: Path) -> None:
    with gateway(tmp_path, grace_s=20.0) as (_sims, _server, gw):
        stream = Call(gw.url, body(40, True, 1))  # ~1.2 s
        stream.start()
        assert stream.first_byte.wait(20)
        assert gw.proc is not None
        sent = time.monotonic()
        gw.proc.send_signal(signal.SIGINT)
        assert wait_exit(gw, timeout=25) == 0
        took = time.monotonic() - sent
        stream.join(10)
        assert stream.error is None, repr(stream.error)
        data = events(stream.text)
        assert data[-1] == "[DONE]"
        assert not any('"error"' in d for d in data)
        assert sum(1 for d in data if '"delta"' in d) >= 40
        assert took < 15.0  # exits once the stream is done, not at the end of the grace
        assert "Traceback" not in gw.log()
        assert "KeyboardInterrupt" not in gw.log()
