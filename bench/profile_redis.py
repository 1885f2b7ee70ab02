"""What a request costs Redis (`bench/profile_request.py --redis`): its own
counters read around a window of requests, and a short `MONITOR`.

`INFO commandstats` counts every command Redis ran, including those a Lua
script runs inside Redis; `INFO cpu` gives Redis's user + system CPU
seconds. `MONITOR` lines tell the two apart: commands run by a script are
tagged `[<db> lua]`, the others came over a connection (round trips).
Only command names are kept, never their arguments.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import socket
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.procs import Proc

_MONITOR_LINE = re.compile(rb'^\+\d+\.\d+ \[(\d+) ([^\]]+)\] "([^"]+)"(?: "([0-9a-f]{40})")?')
#: This harness's own commands, left out of the counts.
_OWN = frozenset({"info", "monitor"})


@dataclass(frozen=True, slots=True)
class RedisCounters:
    commands: dict[str, int]  # command name -> calls (scripts' inner commands included)
    cpu_s: float  # used_cpu_user + used_cpu_sys

    def minus(self, other: RedisCounters) -> RedisCounters:
        names = set(self.commands) | set(other.commands)
        diff = {n: self.commands.get(n, 0) - other.commands.get(n, 0) for n in names}
        return RedisCounters({n: v for n, v in diff.items() if v}, self.cpu_s - other.cpu_s)


def start_redis(logs: Path, port: int) -> Proc:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH (apt-get install redis-server)")
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(logs)]
    proc = Proc("redis-server", argv, logs / "redis.log").start(logs)
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.stop()
    raise RuntimeError("redis-server did not answer PING within 10 s")


def read_counters(client: redis.Redis) -> RedisCounters:
    stats = client.info("commandstats")
    commands = {
        name.removeprefix("cmdstat_").split("|")[0]: int(v["calls"])
        for name, v in stats.items()
        if name.removeprefix("cmdstat_").split("|")[0] not in _OWN
    }
    cpu = client.info("cpu")
    return RedisCounters(commands, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]))


def script_names() -> dict[str, str]:
    """SHA1 → name of the gateway's Lua scripts, built as `gateway.state.redis` builds them."""
    lua = Path(__file__).resolve().parent.parent / "gateway" / "state" / "lua"
    common = (lua / "common.lua").read_text()
    return {
        hashlib.sha1((common + "\n" + f.read_text()).encode()).hexdigest(): f.stem
        for f in sorted(lua.glob("*.lua"))
        if f.stem != "common"
    }


class Monitor:
    """A raw `MONITOR` connection, read until `stop()` (bounded in lines and time).
    With `scripts` (SHA1 → name), each `EVALSHA` is counted by script name and
    the commands a script runs (logged after its `EVALSHA`) under that name
    in `by_script`."""

    def __init__(
        self, port: int, max_lines: int = 100_000, scripts: dict[str, str] | None = None
    ) -> None:
        self.scripts = scripts or {}
        self.by_script: dict[str, Counter[str]] = {}
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(b"MONITOR\r\n")
        self.max_lines = max_lines
        self._buf = b""
        if not self._read_line().startswith(b"+OK"):
            raise RuntimeError("MONITOR was refused")

    def _read_line(self) -> bytes:
        for _ in range(10_000):
            if b"\r\n" in self._buf:
                line, self._buf = self._buf.split(b"\r\n", 1)
                return line
            data = self.sock.recv(65536)
            if not data:
                break
            self._buf += data
        return b""

    def stop(self, settle_s: float = 0.3) -> tuple[Counter[str], Counter[str]]:
        """(commands sent over a connection, commands run inside scripts)."""
        time.sleep(settle_s)
        self.sock.settimeout(0.2)
        top: Counter[str] = Counter()
        lua: Counter[str] = Counter()
        script = "?"
        try:
            for _ in range(self.max_lines):
                line = self._read_line()
                if not line:
                    break
                m = _MONITOR_LINE.match(line)
                if m is None:
                    continue
                name = m.group(3).decode(errors="replace").lower()
                if m.group(2) == b"lua":
                    lua[name] += 1
                    self.by_script.setdefault(script, Counter())[name] += 1
                    continue
                if m.group(4) is not None and name == "evalsha":
                    sha = m.group(4).decode()
                    script = self.scripts.get(sha, sha[:12])
                    name = f"evalsha {script}"
                else:
                    script = name
                top[name] += 1
        except TimeoutError:
            pass
        finally:
            self.sock.close()
        return top, lua
