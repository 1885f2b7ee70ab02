"""Waiting for a real engine process to answer ``/health`` (llama.cpp and vLLM alike)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import httpx


def wait_health(
    name: str,
    proc: subprocess.Popen[bytes],
    url: str,
    log_tail: Callable[[], str],
    deadline: float,
    pause: float,
) -> None:
    """Poll ``{url}/health`` until 200, until the monotonic `deadline`: a non-200 answer
    (loading) or a refused connection means "not yet"; the process exiting, or the deadline
    passing, raises with the server's last words."""
    last = "no answer"
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} (pid {proc.pid}, {url}) exited with {proc.returncode} during "
                    f"startup:\n{log_tail()}"
                )
            try:
                r = client.get(f"{url}/health")
                if r.status_code == 200:
                    return
                last = f"{r.status_code} {r.text[:200]}"
            except httpx.TransportError as e:
                last = repr(e)
            time.sleep(pause)
    raise RuntimeError(f"{name} at {url} not healthy in time (last: {last}):\n{log_tail()}")
