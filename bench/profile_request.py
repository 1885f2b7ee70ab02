"""Where the CPU of one request goes: cProfile of the gateway's event-loop
thread, split into pipeline phases, and what a request costs Redis.

    .venv/bin/python -m bench.profile_request [--quick] [--out bench/results]

Three processes on 127.0.0.1 besides this one (the load generator, aiohttp):
the zero-delay upstream (`bench/zero_upstream.py`), the gateway as `gateway
serve` runs it with default config (`bench/profile_serve.py`: cProfile
switched on and off by signals), and for the Redis part a second such
gateway with `state.backend: redis` and a `redis-server` of its own.

Per request shape (the ~400 KB agent body and the small chat body of
`bench/loadgen.py`, non-streaming): `--rounds` unprofiled windows (the
gateway process tree's CPU per request from /proc; median reported), then
one profiled window. A phase's µs per request is its share of the profiled
own time times the unprofiled CPU per request (cProfile inflates call-heavy
code, so the profiled µs are reported too). Redis: `INFO commandstats` and
`INFO cpu` deltas over sequential small requests (less an idle window's
background rate) and a short `MONITOR`, against the in-process gateway's CPU
per small request measured in the same run, interleaved.

Writes `profile-request.{json,md}` to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis

from bench.loadgen import agent_body, make_session, run_load, small_body
from bench.procs import Proc, tree_cpu_seconds, wait_http_ok
from bench.profile_direct import direct_phases, direct_timings, median_timings
from bench.profile_phases import (
    Func,
    PhaseSplit,
    corrected_phases,
    load_stats,
    measured_phases,
    top_by_phase,
    top_rows,
)
from bench.profile_pyspy import sample_window
from bench.profile_redis import (
    Monitor,
    RedisCounters,
    read_counters,
    script_names,
    start_redis,
)
from bench.profile_report import markdown, run_manifest
from gateway.http.serving import free_port

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Gateway:
    name: str
    url: str
    proc: Proc
    profiles: Path


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    body: bytes
    requests: int  # per window
    concurrency: int


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--quick", action="store_true", help="fewer requests per window")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight (profile)")
    p.add_argument(
        "--rounds", type=int, default=5, help="unprofiled windows (and direct timings) per shape"
    )
    p.add_argument("--redis-requests", type=int, default=500, help="sequential small requests")
    p.add_argument("--no-redis", action="store_true", help="skip the Redis part")
    p.add_argument("--only-redis", action="store_true", help="only the Redis part")
    args = p.parse_args(argv)
    if args.no_redis and args.only_redis:
        p.error("--no-redis and --only-redis exclude each other")
    if not 1 <= args.concurrency <= 512:
        p.error("--concurrency: an integer in 1..512")
    if not 1 <= args.rounds <= 10:
        p.error("--rounds: an integer in 1..10")
    if not 10 <= args.redis_requests <= 20_000:
        p.error("--redis-requests: an integer in 10..20000")
    return args


def _start_gateway(name: str, up_url: str, logs: Path, config: Path | None) -> Gateway:
    port, admin = free_port(), free_port()
    profiles = logs / f"profiles-{name}"
    profiles.mkdir()
    argv = [sys.executable, "-m", "bench.profile_serve", "--replica", up_url]
    argv += ["--port", str(port), "--admin-port", str(admin), "--out", str(profiles)]
    if config is not None:
        argv += ["--config", str(config)]
    proc = Proc(name, argv, logs / f"{name}.log").start(ROOT)
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(url + "/readyz", proc, 60)
    return Gateway(name, url, proc, profiles)


async def _load(gw: Gateway, shape: Shape, requests: int, concurrency: int) -> int:
    """Requests answered 200; fails loudly on any error."""
    async with make_session(concurrency) as session:
        res = await run_load(
            session,
            gw.url + "/v1/chat/completions",
            shape.body,
            False,
            concurrency,
            requests,
            duration_s=120.0,
            grace_s=10.0,
        )
    if res.errors or res.unfinished:
        raise RuntimeError(f"{gw.name} {shape.name}: {res.errors} errors {res.error_samples}")
    return res.ok


def _cpu_window(gw: Gateway, shape: Shape, concurrency: int) -> float:
    """The gateway process tree's CPU µs per request over one window."""
    cpu0 = tree_cpu_seconds(gw.proc.pid)
    ok = asyncio.run(_load(gw, shape, shape.requests, concurrency))
    return (tree_cpu_seconds(gw.proc.pid) - cpu0) / ok * 1e6


def _profiled(gw: Gateway, shape: Shape, index: int) -> tuple[dict[Func, Any], int, float]:
    """One profiled window: (pstats records, requests, profiled thread CPU s)."""
    os.kill(gw.proc.pid, signal.SIGUSR1)
    time.sleep(0.2)
    ok = asyncio.run(_load(gw, shape, shape.requests, shape.concurrency))
    os.kill(gw.proc.pid, signal.SIGUSR2)
    prof = gw.profiles / f"profile-{index}.prof"
    cpu = gw.profiles / f"profile-{index}.cpu"
    for _ in range(300):
        if cpu.exists():
            break
        time.sleep(0.05)
    return load_stats(str(prof)), ok, float(cpu.read_text())


def _sampled(gw: Gateway, shape: Shape, out: Path) -> dict[str, Any] | None:
    """A py-spy window over `shape`'s load (None without py-spy)."""

    def load(seconds: float) -> int:
        return asyncio.run(_load_for(gw, shape, seconds))

    return sample_window(gw.proc.pid, load, gw.profiles / "pyspy.txt", out)


async def _load_for(gw: Gateway, shape: Shape, seconds: float) -> int:
    async with make_session(shape.concurrency) as session:
        res = await run_load(
            session,
            gw.url + "/v1/chat/completions",
            shape.body,
            False,
            shape.concurrency,
            1_000_000,
            duration_s=seconds,
            grace_s=10.0,
        )
    return res.ok


def profile_shape(gw: Gateway, shape: Shape, rounds: int, index: int, out: Path) -> dict[str, Any]:
    asyncio.run(_load(gw, shape, max(20, shape.requests // 5), shape.concurrency))  # warm-up
    # CPU windows and direct timings alternate, so both see the same load on the machine
    cpu: list[float] = []
    timings: list[dict[str, float]] = []
    repeats = 9 if len(shape.body) > 100_000 else 501
    for _ in range(rounds):
        cpu.append(_cpu_window(gw, shape, shape.concurrency))
        timings.append(direct_timings(shape.body, repeats))
    cpu_us = statistics.median(cpu)
    direct = median_timings(timings)
    stats, ok, thread_cpu = _profiled(gw, shape, index)
    split = PhaseSplit(stats)
    seconds = split.phase_seconds()
    calls = split.phase_calls()
    own_total = sum(seconds.values())
    fixed = corrected_phases(seconds, calls, thread_cpu, cpu_us * ok / 1e6)
    fixed_us = {p: v / ok * 1e6 for p, v in fixed.items()}
    body_work = direct_phases(direct)
    spy = _sampled(gw, shape, out / f"profile-{shape.name}.pyspy.txt")
    # The rest is split by the corrected profile (CPU time of every call); py-spy's
    # samples are shown beside it: on an oversubscribed machine they also count time
    # spent runnable but descheduled (e.g. right after a socket write wakes the upstream).
    final = measured_phases(fixed_us, body_work, cpu_us)
    for phase in fixed_us:
        final.setdefault(phase, 0.0)
    phases = [
        {
            "phase": phase,
            "us": us,
            "share": us / cpu_us,
            "how": "timed directly" if phase in body_work else "rest, by corrected profile",
            "corrected_profile_us": fixed_us.get(phase, 0.0),
            "profiled_us": seconds.get(phase, 0.0) / ok * 1e6,
            "calls": calls.get(phase, 0.0) / ok,
        }
        for phase, us in sorted(final.items(), key=lambda kv: kv[1], reverse=True)
    ]
    return {
        "shape": shape.name,
        "body_bytes": len(shape.body),
        "concurrency": shape.concurrency,
        "requests_per_window": shape.requests,
        "cpu_us_per_request_rounds": cpu,
        "cpu_us_per_request": cpu_us,
        "profiled_requests": ok,
        "profiled_thread_cpu_us_per_request": thread_cpu / ok * 1e6,
        "profiled_own_us_per_request": own_total / ok * 1e6,
        "profiler_cost_us_per_call": (thread_cpu - cpu_us * ok / 1e6)
        / max(1.0, sum(calls.values()))
        * 1e6,
        "direct": direct,
        "pyspy": spy,
        "phases": phases,
        "top_cumulative": [asdict(r) for r in top_rows(stats, split, ok, "cumulative")],
        "top_own": [asdict(r) for r in top_rows(stats, split, ok, "own")],
        "by_phase": {
            p: [asdict(r) for r in rows] for p, rows in top_by_phase(stats, split, ok).items()
        },
    }


async def _load_unique(gw: Gateway, n: int, offset: int) -> int:
    """`n` sequential small requests, each opening a new conversation."""
    ok = 0
    async with make_session(1) as session:
        for i in range(offset, offset + n):
            body = small_body(False).replace(b"Say hello.", f"Say hello {i}.".encode())
            async with session.post(
                gw.url + "/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as resp:
                await resp.read()
                ok += resp.status == 200
    if ok != n:
        raise RuntimeError(f"{gw.name}: {n - ok} of {n} unique requests failed")
    return ok


def _redis_window(
    client: redis.Redis, port: int, idle: RedisCounters, idle_s: float, send: Callable[[int], int]
) -> dict[str, Any]:
    """Counters around `send(n)` (less the idle rate), then a MONITOR of 20 more."""
    start = read_counters(client)
    t0 = time.monotonic()
    ok = send(0)
    wall = time.monotonic() - t0
    delta = read_counters(client).minus(start)
    background = wall / idle_s
    commands = {
        name: (calls - idle.commands.get(name, 0) * background) / ok
        for name, calls in sorted(delta.commands.items())
    }
    monitor = Monitor(port, scripts=script_names())
    mon = send(20)
    top, lua = monitor.stop()
    return {
        "requests": ok,
        "wall_s": wall,
        "commands_per_request": commands,
        "commands_total_per_request": sum(commands.values()),
        "redis_cpu_us_per_request": (delta.cpu_s - idle.cpu_s * background) / ok * 1e6,
        "monitor_requests": mon,
        "monitor_round_trips_per_request": {n: c / mon for n, c in sorted(top.items())},
        "monitor_script_commands_per_request": {n: c / mon for n, c in sorted(lua.items())},
        "round_trips_per_request": sum(top.values()) / mon,
        "script_commands_per_request": sum(lua.values()) / mon,
        "monitor_script_commands_by_script_per_request": {
            script: {n: c / mon for n, c in sorted(counts.items())}
            for script, counts in sorted(monitor.by_script.items())
        },
    }


def redis_costs(
    memory: Gateway, redis_gw: Gateway, port: int, shape: Shape, rounds: int
) -> dict[str, Any]:
    """Redis commands, round trips and CPU per small request (the same body
    resent, each request a new conversation, both sequential; the same body
    with 32 in flight), and both gateways' CPU per sequential request in
    interleaved windows."""
    client = redis.Redis(port=port)
    asyncio.run(_load(redis_gw, shape, 50, 1))
    idle_s = 3.0
    before = read_counters(client)
    time.sleep(idle_s)
    idle = read_counters(client).minus(before)
    offsets = iter(range(1, 1000))

    def resent(n: int) -> int:
        return asyncio.run(_load(redis_gw, shape, n or shape.requests, 1))

    def unique(n: int) -> int:
        count = n or shape.requests // 2
        return asyncio.run(_load_unique(redis_gw, count, next(offsets) * 100_000))

    def resent_32(n: int) -> int:
        return asyncio.run(_load(redis_gw, shape, n or shape.requests, 32))

    windows = {
        "same body resent": _redis_window(client, port, idle, idle_s, resent),
        "a new conversation each": _redis_window(client, port, idle, idle_s, unique),
        "same body resent, 32 in flight": _redis_window(client, port, idle, idle_s, resent_32),
    }
    gw_cpu: dict[str, list[float]] = {memory.name: [], redis_gw.name: []}
    for r in range(rounds):
        order = (memory, redis_gw) if r % 2 == 0 else (redis_gw, memory)
        for gw in order:
            gw_cpu[gw.name].append(_cpu_window(gw, shape, 1))
    med = {name: statistics.median(v) for name, v in gw_cpu.items()}
    return {
        "concurrency": 1,
        "idle_window_s": idle_s,
        "idle_commands_per_s": {n: c / idle_s for n, c in sorted(idle.commands.items())},
        "idle_cpu_us_per_s": idle.cpu_s / idle_s * 1e6,
        "windows": windows,
        "gateway_cpu_us_per_request_rounds": gw_cpu,
        "gateway_cpu_us_per_request": med,
        # None when the windows were too short for /proc's 10 ms CPU ticks
        "redis_over_memory": med[redis_gw.name] / med[memory.name] if med[memory.name] else None,
    }


def _run(args: argparse.Namespace, logs: Path, procs: list[Proc]) -> dict[str, Any]:
    up_port = free_port()
    up_argv = [sys.executable, "-m", "bench.zero_upstream", "--port", str(up_port)]
    upstream = Proc("upstream", up_argv, logs / "upstream.log").start(ROOT)
    procs.append(upstream)
    up_url = f"http://127.0.0.1:{up_port}"
    wait_http_ok(up_url + "/health", upstream, 30)
    memory = _start_gateway("gateway", up_url, logs, None)
    procs.append(memory.proc)
    scale = 4 if args.quick else 1
    shapes = [
        Shape("agent-400KB", agent_body(), 400 // scale, args.concurrency),
        Shape("small", small_body(False), 3000 // scale, args.concurrency),
    ]
    out_dir = Path(args.out)
    results = [
        profile_shape(memory, s, args.rounds, i + 1, out_dir)
        for i, s in enumerate(shapes)
        if not args.only_redis
    ]
    out: dict[str, Any] = {"shapes": results}
    if not args.no_redis:
        port = free_port()
        procs.append(start_redis(logs, port))
        config = logs / "gateway-redis.yaml"
        url = f"redis://127.0.0.1:{port}/0"
        config.write_text(f"state:\n  backend: redis\n  redis:\n    url: {url}\n")
        redis_gw = _start_gateway("gateway-redis", up_url, logs, config)
        procs.append(redis_gw.proc)
        small = Shape("small", small_body(False), args.redis_requests // scale, 1)
        out["redis"] = redis_costs(memory, redis_gw, port, small, args.rounds)
    return out


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = run_manifest(args)
    procs: list[Proc] = []
    with tempfile.TemporaryDirectory(prefix="gw-profile-") as tmp:
        try:
            data = _run(args, Path(tmp), procs)
        finally:
            for proc in reversed(procs):
                proc.stop()
    data["manifest"] = {**manifest, "loadavg_after": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    (out_dir / "profile-request.json").write_text(json.dumps(data, indent=1) + "\n")
    (out_dir / "profile-request.md").write_text(markdown(data))
    print((out_dir / "profile-request.md").read_text())


if __name__ == "__main__":
    main()
