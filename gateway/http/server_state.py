"""`ServerState`: what the server and all its connections and exchanges share."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from gateway.http.asgi import ASGIApp
from gateway.http.responses import ErrorRenderer


class Closable(Protocol):
    """What the server does with a connection at shutdown (`HttpConnection`)."""

    def shutdown(self) -> None: ...
    def abort(self) -> None: ...


class ServerState:
    """What all connections of one server share."""

    __slots__ = (
        "app",
        "app_state",
        "body_timeout",
        "body_total_timeout",
        "connections",
        "date_line",
        "head_timeout",
        "idle_timeout",
        "loop",
        "render_error",
        "shutting_down",
        "tasks",
    )

    def __init__(
        self,
        app: ASGIApp,
        loop: asyncio.AbstractEventLoop,
        idle_timeout: float,
        render_error: ErrorRenderer,
        *,
        head_timeout: float = 5.0,
        body_timeout: float = 30.0,
        body_total_timeout: float = 300.0,
    ) -> None:
        self.app = app
        self.loop = loop
        self.idle_timeout = idle_timeout  # keep-alive: no byte of a next request for this long
        self.head_timeout = head_timeout  # a request head begun must be complete within this
        self.body_timeout = body_timeout  # the longest gap between two request body bytes
        self.body_total_timeout = body_total_timeout  # the whole request body, from its head
        self.render_error = render_error  # the body of the server's own error answers
        self.app_state: dict[str, Any] = {}  # the lifespan's state; each request gets a copy
        self.connections: set[Closable] = set()
        self.tasks: set[asyncio.Task[None]] = set()  # app calls still running
        self.date_line = b""  # b"date: ...\r\n", refreshed by the server once a second
        self.shutting_down = False
