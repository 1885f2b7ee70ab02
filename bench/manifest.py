"""What was measured on what: versions, machine, arguments (bench/overhead.py)."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_PACKAGES = ("aiohttp", "uvicorn", "uvloop", "httptools", "starlette", "llm-admission-gateway")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _router_version(router_bin: str | None) -> str | None:
    """vllm-router's version, read from the venv its launcher lives in."""
    if router_bin is None:
        return None
    python = Path(router_bin).resolve().parent / "python"
    if not python.exists():
        return None
    code = "import importlib.metadata as m; print(m.version('vllm-router'))"
    try:
        out = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def router_record(router_bin: str | None) -> dict[str, str | None]:
    """Where the reference router came from: its PyPI package and version, not its path."""
    if router_bin is None:
        return {"package": None, "version": None}
    return {"package": "vllm-router (PyPI)", "version": _router_version(router_bin)}


def _git(root: Path, *args: str) -> str | None:
    """Read-only git queries (commit, dirty tree)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def manifest(
    args: argparse.Namespace, router_bin: str | None, urls: dict[str, str]
) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in _PACKAGES},
        "vllm_router": router_record(router_bin),
        "cpu_model": _cpu_model(),
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "loadavg_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "kernel": platform.release(),
        "git_commit": _git(ROOT, "rev-parse", "HEAD"),
        "git_dirty_files": len((_git(ROOT, "status", "--porcelain") or "").splitlines()),
        "args": {k: v for k, v in vars(args).items()},
        "budget": (
            f"{'0.3' if args.quick else '1.0'} s warm-up, then "
            f"{args.measure_s or (1.5 if args.quick else 5.0)} s "
            f"measured per cell and target in {args.rounds} interleaved windows (each later one "
            "after "
            f"{'0.2' if args.quick else '0.3'} s of warm-up)"
        ),
        "targets": urls,
        "notes": [
            "one zero-delay upstream process (raw ASGI, uvicorn + uvloop + httptools)",
            "gateway as shipped: `gateway serve --replica vllm=URL` (default config, log_level "
            "info)",
            "vllm-router --policy round_robin --disable-retries --disable-circuit-breaker",
            "load generator: this process, aiohttp on uvloop, closed loop at the given concurrency",
        ],
    }
