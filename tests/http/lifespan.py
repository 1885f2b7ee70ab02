"""The ASGI lifespan of the test apps in this package: start, then wait for shutdown."""

from __future__ import annotations

from gateway.http.asgi import Receive, Send


async def run_lifespan(receive: Receive, send: Send) -> None:
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})
