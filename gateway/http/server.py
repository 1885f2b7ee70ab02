"""A lean HTTP/1.1 ASGI server on `asyncio.Protocol` + httptools.

It serves the gateway's public listener: uvicorn's per-request machinery
costs ~50 µs of CPU per small proxied request at concurrency 1 over a plain
protocol (measured: bench/results/performance-notes-2026.md), and uvicorn
has no request-head or body limits (see gateway/http/README.md). Only what an
HTTP/1.1 API server needs: ASGI 3 `http` (spec 2.4) and `lifespan`; no
websockets, no TLS, no HTTP/2 (upgrade requests are answered as plain HTTP/1.1,
see `gateway.http.connection`).

Timeouts (see `gateway.http.connection`): `idle_timeout` (keep-alive: no byte
of a next request), `head_timeout` (a request head begun), `body_timeout` (the
longest gap between two request body bytes) and `body_total_timeout` (a whole
request body).

The answers the server gives on its own (400 malformed request or missing
`Host`, 408 request body not received in time, 431 head too large, 500 app
failure) take their headers and body from `render_error`
(`gateway.http.responses.ErrorRenderer`; default: `json_error`), so that an
application can make them look like its own errors.

`LeanServer` has the surface `gateway.http.serving` uses of `uvicorn.Server`:
`await serve(sockets=None)`, `started`, `should_exit` (and `force_exit`).
Startup runs the app's lifespan before accepting (a failure exits with status
3, as uvicorn does); `should_exit` stops accepting, lets in-flight requests
finish for up to `graceful_timeout` seconds, then cancels them, closes every
connection and runs the lifespan shutdown. On the main thread SIGINT/SIGTERM
set `should_exit` (a second SIGINT forces the exit) and are re-raised after
shutdown, as uvicorn does, unless `capture_signals=False` (then whoever runs
the server handles them: `gateway.http.serving.serve_all`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from email.utils import formatdate
from types import FrameType
from typing import Any

from gateway.http.asgi import ASGIApp, ClientDisconnected, Message
from gateway.http.connection import HttpConnection
from gateway.http.responses import ErrorRenderer, json_error
from gateway.http.server_state import ServerState

__all__ = ["ClientDisconnected", "LeanServer"]

log = logging.getLogger("gateway.http.server")

STARTUP_FAILURE = 3
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Lifespan:
    """The app's ASGI lifespan, run as uvicorn's `lifespan="on"` does."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self.state: dict[str, Any] = {}
        self._queue: asyncio.Queue[Message] = asyncio.Queue()
        self._started = asyncio.Event()
        self._stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failed = False  # startup failed (or the lifespan raised): no shutdown to run

    async def startup(self) -> bool:
        self._task = asyncio.create_task(self._main())
        await self._queue.put({"type": "lifespan.startup"})
        await self._started.wait()
        return not self.failed

    async def shutdown(self) -> None:
        if self.failed or self._task is None:
            return
        await self._queue.put({"type": "lifespan.shutdown"})
        await self._stopped.wait()

    async def _main(self) -> None:
        scope = {
            "type": "lifespan",
            "asgi": {"version": "3.0", "spec_version": "2.0"},
            "state": self.state,
        }
        try:
            await self._app(scope, self._queue.get, self._send)
        except BaseException as exc:
            if not self.failed:
                self.failed = True
                log.error("Exception in the ASGI lifespan", exc_info=exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._started.set()
            self._stopped.set()

    async def _send(self, message: Message) -> None:
        kind = message["type"]
        if kind in ("lifespan.startup.complete", "lifespan.startup.failed"):
            if kind == "lifespan.startup.failed":
                self.failed = True
                log.error("Application startup failed: %s", message.get("message", ""))
            self._started.set()
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            if kind == "lifespan.shutdown.failed":
                log.error("Application shutdown failed: %s", message.get("message", ""))
            self._stopped.set()
        else:
            raise RuntimeError(f"Unexpected lifespan message {kind!r}")


class LeanServer:
    """Serve one ASGI app on one listening socket (see the module doc)."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 8080,
        *,
        idle_timeout: float = 5.0,
        head_timeout: float = 5.0,
        body_timeout: float = 30.0,
        body_total_timeout: float = 300.0,
        graceful_timeout: float = 2.0,
        backlog: int = 2048,
        render_error: ErrorRenderer = json_error,
        capture_signals: bool = True,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.idle_timeout = idle_timeout
        self.head_timeout = head_timeout
        self.body_timeout = body_timeout
        self.body_total_timeout = body_total_timeout
        self.graceful_timeout = graceful_timeout
        self.backlog = backlog
        self.render_error = render_error
        self.capture_signals = capture_signals
        self.started = False
        self.should_exit = False
        self.force_exit = False
        self.state: ServerState | None = None  # while serving (tests inspect it)
        self._captured: list[int] = []

    async def serve(self, sockets: Sequence[socket.socket] | None = None) -> None:
        with self._capture_signals():
            await self._serve(sockets)

    async def _serve(self, sockets: Sequence[socket.socket] | None) -> None:
        loop = asyncio.get_running_loop()
        lifespan = _Lifespan(self.app)
        if not await lifespan.startup():
            log.error("Application startup failed. Exiting.")
            raise SystemExit(STARTUP_FAILURE)
        state = self.state = ServerState(
            self.app,
            loop,
            self.idle_timeout,
            self.render_error,
            head_timeout=self.head_timeout,
            body_timeout=self.body_timeout,
            body_total_timeout=self.body_total_timeout,
        )
        state.app_state = lifespan.state
        self._refresh_date()

        def factory() -> HttpConnection:
            return HttpConnection(state)

        servers: list[asyncio.Server] = []
        try:
            if sockets is not None:
                for sock in sockets:
                    servers.append(
                        await loop.create_server(factory, sock=sock, backlog=self.backlog)
                    )
            else:
                servers.append(
                    await loop.create_server(
                        factory, self.host, self.port, backlog=self.backlog, reuse_address=True
                    )
                )
        except OSError as exc:
            log.error("cannot listen on %s:%s: %s", self.host, self.port, exc)
            for srv in servers:
                srv.close()
            await lifespan.shutdown()
            raise SystemExit(STARTUP_FAILURE) from exc
        self.started = True
        try:
            await self._main_loop()
        finally:
            await self._shutdown(servers, lifespan)

    async def _main_loop(self) -> None:
        ticks = 0
        while not self.should_exit:
            await asyncio.sleep(0.1)
            ticks += 1
            if ticks % 10 == 0:
                self._refresh_date()

    def _refresh_date(self) -> None:
        assert self.state is not None
        self.state.date_line = b"date: " + formatdate(time.time(), usegmt=True).encode() + b"\r\n"

    async def _shutdown(self, servers: list[asyncio.Server], lifespan: _Lifespan) -> None:
        state = self.state
        assert state is not None
        loop = asyncio.get_running_loop()
        state.shutting_down = True
        for srv in servers:
            srv.close()
        for conn in list(state.connections):
            conn.shutdown()
        deadline = loop.time() + self.graceful_timeout
        while (state.connections or state.tasks) and not self.force_exit and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if state.tasks:
            log.warning(
                "cancelling %d request(s) still running after the %.1fs grace period",
                len(state.tasks),
                self.graceful_timeout,
            )
            for task in list(state.tasks):
                task.cancel()
        for conn in list(state.connections):
            conn.abort()
        if state.tasks:
            await asyncio.wait(list(state.tasks), timeout=1.0)
        for srv in servers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(srv.wait_closed(), 1.0)
        if not self.force_exit:
            await lifespan.shutdown()

    @contextlib.contextmanager
    def _capture_signals(self) -> Iterator[None]:
        if not self.capture_signals or threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self._handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
        for captured in reversed(self._captured):  # what the signal would have done, after shutdown
            signal.raise_signal(captured)

    def _handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._captured.append(sig)
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True
