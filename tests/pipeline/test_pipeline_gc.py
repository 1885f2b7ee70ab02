"""A request that fails mid-forward (here: the client gone while the stream is
relayed) leaves no reference cycle behind: its exception, traceback and frames
are freed by reference counting, not left to the cyclic GC (whose collections
cost more the more requests are in flight)."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import uvloop

from gateway.app import create_app
from gateway.config.schema import AdmissionConfig, GatewayConfig, HealthConfig, ReplicaConfig
from gateway.http.exchange import DISCONNECT_EXTENSION
from gateway.http.serving import free_port

ROOT = Path(__file__).resolve().parents[2]
BODY = (
    b'{"stream": true, "model": "m", "max_tokens": 8, '
    b'"messages": [{"role": "user", "content": "hi"}]}'
)


def _upstream(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.zero_upstream", "--port", str(port), "--chunks", "20"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("zero upstream did not start")


def _scope() -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "client": ("127.0.0.1", 1),
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BODY)).encode()),
        ],
        "extensions": {DISCONNECT_EXTENSION: lambda callback: lambda: None},
    }


def test_a_request_failed_mid_stream_leaves_no_cyclic_garbage() -> None:
    port = free_port()
    upstream = _upstream(port)
    try:
        cfg = GatewayConfig(
            replicas=(ReplicaConfig(url=f"http://127.0.0.1:{port}", kind="vllm"),),
            health=HealthConfig(interval_s=600),
            admission=AdmissionConfig(poll_interval_s=600, stale_after_s=100_000),
        )
        gw = create_app(cfg)

        async def one() -> None:
            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": BODY, "more_body": False}

            async def send(message: Any) -> None:
                if message["type"] == "http.response.body" and message.get("more_body"):
                    raise OSError("client gone")  # what an ASGI 2.4 server's send raises

            await gw.public_app(_scope(), receive, send)

        async def main() -> int:
            async with gw.lifespan(gw.public_app.app):
                for _ in range(3):
                    await one()  # warm: caches, pooled connection, metric cells
                gc.collect()
                gc.disable()
                try:
                    for _ in range(n):
                        await one()
                    return gc.collect()
                finally:
                    gc.enable()

        n = 50
        with asyncio.Runner(
            loop_factory=uvloop.new_event_loop
        ) as runner:  # the loop `gateway serve` runs on
            unreachable = runner.run(main())
        cancelled = gw.metrics.registry.get_sample_value(
            "gateway_cancellations_total", {"stage": "streaming"}
        )
    finally:
        upstream.kill()
        upstream.wait()
    assert cancelled is not None and cancelled >= n, (
        f"the requests did not fail mid-stream: {cancelled}"
    )
    assert unreachable < n, f"{unreachable} objects in reference cycles after {n} failed requests"
