"""Run several ASGI apps on one event loop, each under uvicorn or the lean server.

Used by `gateway serve` (public + admin listeners), `gateway sim` (N simulated
replicas on consecutive ports), `gateway demo`, and by tests and benchmarks,
which run the same servers in a background thread on free loopback ports.
A listener runs under uvicorn unless it asks for `server="lean"`
(`gateway.http.server`, what the gateway's public listener uses);
a lean listener's own error answers come from its `render_error`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Self

import uvicorn

from gateway.http.responses import ErrorRenderer, json_error
from gateway.http.server import LeanServer
from gateway.http.uvicorn_writes import CoalescingProtocol


@dataclass(frozen=True, slots=True)
class Listener:
    app: Any
    host: str
    port: int
    server: Literal["uvicorn", "lean"] = "uvicorn"
    #: the body of the lean server's own error answers (uvicorn keeps its own)
    render_error: ErrorRenderer = json_error
    #: the lean server's timeouts, in seconds (uvicorn ignores them)
    head_timeout: float = 5.0  # a request head, from its first byte
    body_timeout: float = 30.0  # the longest gap between two request body bytes
    body_total_timeout: float = 300.0  # a whole request body, from its head
    keepalive_timeout: float = 5.0  # an idle keep-alive connection (a fresh one: head_timeout)
    #: on shutdown, how long open connections get to finish (both servers)
    graceful_timeout: float = 2.0
    #: on shutdown, keep serving until every other listener has stopped (and
    #: `on_stop` is done): the gateway's admin listener, so `/metrics` and
    #: `/readyz` answer throughout the public side's drain
    stop_last: bool = False


def run(main: Any) -> None:
    """Run the top-level coroutine on uvloop when installed (it comes with
    uvicorn[standard]; it cuts the event loop's share of the CPU), else asyncio."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def tune_gc(young_threshold: int = 10_000) -> None:
    """For a long-running server process, once its startup objects exist.

    `gc.freeze()` moves them out of the collector's sight, so a full
    collection no longer walks them; a higher young-generation threshold
    (default 700 allocations) collects less often while a 400 KB request
    body is parsed into tens of thousands of objects. Measured in-process:
    ~11% less CPU per 400 KB agent request, ~6% per small request. Reference
    counting still frees everything acyclic at once; only cycles wait longer."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(young_threshold, gen1, gen2)


def tune_switch_interval(seconds: float = 0.001) -> None:
    """How long a thread may hold the GIL while another waits for it (Python's
    default: 5 ms). The gateway's event loop shares the GIL only with the
    worker threads that parse and count huge request bodies; each time the
    loop gives the GIL up for a socket call it may then wait a whole interval
    to get it back, and one `/healthz` answer makes several such calls.
    Measured with `bench/loop_stall.py` (four 30 MB bodies of tiny messages
    or content parts in flight): `/healthz` p99 68-75 ms at 5 ms, 44-48 ms at
    1 ms; a request that never meets a worker thread is not affected."""
    sys.setswitchinterval(seconds)


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on `host` (tests and benchmarks only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class CannotListen(OSError):
    """A listener's address cannot be bound: `cannot listen on HOST:PORT: REASON`."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        reason = cause.strerror or str(cause)
        super().__init__(f"cannot listen on {host}:{port}: {reason[:1].lower()}{reason[1:]}")


def bind_listeners(listeners: Sequence[Listener]) -> list[socket.socket]:
    """A listening socket per listener, bound before any server starts (so a
    taken port fails here, with `CannotListen`, rather than inside the loop
    after startup); pass them to `serve_all(..., sockets=...)`."""
    bound: list[socket.socket] = []
    try:
        for lst in listeners:
            family = socket.AF_INET6 if ":" in lst.host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((lst.host, lst.port))
            except OSError as exc:
                raise CannotListen(lst.host, lst.port, exc) from exc
            sock.listen(2048)
            sock.set_inheritable(True)
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound


class _QuietServer(uvicorn.Server):
    """uvicorn leaving the signals to whoever runs it (`serve_all`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _make_server(
    listener: Listener, log_level: str, capture_signals: bool = True
) -> uvicorn.Server | LeanServer:
    if listener.server == "lean":
        return LeanServer(
            listener.app,
            listener.host,
            listener.port,
            idle_timeout=listener.keepalive_timeout,
            head_timeout=listener.head_timeout,
            body_timeout=listener.body_timeout,
            body_total_timeout=listener.body_total_timeout,
            graceful_timeout=listener.graceful_timeout,
            render_error=listener.render_error,
            capture_signals=capture_signals,
        )
    config = uvicorn.Config(
        listener.app,
        host=listener.host,
        port=listener.port,
        log_level=log_level,
        # uvicorn's records go through the process's own logging setup
        # (`log_format: json` included) rather than handlers of its own
        log_config=None,
        access_log=False,
        # the gateway reads no X-Forwarded-*; uvicorn's middleware costs ~15 µs/request
        proxy_headers=False,
        server_header=False,
        lifespan="on",
        loop="asyncio",
        http=CoalescingProtocol,
        timeout_graceful_shutdown=max(1, math.ceil(listener.graceful_timeout)),
    )
    return uvicorn.Server(config) if capture_signals else _QuietServer(config)


async def serve_all(
    listeners: Sequence[Listener],
    log_level: str = "warning",
    *,
    on_stop: Callable[[], Awaitable[object]] | None = None,
    sockets: Sequence[socket.socket] | None = None,
) -> None:
    """Serve every listener until one of them stops, or SIGTERM / SIGINT
    arrives (handled here, on the main thread: the servers install none).
    `sockets`: one per listener, already bound (`bind_listeners`); without
    them each server binds its own address when it starts.

    On a signal every server stops accepting connections and gives the open
    ones its `graceful_timeout`, while `on_stop` runs (the gateway drains
    its requests in flight); a `stop_last` listener keeps serving until all
    that is done, then stops the same way. A second signal forces the exit.
    Returns normally after a signal: a stop asked for is not an error."""
    loop = asyncio.get_running_loop()
    stop = _StopSignals(loop)
    servers = [_make_server(lst, log_level, capture_signals=not stop.handled) for lst in listeners]
    tasks: list[asyncio.Task[None]] = []
    try:
        for i, server in enumerate(servers):
            # Start in order (e.g. simulated replicas before the gateway that probes them).
            own = None if sockets is None else [sockets[i]]
            tasks.append(asyncio.create_task(server.serve(sockets=own)))
            for _ in range(3000):
                if server.started or tasks[-1].done() or stop.asked.is_set():
                    break
                await asyncio.sleep(0.01)
        waiting = asyncio.create_task(stop.asked.wait())
        await asyncio.wait([*tasks, waiting], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if stop.asked.is_set():
            last = [lst.stop_last for lst in listeners]
            first = [(s, t) for s, t, keep in zip(servers, tasks, last, strict=True) if not keep]
            await _stop([s for s, _ in first], [t for _, t in first], stop, on_stop)
            after = [(s, t) for s, t, keep in zip(servers, tasks, last, strict=True) if keep]
            await _stop([s for s, _ in after], [t for _, t in after], stop, None)
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        stop.close()


class _StopSignals:
    """SIGINT/SIGTERM on the main thread: the first sets `asked`, a second
    `forced`. Off the main thread (tests, benchmarks) none is handled."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.asked = asyncio.Event()
        self.forced = False
        self.handled: list[int] = []
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # e.g. Windows
                loop.add_signal_handler(sig, self._on_signal)
                self.handled.append(sig)

    def _on_signal(self) -> None:
        if self.asked.is_set():
            self.forced = True
        self.asked.set()

    def close(self) -> None:
        for sig in self.handled:
            self._loop.remove_signal_handler(sig)


async def _stop(
    servers: Sequence[uvicorn.Server | LeanServer],
    tasks: Sequence[asyncio.Task[None]],
    stop: _StopSignals,
    on_stop: Callable[[], Awaitable[object]] | None,
) -> None:
    for s in servers:
        s.should_exit = True  # stop accepting; open connections get their grace
    work = [asyncio.ensure_future(on_stop())] if on_stop is not None else []
    pending: set[asyncio.Future[Any]] = {*tasks, *work}
    for _ in range(100_000):  # bounded by the servers' own grace periods
        if not pending:
            break
        _, pending = await asyncio.wait(pending, timeout=0.1)
        if stop.forced:
            for s in servers:
                s.force_exit = True
            for fut in work:
                fut.cancel()


class BackgroundServers:
    """Serve listeners on a private event loop in a daemon thread.

    `start()` returns once every server accepts connections; `stop()` shuts
    them down (bounded wait). Usable as a context manager.
    """

    def __init__(self, listeners: Sequence[Listener], log_level: str = "warning") -> None:
        self._listeners = list(listeners)
        self._log_level = log_level
        self._servers: list[uvicorn.Server | LeanServer] = []
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._sockets: list[socket.socket] = []

    def start(self, timeout: float = 20.0) -> BackgroundServers:
        # Bind here, so a taken port fails at once with OSError in the caller's
        # thread (uvicorn would sys.exit() inside the loop). uvicorn installs
        # signal handlers only on the main thread, so none are installed here.
        self._sockets = bind_listeners(self._listeners)
        self._servers = [_make_server(lst, self._log_level) for lst in self._listeners]
        self._thread = threading.Thread(target=self._run, name="bg-servers", daemon=True)
        self._thread.start()
        deadline = timeout
        step = 0.01
        waited = 0.0
        while waited < deadline:
            if self._error is not None:
                raise RuntimeError("background server failed to start") from self._error
            if all(s.started for s in self._servers):
                return self
            if not self._thread.is_alive():
                raise RuntimeError("background server thread exited during startup")
            threading.Event().wait(step)
            waited += step
        raise TimeoutError(f"servers not started within {timeout}s")

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self.loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            self._error = exc
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            for sock in self._sockets:  # also when a startup failure skipped `_serve`'s cleanup
                sock.close()

    async def _serve(self) -> None:
        tasks = [
            asyncio.create_task(s.serve(sockets=[sock]))
            for s, sock in zip(self._servers, self._sockets, strict=True)
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for server in self._servers:
                server.should_exit = True
            await asyncio.gather(*tasks, return_exceptions=True)
            for sock in self._sockets:
                sock.close()

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the servers' loop and wait for its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        for s in self._servers:
            s.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
