"""uvicorn's httptools protocol, writing a response head and the body that
follows it in one socket write (`serving.py` runs uvicorn listeners with it)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeadWithBody:
    """A transport view that sends a response head together with the body that
    follows it in the same event-loop turn: uvicorn writes the head on
    `http.response.start` and the body on `http.response.body`, two socket
    writes (and two TCP segments) for every non-streaming answer. A head
    is held until the body's write or the end of the turn, whichever comes
    first (a stream's head goes out alone, before its first event); every
    other write passes straight through."""

    __slots__ = ("_head", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + bytes(data))
        elif data[:5] == b"HTTP/":
            self._head = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        head, self._head = self._head, None
        if head is not None:
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through `HeadWithBody`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = cast(asyncio.Transport, HeadWithBody(transport, self.loop))
