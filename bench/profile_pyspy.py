"""A sampling profile of the gateway with py-spy (`bench/profile_request.py`),
when py-spy is installed (`.venv/bin/pip install py-spy`): no per-call cost,
so its phase shares check cProfile's. Samples are collapsed stacks (the
flame-graph input format; speedscope opens them too); C code counts to the
Python frame that called it. A sample's phase is that of its innermost frame
with a rule in `bench/profile_phases.py`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.profile_phases import UNATTRIBUTED, rule_phase

ROOT = Path(__file__).resolve().parent.parent
_FRAME = re.compile(r"^(?P<name>.*) \((?P<path>[^():]+):(?P<line>\d+)\)$")


def pyspy_binary() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def start_record(binary: str, pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    argv = [binary, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds)))]
    argv += ["--rate", "250", "--nonblocking", "--format", "raw", "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def relative_paths(text: str) -> str:
    """Stacks with repository-relative paths (site-packages and stdlib by module)."""
    text = text.replace(str(ROOT) + "/", "")
    text = re.sub(r"/[^;()]*?/site-packages/", "", text)
    return re.sub(r"/[^;()]*?/lib/python3\.\d+/", "", text)


def _phase_of(stack: list[str]) -> str:
    for frame in reversed(stack):
        m = _FRAME.match(frame.strip())
        if m is None:
            continue
        name = m["name"].rsplit(".", 1)[-1]  # py-spy names methods `Class.method`
        phase = rule_phase((m["path"], int(m["line"]), name))
        if phase is not None:
            return phase
    return UNATTRIBUTED


def phase_shares(collapsed: str) -> tuple[dict[str, float], int]:
    """(phase → share of the samples, samples) of collapsed stacks
    (`frame;frame;... count` per line)."""
    counts: dict[str, int] = {}
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        phase = _phase_of(stack.split(";"))
        counts[phase] = counts.get(phase, 0) + int(count)
        total += int(count)
    return ({p: c / total for p, c in counts.items()} if total else {}), total


def sample_window(
    pid: int, load: Callable[[float], int], raw: Path, out: Path, seconds: float = 4.0
) -> dict[str, Any] | None:
    """py-spy records `pid` while `load(seconds)` runs requests (None without
    py-spy): phase shares of the samples; the collapsed stacks, with relative
    paths, are written to `out`."""
    binary = pyspy_binary()
    if binary is None:
        return None
    rec = start_record(binary, pid, seconds, raw)
    time.sleep(0.5)  # py-spy attaches
    ok = load(seconds - 0.5)
    try:
        _, err = rec.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        rec.kill()
        rec.communicate()
        return {"error": "py-spy did not finish"}
    if rec.returncode != 0 or not raw.exists():
        return {"error": f"py-spy failed: {err.decode(errors='replace')[-300:]}"}
    text = relative_paths(raw.read_text())
    out.write_text(text)
    shares, samples = phase_shares(text)
    return {"requests": ok, "samples": samples, "shares": shares, "stacks": _relative(out)}


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name
