"""Gateway overhead: the same load direct to a zero-delay upstream, through
the gateway, and (when installed) through vllm-router, in one run.

    .venv/bin/python -m bench.overhead [--quick] [--concurrency 1,32,256]
        [--vllm-router PATH] [--gateway-uvicorn] [--floor] [--gateway-compiled TREE]
        [--gateway-tree LABEL=TREE ...] [--rounds 3] [--out bench/results]

Every server runs in its own process on 127.0.0.1; the load generator is
this process (aiohttp on uvloop). For every scenario (small / ~400 KB agent
body non-streaming, 200-chunk streaming) × concurrency, the targets run
back to back, so ratios come from one run; the measured time of a cell is
split into `--rounds` windows per target, interleaved (A B C, C B A, ...),
and summed, so a burst of other work on the shared machine lands on every
target alike instead of on whichever ran at that moment. Proxy CPU is
utime+stime of the proxy's process tree from /proc/<pid>/stat over the
measured windows only.
Writes overhead.json and overhead.md to --out. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.loadgen import LoadResult, agent_body, make_session, merge_results, run_load, small_body
from bench.manifest import manifest
from bench.overhead_report import markdown, row_from, summarize
from bench.paths import repo_relative
from bench.procs import Proc, self_cpu_seconds, tree_cpu_seconds, wait_http_ok
from gateway.http.serving import free_port

ROOT = Path(__file__).resolve().parent.parent
STREAM_CHUNKS = 200


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    body: bytes
    stream: bool
    concurrency: int


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    url: str
    proc: Proc | None  # the proxy process whose CPU is measured (None: direct)
    #: the gateway's `gateway_build_info{compiled}` ("true" / "false"); None when not a gateway
    compiled: str | None = None
    tree: Path | None = None  # the source tree it runs from (None: this one, as installed)
    #: the redis-server the gateway keeps its state in (the gateway-redis row)
    redis_port: int | None = None


@dataclass(frozen=True, slots=True)
class Budget:
    warmup_s: float  # before a target's first window in a cell
    rewarm_s: float  # before each later window
    measure_s: float  # per window
    rounds: int
    grace_s: float
    max_requests: int


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--quick", action="store_true", help="short run (~1.5 minutes)")
    p.add_argument("--concurrency", default="1,32,256")
    p.add_argument(
        "--vllm-router",
        default=None,
        help="vllm-router binary (default: `vllm-router` on PATH, else skipped)",
    )
    p.add_argument(
        "--gateway-uvicorn",
        action="store_true",
        help="add a row: the same gateway with its public listener on uvicorn instead of the lean "
        "server (bench/gateway_proc.py --server uvicorn)",
    )
    p.add_argument(
        "--gateway-redis",
        action="store_true",
        help="add a row: the same gateway with state.backend redis (a redis-server of its own on "
        "loopback); reports Redis round trips per request",
    )
    p.add_argument(
        "--gateway-compiled",
        metavar="TREE",
        default=None,
        help="add a row: the same gateway from a compiled tree (mypyc, built in place by "
        "`python scripts/build_compiled.py TREE`), run from TREE",
    )
    p.add_argument(
        "--gateway-tree",
        metavar="LABEL=TREE",
        action="append",
        default=[],
        help="add a row LABEL: `python -m gateway serve` run from another source tree, e.g. a "
        "git worktree of an older commit or a compiled copy of one (builds compared in one "
        "run); repeatable",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="add a row: the gateway's HTTP server and upstream client with no pipeline "
        "(bench/floor_proxy.py), to split the gateway's CPU into substrate and pipeline",
    )
    p.add_argument(
        "--measure-s",
        type=float,
        default=None,
        help="override seconds measured per cell and target",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved measuring windows per cell and target (their sum is reported)",
    )
    args = p.parse_args(argv)
    args.concurrency_list = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if (
        not args.concurrency_list
        or min(args.concurrency_list) < 1
        or max(args.concurrency_list) > 1024
    ):
        p.error("--concurrency: comma-separated integers in 1..1024")
    if not 1 <= args.rounds <= 20:
        p.error("--rounds: an integer in 1..20")
    args.trees = _parse_trees(p, args.gateway_tree)
    return args


_OWN_ROWS = (
    "direct",
    "gateway",
    "gateway-uvicorn",
    "gateway-compiled",
    "gateway-redis",
    "floor",
    "vllm-router",
)


def _parse_trees(p: argparse.ArgumentParser, specs: list[str]) -> dict[str, str]:
    """LABEL → absolute path of each `--gateway-tree` (kept as str: the args go to the manifest)."""
    trees: dict[str, str] = {}
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            p.error(f"--gateway-tree {spec!r}: expected LABEL=TREE")
        if label in _OWN_ROWS or label in trees:
            p.error(f"--gateway-tree {spec!r}: the row name {label!r} is taken")
        tree = Path(path).resolve()
        if not (tree / "gateway" / "__main__.py").is_file():
            p.error(f"--gateway-tree {spec!r}: {tree} holds no gateway package")
        trees[label] = str(tree)
    return trees


def _budget(args: argparse.Namespace) -> Budget:
    measure = args.measure_s or (1.5 if args.quick else 5.0)
    return Budget(
        warmup_s=0.3 if args.quick else 1.0,
        rewarm_s=0.2 if args.quick else 0.3,
        measure_s=measure / args.rounds,
        rounds=args.rounds,
        grace_s=3.0 if args.quick else 8.0,
        max_requests=50_000,
    )


def _find_router(flag: str | None) -> str | None:
    if flag:
        return flag if Path(flag).exists() or shutil.which(flag) else None
    return shutil.which("vllm-router")


def _start_servers(
    args: argparse.Namespace, logs: Path, router_bin: str | None, procs: list[Proc]
) -> list[Target]:
    """Start upstream, gateway(s), router; every started process is appended to
    `procs` first, so the caller can stop it whatever happens next."""
    up_port = free_port()
    up_argv = [
        sys.executable,
        "-m",
        "bench.zero_upstream",
        "--port",
        str(up_port),
        "--chunks",
        str(STREAM_CHUNKS),
    ]
    upstream = _spawn(procs, Proc("upstream", up_argv, logs / "upstream.log"))
    up_url = f"http://127.0.0.1:{up_port}"
    wait_http_ok(up_url + "/health", upstream, 30)
    targets = [Target("direct", up_url, None)]
    launcher = [sys.executable, "-m", "bench.gateway_proc"]
    targets.append(_start_gateway("gateway", _gateway_argv(args), up_url, logs, procs))
    if args.gateway_uvicorn:
        targets.append(
            _start_gateway(
                "gateway-uvicorn", [*launcher, "--server", "uvicorn"], up_url, logs, procs
            )
        )
    if args.gateway_redis:
        targets.append(_start_redis_gateway(_gateway_argv(args), up_url, logs, procs))
    if args.gateway_compiled:
        targets.append(_start_compiled(Path(args.gateway_compiled).resolve(), up_url, logs, procs))
    for label, tree in args.trees.items():
        targets.append(_start_tree(label, Path(tree), up_url, logs, procs))
    if args.floor:
        targets.append(
            _start_gateway(
                "floor",
                [sys.executable, "-m", "bench.floor_proxy"],
                up_url,
                logs,
                procs,
                gateway=False,
            )
        )
    if router_bin:
        port, prom = free_port(), free_port()
        router = _spawn(
            procs,
            Proc(
                "vllm-router",
                [
                    router_bin,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--worker-urls",
                    up_url,
                    "--policy",
                    "round_robin",
                    "--disable-retries",
                    "--disable-circuit-breaker",
                    "--prometheus-host",
                    "127.0.0.1",
                    "--prometheus-port",
                    str(prom),
                    "--worker-startup-check-interval",
                    "1",
                    "--worker-startup-timeout-secs",
                    "30",
                    "--health-check-interval-secs",
                    "60",
                ],
                logs / "vllm-router.log",
            ),
        )
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(url + "/health", router, 40)
        targets.append(Target("vllm-router", url, router))
    return targets


def _gateway_argv(args: argparse.Namespace) -> list[str]:
    """`gateway serve` if the CLI starts; else the equivalent bench launcher."""
    gw_bin = str(Path(sys.executable).parent / "gateway")
    try:
        ok = (
            subprocess.run(
                [gw_bin, "serve", "--help"], capture_output=True, timeout=30, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if ok:
        args.gateway_launcher = "gateway serve"
        return [gw_bin, "serve"]
    print(
        "note: `gateway serve --help` failed; running the same app via bench/gateway_proc.py",
        flush=True,
    )
    args.gateway_launcher = "bench.gateway_proc --server lean"
    return [sys.executable, "-m", "bench.gateway_proc", "--server", "lean"]


def _start_redis_gateway(argv: list[str], up_url: str, logs: Path, procs: list[Proc]) -> Target:
    """The same gateway with `state.backend: redis` (a redis-server of its own,
    no persistence, on loopback): the cost of shared state."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--gateway-redis: redis-server is not on PATH")
    port = free_port()
    redis_argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    redis_argv += ["--appendonly", "no", "--dir", str(logs)]
    _spawn(procs, Proc("redis-server", redis_argv, logs / "redis.log"))
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    config = logs / "gateway-redis.yaml"
    url = f"redis://127.0.0.1:{port}/0"
    config.write_text(f"state:\n  backend: redis\n  redis:\n    url: {url}\n")
    target = _start_gateway("gateway-redis", [*argv, "--config", str(config)], up_url, logs, procs)
    return Target(target.name, target.url, target.proc, target.compiled, redis_port=port)


_ROUND_TRIP_COMMANDS = ("evalsha", "eval", "script", "get", "getex", "set", "ping")


def _redis_commands(port: int) -> float:
    """Round trips the gateway made to its redis-server: the top-level commands
    it sends (each script is one EVALSHA; the commands a script runs inside
    Redis, which `total_commands_processed` would also count, are not)."""
    stats = redis.Redis(port=port).info("commandstats")
    return float(sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in _ROUND_TRIP_COMMANDS))


def _start_compiled(tree: Path, up_url: str, logs: Path, procs: list[Proc]) -> Target:
    """`python -m gateway serve` run from `tree`, whose compiled modules (built in
    place) shadow its sources; refuses a tree whose gateway does not run compiled."""
    target = _start_tree("gateway-compiled", tree, up_url, logs, procs)
    if target.compiled != "true":
        raise SystemExit(
            f"--gateway-compiled {tree}: its gateway runs pure Python "
            f"(gateway_build_info compiled={target.compiled}); build it with "
            f"`python scripts/build_compiled.py {tree}`"
        )
    return target


def _start_tree(name: str, tree: Path, up_url: str, logs: Path, procs: list[Proc]) -> Target:
    """`python -m gateway serve` run from `tree` (its own sources, and its compiled
    modules if it was built in place), with this tree's interpreter and packages."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    target = _start_gateway(
        name, [sys.executable, "-m", "gateway", "serve"], up_url, logs, procs, env=env, cwd=tree
    )
    return Target(target.name, target.url, target.proc, target.compiled, tree)


def _start_gateway(
    name: str,
    argv: list[str],
    up_url: str,
    logs: Path,
    procs: list[Proc],
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    gateway: bool = True,
) -> Target:
    """Start a proxy; a gateway's build (compiled or not) is read from its admin /metrics."""
    port, admin = free_port(), free_port()
    proc = _spawn(
        procs,
        Proc(
            name,
            [*argv, "--replica", f"vllm={up_url}", "--port", str(port), "--admin-port", str(admin)],
            logs / f"{name}.log",
            env=env,
            cwd=cwd,
        ),
    )
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(url + "/readyz", proc, 40)
    return Target(
        name, url, proc, _compiled_flag(f"http://127.0.0.1:{admin}/metrics") if gateway else None
    )


def _compiled_flag(metrics_url: str) -> str | None:
    """`compiled` of the gateway's `gateway_build_info`, or None (no such metric;
    the admin listener may come up a moment after the public one)."""
    text = ""
    for _ in range(50):
        try:
            with urllib.request.urlopen(metrics_url, timeout=5.0) as resp:
                text = resp.read().decode()
            break
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    for line in text.splitlines():
        if line.startswith("gateway_build_info{") and 'compiled="' in line:
            return line.split('compiled="', 1)[1].split('"', 1)[0]
    return None


def _spawn(procs: list[Proc], proc: Proc) -> Proc:
    procs.append(proc)
    return proc.start(ROOT)


async def _measure(
    target: Target, sc: Scenario, budget: Budget, upstream: Proc, warmup_s: float
) -> tuple[LoadResult, dict[str, float]]:
    """One measuring window on `target`, after `warmup_s` of the same load."""
    url = target.url + "/v1/chat/completions"
    async with make_session(max(64, sc.concurrency * 2)) as session:
        warm_n = max(sc.concurrency, 20)
        await run_load(
            session, url, sc.body, sc.stream, sc.concurrency, warm_n, warmup_s, budget.grace_s
        )
        before = _cpu_snapshot(target, upstream)
        res = await run_load(
            session,
            url,
            sc.body,
            sc.stream,
            sc.concurrency,
            budget.max_requests,
            budget.measure_s,
            budget.grace_s,
        )
        after = _cpu_snapshot(target, upstream)
    if res.unfinished:
        await asyncio.sleep(1.0)  # let the proxy finish aborting before the next cell
    return res, {k: after[k] - before[k] for k in after}


async def _measure_cell(
    targets: list[Target], sc: Scenario, budget: Budget, upstream: Proc
) -> list[dict[str, Any]]:
    """Every target, `budget.rounds` windows each, in alternating order; one row
    per target from the windows' sum."""
    windows: dict[str, list[tuple[LoadResult, dict[str, float]]]] = {t.name: [] for t in targets}
    for rnd in range(budget.rounds):
        for target in targets if rnd % 2 == 0 else targets[::-1]:
            if target.proc is not None and not target.proc.alive():
                raise RuntimeError(f"{target.name} died:\n{target.proc.log_tail()}")
            warmup = budget.warmup_s if rnd == 0 else budget.rewarm_s
            windows[target.name].append(await _measure(target, sc, budget, upstream, warmup))
    rows = []
    for target in targets:
        res = merge_results([w[0] for w in windows[target.name]])
        cpu = {k: sum(w[1][k] for w in windows[target.name]) for k in windows[target.name][0][1]}
        row = row_from(target.name, sc.name, sc.concurrency, sc.stream, res, cpu)
        if "redis_commands" in cpu:
            row["redis_round_trips_per_req"] = round(cpu["redis_commands"] / max(res.ok, 1), 2)
        rows.append(row)
    return rows


def _cpu_snapshot(target: Target, upstream: Proc) -> dict[str, float]:
    snap = {"client": self_cpu_seconds(), "upstream": tree_cpu_seconds(upstream.pid)}
    snap["proxy"] = tree_cpu_seconds(target.proc.pid) if target.proc is not None else 0.0
    if target.redis_port is not None:
        snap["redis_commands"] = _redis_commands(target.redis_port)
    return snap


async def _run_all(
    args: argparse.Namespace, targets: list[Target], upstream: Proc
) -> list[dict[str, Any]]:
    budget = _budget(args)
    kinds = [
        ("small", small_body(False), False),
        ("agent400k", agent_body(), False),
        ("stream200", small_body(True), True),
    ]
    rows: list[dict[str, Any]] = []
    for name, body, stream in kinds:
        for conc in args.concurrency_list:
            for row in await _measure_cell(
                targets, Scenario(name, body, stream, conc), budget, upstream
            ):
                rows.append(row)
                print(
                    f"{name:10s} c={conc:<4d} {row['target']:16s} {row['rps']:9.1f} req/s  "
                    f"p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms  "
                    f"proxy {row['proxy_cpu_us_per_req']} us/req  errors {row['errors']}  "
                    f"unfinished {row['unfinished']}",
                    flush=True,
                )
    return rows


def _build_of(target: Target) -> dict[str, Any]:
    tree = target.tree or ROOT
    commit = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    ).stdout.strip()
    return {"compiled": target.compiled, "tree": str(tree), "commit": commit or None}


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # so `finally` stops every server we started


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    args = _parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    router_bin = _find_router(args.vllm_router)
    if router_bin is None:
        print(
            "note: vllm-router not found (--vllm-router PATH or on PATH); skipping its "
            "reference row",
            flush=True,
        )
    started = time.time()
    logs = Path(tempfile.mkdtemp(prefix="overhead-logs-"))
    procs: list[Proc] = []
    try:
        targets = _start_servers(args, logs, router_bin, procs)
        upstream = procs[0]
        meta = manifest(args, router_bin, {t.name: t.url for t in targets})
        meta["builds"] = {t.name: _build_of(t) for t in targets if t.compiled is not None}
        for name, build in meta["builds"].items():
            print(
                f"{name}: compiled={build['compiled']} from {build['tree']} ({build['commit']})",
                flush=True,
            )
        _install_uvloop()
        rows = asyncio.run(_run_all(args, targets, upstream))
    finally:
        for proc in reversed(procs):
            proc.stop()
    meta["duration_s"] = round(time.time() - started, 1)
    meta["server_logs"] = str(logs)
    result = repo_relative({"manifest": meta, "rows": rows, "summary": summarize(rows)})
    (out / "overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "overhead.md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {out / 'overhead.json'} and {out / 'overhead.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
