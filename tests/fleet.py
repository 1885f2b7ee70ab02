"""Gateway instances as separate processes (`python -m gateway serve --config`),
for tests of several instances sharing one state store.

    with GatewayProcess(config_dict, tmp_path) as gw:
        httpx.post(gw.url + "/v1/chat/completions", ...)

Each process gets its own free loopback ports; its output goes to a log file
shown when it fails to start. `kill()` is a SIGKILL (a crashed instance).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import yaml

from gateway.http.serving import free_port

ROOT = Path(__file__).resolve().parent.parent
_START_TIMEOUT_S = 30.0


class GatewayProcess:
    def __init__(self, config: dict[str, Any], workdir: Path, name: str = "gw") -> None:
        self.port, self.admin_port = free_port(), free_port()
        cfg = dict(config)
        cfg["listen"] = {**cfg.get("listen", {}), "port": self.port, "admin_port": self.admin_port}
        self.config_path = workdir / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg))
        self.log_path = workdir / f"{name}.log"
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait_ready: bool = True) -> Self:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(self.config_path)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        self._wait("/readyz" if wait_ready else "/healthz")
        return self

    def _wait(self, path: str) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited ({self.proc.returncode}):\n{self.log()}")
            try:
                if httpx.get(self.url + path, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"no answer on {path} after {_START_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def metrics_text(self) -> str:
        return httpx.get(self.admin_url + "/metrics", timeout=5.0).text

    def kill(self) -> None:
        """SIGKILL: no shutdown, nothing released (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
