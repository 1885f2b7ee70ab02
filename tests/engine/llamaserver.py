"""Start, probe and stop real ``llama-server`` processes (no pytest dependency).

Used by ``conftest.py`` (fixtures) and ``capture_golden.py`` (standalone script). Also the
single place that loads ``scripts/engines.py`` (which prepares the binary and the model).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from .health import wait_health

ENGINE_DIR = Path(__file__).resolve().parent
REPO_ROOT = ENGINE_DIR.parents[1]
ENGINES_SCRIPT = REPO_ROOT / "scripts" / "engines.py"

PARALLEL = 2
CTX_SIZE = 4096
# With an explicit --parallel the KV cache is not unified: each slot gets ctx_size / parallel.
N_CTX_PER_SLOT = CTX_SIZE // PARALLEL
STARTUP_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0


def load_engines() -> ModuleType:
    """Import ``scripts/engines.py`` (not a package) once, as ``gateway_scripts_engines``."""
    name = "gateway_scripts_engines"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ENGINES_SCRIPT)
    assert spec is not None and spec.loader is not None, ENGINES_SCRIPT
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _load_prctl() -> Any:
    if sys.platform != "linux":
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # resolved in the parent: the child only makes one libc call
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the server gets SIGTERM if pytest dies without running finalizers."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class LlamaServer:
    """A running ``llama-server`` process started by these fixtures."""

    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Terminate by PID, then kill after ``timeout`` seconds; idempotent."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)


def llama_server_argv(
    binary: Path,
    model: Path,
    port: int,
    *extra: str,
    parallel: int = PARALLEL,
    ctx_size: int = CTX_SIZE,
) -> list[str]:
    return [
        str(binary),
        "--metrics",
        "--slots",
        "--parallel", str(parallel),
        "--ctx-size", str(ctx_size),
        "--threads", "1",
        "--host", "127.0.0.1",
        "--port", str(port),
        "-m", str(model),
        *extra,
    ]  # fmt: skip


def spawn_llama_server(
    binary: Path,
    model: Path,
    log_dir: Path,
    *extra: str,
    parallel: int = PARALLEL,
    ctx_size: int = CTX_SIZE,
    port: int | None = None,
) -> LlamaServer:
    """Start one server (does not wait for it to be ready)."""
    port = port or free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"llama-server-{port}.log"
    argv = llama_server_argv(binary, model, port, *extra, parallel=parallel, ctx_size=ctx_size)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # async-signal-safe enough: one pre-resolved libc call, no imports/allocation
            preexec_fn=_die_with_parent if _PRCTL is not None else None,  # noqa: PLW1509
        )
    return LlamaServer(port=port, proc=proc, log_path=log_path, args=argv)


def wait_healthy(server: LlamaServer, timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Poll ``/health`` until 200; 503 (loading) and refused connections mean "not yet"."""
    deadline = time.monotonic() + timeout
    wait_health("llama-server", server.proc, server.url, server.log_tail, deadline, 0.1)


def start_servers(
    binary: Path,
    model: Path,
    log_dir: Path,
    count: int,
    *extra: str,
    parallel: int = PARALLEL,
    ctx_size: int = CTX_SIZE,
) -> list[LlamaServer]:
    """Start ``count`` servers concurrently and wait for all; retries a port collision."""
    started: list[LlamaServer] = []
    try:
        for _ in range(count):
            started.append(
                spawn_llama_server(
                    binary, model, log_dir, *extra, parallel=parallel, ctx_size=ctx_size
                )
            )
        for i, server in enumerate(started):
            for attempt in range(3):
                try:
                    wait_healthy(server)
                    break
                except RuntimeError:
                    bind_failed = server.proc.poll() is not None and "bind" in server.log_tail()
                    if not bind_failed or attempt == 2:
                        raise
                    server.stop()  # port was taken meanwhile by someone else: new port
                    server = spawn_llama_server(
                        binary, model, log_dir, *extra, parallel=parallel, ctx_size=ctx_size
                    )
                    started[i] = server
    except BaseException:
        for server in started:
            server.stop()
        raise
    return started


def slots(url: str, client: httpx.Client | None = None) -> list[dict[str, Any]]:
    c = client or httpx.Client(timeout=5.0)
    try:
        r = c.get(f"{url}/slots")
        r.raise_for_status()
        data: list[dict[str, Any]] = r.json()
        return data
    finally:
        if client is None:
            c.close()


def wait_slots_idle(urls: list[str], timeout: float = 60.0, erase: bool = False) -> None:
    """Wait until no slot of any server ``is_processing``; optionally erase slot caches.

    Polls with backoff up to 1.5 s: every ``/slots`` call wakes the server's HTTP threads,
    and a non-streaming request whose client went away is only cancelled after 1 s without
    any such wake-up (see golden/NOTES.md), so fast polling would keep it running.
    ``erase`` needs the server to run with ``--slot-save-path`` (the shared fixtures do).
    """
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5.0) as client:
        for url in urls:
            pause = 0.02
            while True:
                busy = [s["id"] for s in slots(url, client) if s.get("is_processing")]
                if not busy:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url}: slots {busy} still busy after {timeout} s")
                time.sleep(pause)
                pause = min(pause * 2, 1.5)
            if erase:
                for s in slots(url, client):
                    r = client.post(f"{url}/slots/{s['id']}", params={"action": "erase"})
                    r.raise_for_status()
