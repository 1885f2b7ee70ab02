"""The floor under the gateway: its HTTP server and upstream client with no
pipeline at all (no parsing, policy, routing, admission, deadlines, metrics).
The `floor` row of `bench/overhead.py --floor`: the gateway's CPU minus this
row's is what the pipeline costs; this row against vllm-router's is what
the Python substrate costs.

    python -m bench.floor_proxy --replica vllm=URL --port P [--admin-port A]

Forwards POST bodies to the one upstream as they are, relays status, headers
(minus hop-by-hop and framing ones) and body chunks as they arrive. GET
/readyz and /health answer 200. Not a product: no errors beyond a 502.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway.http.client import HTTPClientError, Pool
from gateway.http.server import LeanServer
from gateway.http.serving import run, tune_gc

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_DROP = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"date", b"server"}
)
_HEADERS = {"content-type": "application/json"}


class FloorProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.pool: Pool | None = None

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            if scope["method"] == "POST" and self.pool is not None:
                await self._forward(self.pool, scope["path"], receive, send)
            else:
                await _answer(send, 200, b"")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        for _ in range(2):
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.pool = Pool(1024)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.pool is not None:
                    await self.pool.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, pool: Pool, path: str, receive: Receive, send: Send) -> None:
        parts: list[bytes] = []
        for _ in range(1_000_000):
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        try:
            resp = await pool.request("POST", self.upstream + path, _HEADERS, b"".join(parts), 30.0)
        except HTTPClientError:
            await _answer(send, 502, b'{"error":{"message":"upstream failed"}}')
            return
        try:
            headers = [(k, v) for k, v in resp.headers if k.lower() not in _DROP]
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            for _ in range(10_000_000):
                chunk = await resp.read_chunk()
                if not chunk:
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            resp.release(True)


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--replica", required=True, help="vllm=http://127.0.0.1:PORT (the kind is ignored)"
    )
    p.add_argument("--port", type=int, required=True)
    p.add_argument(
        "--admin-port", type=int, default=0, help="accepted for symmetry with the gateway; unused"
    )
    args = p.parse_args()
    url = args.replica.split("=", 1)[-1]
    server = LeanServer(FloorProxy(url), "127.0.0.1", args.port)

    async def main_coro() -> None:
        tune_gc()
        await server.serve()

    run(main_coro())


if __name__ == "__main__":
    main()
