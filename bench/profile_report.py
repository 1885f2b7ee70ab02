"""Markdown and manifest of `bench/profile_request.py`."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def run_manifest(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "nproc": os.cpu_count(),
        "loadavg_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "git_commit": _git_commit(),
        "command": "python -m bench.profile_request "
        + " ".join(f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k != "out"),
    }


def _phase_table(shape: dict[str, Any]) -> list[str]:
    lines = [
        "| phase | µs / request | share | how | profile, corrected | as profiled | calls |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for p in shape["phases"]:
        lines.append(
            f"| {p['phase']} | {p['us']:,.1f} | {p['share'] * 100:.1f}% | {p['how']} | "
            f"{p['corrected_profile_us']:,.1f} | {p['profiled_us']:,.1f} | {p['calls']:,.0f} |"
        )
    spy = shape.get("pyspy") or {}
    if "shares" in spy:
        lines[0] += " py-spy share |"
        lines[1] += "---:|"
        for i, p in enumerate(shape["phases"]):
            lines[i + 2] += f" {spy['shares'].get(p['phase'], 0.0) * 100:.1f}% |"
    total = sum(p["us"] for p in shape["phases"])
    lines.append(
        f"| **total** | **{total:,.1f}** | 100% | | {shape['cpu_us_per_request']:,.1f} | "
        f"{shape['profiled_thread_cpu_us_per_request']:,.1f} | |"
    )
    return lines


def _direct_table(direct: dict[str, float]) -> list[str]:
    lines = [
        "Medians over the rounds (each alternating with a CPU window) of medians of repeats.",
        "",
        "| step (called directly, no profiler) | µs / call |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {us:,.1f} |" for name, us in direct.items()]
    return lines


def _pyspy_note(spy: dict[str, Any] | None) -> str:
    if spy is None:
        return "py-spy is not installed: no sampling profile."
    if "error" in spy:
        return f"py-spy: {spy['error']}"
    return (
        f"`py-spy share`: of {spy['samples']:,} samples (250 Hz, non-blocking) over "
        f"{spy['requests']:,} requests in a separate unprofiled window; C code counts to the "
        "Python frame calling it, uvloop's internals to `event loop + sockets`, builtins "
        "that copy bodies to their caller. Collapsed stacks "
        f"(flame-graph / speedscope input): `{spy['stacks']}`."
    )


def _func_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| function | phase | calls / req | own µs / req | cumulative µs / req |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['name']}` | {r['phase']} | {r['calls_per_request']:.1f} | "
            f"{r['own_us']:,.1f} | {r['cumulative_us']:,.1f} |"
        )
    return lines


def _shape_section(shape: dict[str, Any]) -> list[str]:
    rounds = ", ".join(f"{v:,.0f}" for v in shape["cpu_us_per_request_rounds"])
    lines = [
        f"## {shape['shape']} ({shape['body_bytes']:,} bytes, non-streaming, "
        f"c={shape['concurrency']})",
        "",
        f"Gateway process CPU per request, unprofiled: **{shape['cpu_us_per_request']:,.0f} µs** "
        f"(median of windows of {shape['requests_per_window']} requests: {rounds}). "
        f"Profiled window: {shape['profiled_requests']} requests, loop thread CPU "
        f"{shape['profiled_thread_cpu_us_per_request']:,.0f} µs / request under cProfile "
        f"(its cost: ~{shape['profiler_cost_us_per_call']:.2f} µs per call).",
        "",
        "### Per phase",
        "",
        *_phase_table(shape),
        "",
        _pyspy_note(shape.get("pyspy")),
        "",
        "### The body work called directly (cross-check)",
        "",
        *_direct_table(shape["direct"]),
        "",
        "### Top 20 by cumulative time (as profiled)",
        "",
        *_func_table(shape["top_cumulative"]),
        "",
        "### Top 20 by own time (as profiled)",
        "",
        *_func_table(shape["top_own"]),
        "",
        "### Top functions of each phase (own time, as profiled)",
        "",
    ]
    for phase in [p["phase"] for p in shape["phases"]]:
        rows = shape["by_phase"].get(phase)
        if rows:
            lines += [f"**{phase}**", "", *_func_table(rows), ""]
    return lines


def _counts(d: dict[str, float]) -> str:
    return ", ".join(f"`{k}` {v:.2f}" for k, v in d.items() if abs(v) >= 0.005) or "none"


def _redis_window(name: str, w: dict[str, Any]) -> list[str]:
    cpu = w["redis_cpu_us_per_request"]
    fleet = f"~{1e6 / cpu:,.0f}" if cpu > 0 else "n/a"
    return [
        f"### {name}: {w['requests']} requests in {w['wall_s']:.1f} s",
        "",
        "| per request | value |",
        "|---|---:|",
        f"| round trips (MONITOR, top-level commands) | {w['round_trips_per_request']:.2f} |",
        f"| commands run inside scripts (MONITOR) | {w['script_commands_per_request']:.2f} |",
        f"| commands in all (INFO commandstats) | {w['commands_total_per_request']:.2f} |",
        f"| Redis CPU (INFO cpu, user + sys) | {cpu:,.1f} µs |",
        f"| requests/s one Redis core could serve at that CPU | {fleet} |",
        "",
        f"Round trips by command (MONITOR over {w['monitor_requests']} requests): "
        f"{_counts(w['monitor_round_trips_per_request'])}.",
        f"Inside scripts: {_counts(w['monitor_script_commands_per_request'])}.",
        *[
            f"- `{script}`: {_counts(counts)} ({sum(counts.values()):.1f} commands per request)"
            for script, counts in w.get("monitor_script_commands_by_script_per_request", {}).items()
        ],
        "",
        f"INFO commandstats per request: {_counts(w['commands_per_request'])}.",
        "",
    ]


def _ratio(value: float | None) -> str:
    return "n/a (windows too short)" if value is None else f"{value:.2f}×"


def _redis_section(r: dict[str, Any]) -> list[str]:
    cpu = r["gateway_cpu_us_per_request"]
    rounds = r["gateway_cpu_us_per_request_rounds"]
    lines = [
        "## Redis (`state.backend: redis`), small requests",
        "",
        f"Redis's background rate over a {r['idle_window_s']:.0f} s idle window (subtracted "
        f"below): {_counts(r['idle_commands_per_s'])} commands/s, "
        f"{r['idle_cpu_us_per_s']:,.0f} µs CPU/s.",
        "",
    ]
    for name, window in r["windows"].items():
        lines += _redis_window(name, window)
    lines += [
        "### Gateway CPU per small request, memory vs redis state (sequential, interleaved)",
        "",
        f"memory: {cpu['gateway']:,.0f} µs, redis: {cpu['gateway-redis']:,.0f} µs, "
        f"ratio **{_ratio(r['redis_over_memory'])}** (windows, µs: "
        + "; ".join(f"{k}: " + ", ".join(f"{v:,.0f}" for v in vs) for k, vs in rounds.items())
        + ").",
        "",
    ]
    return lines


def markdown(data: dict[str, Any]) -> str:
    m = data["manifest"]
    lines = [
        "# Where a request's CPU goes (`bench/profile_request.py`)",
        "",
        f"{m['date']}, commit `{(m['git_commit'] or 'unknown')[:12]}`, Python {m['python']}, "
        f"{m['nproc']} CPUs shared with other work (load average {m['loadavg_before']} before, "
        f"{m['loadavg_after']} after: a loaded machine, so absolute µs are high; shares and "
        "ratios measured side by side are the figures to compare).",
        "",
        f"Command: `{m['command']}`",
        "",
        "Method: the gateway (`bench/profile_serve.py`: `gateway serve` with default config, "
        "lean server, uvloop) in front of the zero-delay upstream; cProfile of its event-loop "
        "thread over one window, each function's own time assigned to a phase "
        "(`bench/profile_phases.py`: by module and function, builtins to their callers), "
        "timed in thread CPU time (`as profiled`). cProfile's own cost, ~1-2 µs per call "
        "with a CPU-time clock, swamps call-heavy code, so `µs / request` is built from "
        "measurements without a profiler: the body work (parse, limits walk, field checks, "
        "rendering, token estimate with its part cache warm as for a resent body, prefix "
        "hashing and conversation key) called directly on the same body in this process "
        "(`timed directly`, table below), and the rest of the gateway process's unprofiled "
        "CPU per request (median of windows) split over the other phases in proportion to "
        "their profiled own time less their calls × the profiler's mean cost per call "
        "(`profile, corrected`: (profiled loop CPU − unprofiled CPU) / calls; it under-counts "
        "phases of many cheap builtin calls, e.g. metrics). `py-spy share` (when py-spy is "
        "installed) is a sampling profile of a separate unprofiled window, for comparison: "
        "it has no per-call cost, but on an oversubscribed machine it also samples a thread "
        "that is runnable and waiting for a core (e.g. right after a socket write wakes the "
        "upstream), so it over-counts the code before such waits. `event loop "
        "internals` is the loop thread's CPU outside every Python frame (uvloop's C code, "
        "syscalls). `calls` counts a coroutine's resumptions as calls (cProfile does).",
        "",
    ]
    for shape in data["shapes"]:
        lines += _shape_section(shape)
    if "redis" in data:
        lines += _redis_section(data["redis"])
    return "\n".join(lines).rstrip() + "\n"
