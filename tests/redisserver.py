"""A throwaway `redis-server` for tests: a free loopback port, no persistence,
its own temp dir; `stop()` / `start()` on the same port for outage tests.

Never skips: without a `redis-server` binary the tests fail and say what to
install (CI installs it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_START_TIMEOUT_S = 10.0


def redis_server_binary() -> str:
    """`redis-server` on PATH, or the server GATEWAY_TEST_REDIS_SERVER names
    (e.g. a `valkey-server`, to run the same tests against Valkey)."""
    override = os.environ.get("GATEWAY_TEST_REDIS_SERVER")
    if override:
        return override
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError(
            "redis-server not found on PATH: install it (apt-get install redis-server, "
            "or brew install redis) to run the Redis state-store tests"
        )
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _pings(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, workdir: Path, *, extra_args: tuple[str, ...] = ()) -> None:
        self.binary = redis_server_binary()
        self.workdir = workdir
        self.port = _free_port()
        self.extra_args = extra_args
        #: before the options (a sentinel's config file)
        self.leading_args: tuple[str, ...] = ()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert self._proc is None, "already running"
        args = [
            self.binary,
            *self.leading_args,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            *self.extra_args,
        ]
        self._proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.workdir
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not _pings(self.port):
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode() if self._proc.stderr else ""
                if self._proc.stderr is not None:
                    self._proc.stderr.close()
                self._proc = None
                raise RuntimeError(f"redis-server exited at start: {err}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer PING within {_START_TIMEOUT_S}s")
            time.sleep(0.02)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


@contextmanager
def redis_server(*extra_args: str) -> Iterator[RedisServer]:
    with tempfile.TemporaryDirectory(prefix="gw-redis-") as tmp:
        server = RedisServer(Path(tmp), extra_args=extra_args)
        server.start()
        try:
            yield server
        finally:
            server.stop()
