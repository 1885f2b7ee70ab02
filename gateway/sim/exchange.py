"""One HTTP exchange with the engine: stream or body, raced against disconnect.

`Exchange` is a raw ASGI response. It submits the request to the engine and
runs two tasks: the producer turns engine events into the flavour's body,
the watcher waits for `http.disconnect`.

Disconnect: vLLM aborts at once (the request leaves the queue or batch and
its blocks are freed before the next step). llama.cpp notices a closed
connection only when it next writes a streamed token, or at its next poll
(every `disconnect_poll_s` since the request arrived) otherwise.

Headers: vLLM starts a stream at once (the role chunk comes with the first
token); llama.cpp waits for the first result, so a context overflow found
after queueing is still a plain HTTP 400.

`die_after_tokens`: after that many tokens the TCP connection is aborted
without ending the body (a crashed engine). The transport comes from
uvicorn's `send` (see `app.py`); without one, an exception makes the server
drop the connection instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from starlette.types import Receive, Scope, Send

from gateway.sim.engine import Engine
from gateway.sim.formats import Formatter
from gateway.sim.request import Aborted, Event, Failed, Finish, SimRequest, Token


class SimulatedCrash(Exception):
    """Raised to make the server drop a connection when no transport is at hand."""


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class Exchange:
    """Raw ASGI response serving one generation request (see the module docstring)."""

    def __init__(
        self, engine: Engine, req: SimRequest, fmt: Formatter, die_after: int | None, transport: Any
    ) -> None:
        self._engine = engine
        self._req = req
        self._fmt = fmt
        self._die_after = die_after
        self._transport = transport
        self._flavor = engine.core.config.flavor
        self._complete = False
        self._disconnected = False
        self._gone = asyncio.Event()
        self._started = False
        self._tokens = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._engine.submit(self._req)
        watcher = asyncio.create_task(self._watch(receive))
        try:
            if self._fmt.job.stream:
                await self._stream(send)
            else:
                await self._whole(send)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            self._engine.abort(self._req)  # no-op unless the producer ended early

    # --- disconnect ------------------------------------------------------------------
    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._gone.set()
        if self._complete:
            return
        self._disconnected = True
        rec, clock = self._req.record, self._engine.core.clock
        rec.disconnect_time, rec.disconnect_wall = clock.now(), time.time()
        if self._flavor == "llamacpp":
            poll = self._engine.core.config.disconnect_poll_s
            await clock.sleep(poll - (clock.now() - rec.arrival) % poll)
        self._engine.abort(self._req)

    # --- bodies ------------------------------------------------------------------------
    async def _stream(self, send: Send) -> None:
        if self._flavor == "vllm":
            await self._start_sse(send)
        if self._die_after == 0:
            await self._start_sse(send)
            await self._die()
            return
        while True:
            event = await self._req.events.get()
            if isinstance(event, Token):
                if self._disconnected:
                    self._engine.abort(self._req)  # the write fails: abort now
                    return
                if await self._send_token(send, event):
                    return
            elif await self._stream_end(send, event):
                return

    async def _send_token(self, send: Send, token: Token) -> bool:
        """Send one token chunk; True once the simulated crash dropped the connection."""
        await self._start_sse(send)
        chunks: list[bytes] = []
        if self._tokens == 0 and (role := self._fmt.role_chunk()) is not None:
            chunks.append(sse(role))
        chunks.append(
            sse(
                self._fmt.token_chunk(
                    token.text, token.finish_reason, self._req.record, token.token_id
                )
            )
        )
        await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})
        self._tokens += 1
        if self._die_after is not None and self._tokens >= self._die_after:
            await self._die()
            return True
        return False

    async def _stream_end(self, send: Send, event: Event) -> bool:
        if isinstance(event, Aborted):
            return True
        if isinstance(event, Failed):
            if not self._started:
                await self._send_json(send, event.status, {"error": event.error})
                return True
            tail = [sse({"error": event.error})]
        elif isinstance(event, Finish):
            tail = [sse(c) for c in self._fmt.final_chunks(event.reason, self._req.record)]
        else:
            return False
        if self._fmt.sends_done and (self._flavor == "vllm" or isinstance(event, Finish)):
            tail.append(sse("[DONE]"))
        self._complete = True
        await send({"type": "http.response.body", "body": b"".join(tail), "more_body": False})
        return True

    async def _whole(self, send: Send) -> None:
        parts: list[str] = []
        while True:
            event = await self._req.events.get()
            if isinstance(event, Token):
                parts.append(event.text)
                if self._die_after is not None and len(parts) >= self._die_after:
                    await self._start(send, 200, b"application/json", length=4096)
                    await send({"type": "http.response.body", "body": b'{"id":', "more_body": True})
                    await self._die()
                    return
            elif isinstance(event, Failed):
                await self._send_json(send, event.status, {"error": event.error})
                return
            elif isinstance(event, Finish):
                body = self._fmt.full_body("".join(parts), event.reason, self._req.record)
                await self._send_json(send, 200, body)
                return
            else:
                return  # aborted: the client is gone

    # --- low level -----------------------------------------------------------------------
    async def _start(
        self, send: Send, status: int, content_type: bytes, length: int | None = None
    ) -> None:
        if self._started:
            return
        self._started = True
        headers = [(b"content-type", content_type)]
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})

    async def _start_sse(self, send: Send) -> None:
        kind = (
            b"text/event-stream; charset=utf-8" if self._flavor == "vllm" else b"text/event-stream"
        )
        await self._start(send, 200, kind)

    async def _send_json(self, send: Send, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self._complete = True
        await self._start(send, status, b"application/json", length=len(data))
        await send({"type": "http.response.body", "body": data, "more_body": False})

    async def _die(self) -> None:
        """Simulated engine crash: drop the connection without ending the body."""
        self._req.record.error = "simulated crash"
        self._engine.abort(self._req)
        if self._transport is None:
            raise SimulatedCrash("die_after_tokens")
        self._transport.abort()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._gone.wait(), 2.0)
