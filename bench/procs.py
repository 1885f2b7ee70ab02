"""Benchmark process helpers: start servers on loopback, wait for them, read
their CPU time from /proc, and always kill them (by PID) on the way out."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the parenthesised command name (which may hold spaces).
    return raw[raw.rindex(")") + 2 :].split()


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None:
            kids.setdefault(int(fields[1]), []).append(int(entry))
    return kids


def tree_cpu_seconds(pid: int) -> float:
    """utime+stime of `pid` (all its threads), of its reaped children, and of
    its live descendants. CPU time, unlike wall time, stays meaningful on a
    machine shared with other work."""
    kids = _children_map()
    total_ticks = 0
    stack = [pid]
    seen: set[int] = set()
    while stack and len(seen) < 10_000:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        fields = _stat_fields(p)
        if fields is None:
            continue
        # utime, stime, cutime, cstime are fields 14-17 (1-based) of stat.
        total_ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        stack.extend(kids.get(p, ()))
    return total_ticks / CLK_TCK


def self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class Proc:
    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None  # overrides the caller's cwd (a compiled tree runs from its own root)
    popen: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self, cwd: Path) -> Proc:
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            list(self.argv),
            cwd=self.cwd or cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self) -> None:
        """SIGTERM its process group, then SIGKILL after 5 s; by PID only."""
        if self.popen is not None and self.popen.poll() is None:
            pgid = self.popen.pid  # start_new_session: the group id is our child's PID
            _signal_group(pgid, signal.SIGTERM)
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                self.popen.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def wait_http_ok(url: str, proc: Proc, timeout_s: float) -> None:
    """Poll GET `url` until it answers 200 (bounded); fail early if `proc` dies."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited during startup:\n{proc.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise TimeoutError(
        f"{proc.name}: {url} not ready within {timeout_s} s ({last}):\n{proc.log_tail()}"
    )
