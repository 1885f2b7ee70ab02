"""Routing benchmark: the same simulated cluster, one run per policy and workload.

    .venv/bin/python -m bench.routing            # full run (~10 min on 2 cores)
    .venv/bin/python -m bench.routing --quick    # smoke run

4 simulated vLLM replicas (one subprocess, accelerated time) behind one
gateway (this process) with admission off, so only routing differs. Workloads:
the Mooncake trace (subset, time-scaled), a synthetic agent workload
(sessions resending their growing history) and prompts sharing nothing.
Per policy: prefix cache hit rate in tokens (simulator counters), the same
relative to an unbounded single cache (oracle), TTFT p50/p99 and throughput
in simulated seconds, preemptions, max/mean requests per replica. Also the
cost of hashing and ranking a 400 KB prompt. Writes bench/results/routing.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.routing_costs import hashing_costs
from bench.routing_report import write_reports
from bench.routing_workloads import (
    AgentSession,
    AgentSpec,
    OpenRequest,
    Oracle,
    load_trace,
    unique_workload,
)
from gateway.config.scheduling import SchedulingConfig
from gateway.config.schema import (
    AdmissionConfig,
    GatewayConfig,
    HealthConfig,
    ListenConfig,
    ReplicaConfig,
    TimeoutsConfig,
)
from gateway.http.serving import BackgroundServers, free_port

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
POLICIES = ("round-robin", "least-load", "session-hash", "default")
REPLICAS = 4


@dataclasses.dataclass(frozen=True, slots=True)
class Sim:
    speed: float
    kv_tokens: int
    max_model_len: int = 131072


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Routing benchmark (see module docstring).")
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--workloads", default="agent,trace,unique")
    p.add_argument("--speed", type=float, default=10.0, help="simulator speed-up")
    p.add_argument("--kv-tokens", type=int, default=655360, help="KV pool per replica")
    p.add_argument("--trace-requests", type=int, default=600)
    p.add_argument("--trace-time-scale", type=float, default=1.0)
    p.add_argument("--agent-sessions", type=int, default=24)
    p.add_argument("--agent-turns", type=int, default=14)
    p.add_argument("--unique-requests", type=int, default=240)
    p.add_argument("--unique-rate", type=float, default=4.0, help="requests per simulated second")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    p.add_argument("--serve-sim", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.trace_requests, args.agent_sessions, args.agent_turns, args.unique_requests = (
            60,
            6,
            4,
            40,
        )
    return args


# --- simulator subprocess -------------------------------------------------------------


def serve_sim(args: argparse.Namespace) -> None:
    from gateway.sim.cluster import SimCluster

    sim = Sim(args.speed, args.kv_tokens)
    with SimCluster.start(
        REPLICAS,
        speed=sim.speed,
        kv_tokens=sim.kv_tokens,
        max_model_len=sim.max_model_len,
        max_num_seqs=64,
    ) as cluster:
        print(json.dumps(cluster.urls), flush=True)
        sys.stdin.read()  # until the parent closes our stdin


def start_sim(args: argparse.Namespace) -> tuple[subprocess.Popen[str], list[str]]:
    cmd = [
        sys.executable,
        "-m",
        "bench.routing",
        "--serve-sim",
        "--speed",
        str(args.speed),
        "--kv-tokens",
        str(args.kv_tokens),
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError("the simulator did not start")
    return proc, json.loads(line)


def stop_sim(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


# --- one run ------------------------------------------------------------------------------


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str, oracle: Oracle) -> None:
        self._session = session
        self._url = url
        self.oracle = oracle
        self.errors = 0
        self.placed: dict[str, int] = {}

    async def send(
        self, endpoint: str, body: dict[str, Any], session_key: str | None = None
    ) -> str:
        self.oracle.observe(endpoint, body)
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        headers = {"x-session-id": session_key} if session_key else {}
        text: list[str] = []
        timeout = aiohttp.ClientTimeout(total=600, sock_connect=10)
        async with self._session.post(
            self._url + path, json=body, headers=headers, timeout=timeout
        ) as resp:
            replica = resp.headers.get("x-gateway-replica", "?")
            self.placed[replica] = self.placed.get(replica, 0) + 1
            if resp.status != 200:
                self.errors += 1
                await resp.read()
                return ""
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    for choice in json.loads(line[6:]).get("choices") or ():
                        text.append(
                            choice.get("delta", {}).get("content") or choice.get("text") or ""
                        )
        return "".join(text)


async def run_open(
    client: Client, requests: list[OpenRequest], endpoint: str, speed: float
) -> None:
    start = time.monotonic()

    async def one(req: OpenRequest) -> None:
        await asyncio.sleep(max(0.0, start + req.at_s / speed - time.monotonic()))
        await client.send(endpoint, req.body)

    await asyncio.gather(*(one(r) for r in requests))


async def run_agents(client: Client, spec: AgentSpec, speed: float) -> None:
    async def loop(index: int) -> None:
        session = AgentSession(spec, index)
        await asyncio.sleep(spec.start_spread_s * index / max(1, spec.sessions) / speed)
        for turn in range(spec.turns):
            answer = await client.send("chat", session.body(), session.key)
            session.advance(answer, turn)

    await asyncio.gather(*(loop(i) for i in range(spec.sessions)))


def gateway_config(urls: list[str], policy: str, sim: Sim) -> GatewayConfig:
    replicas = tuple(
        ReplicaConfig(url=u, name=f"replica-{i}", kind="vllm") for i, u in enumerate(urls)
    )
    sched = SchedulingConfig(
        policy=policy, default_capacity_tokens=sim.kv_tokens, default_prefill_rate=16000.0
    )
    return GatewayConfig(
        listen=ListenConfig(port=free_port(), admin_port=free_port()),
        replicas=replicas,
        scheduling=sched,
        admission=AdmissionConfig(enabled=False),
        # generous: a CPU-starved simulator must not look dead mid-run
        health=HealthConfig(interval_s=1.0, timeout_s=10.0, unhealthy_after=10, healthy_after=1),
        timeouts=dataclasses.replace(TimeoutsConfig(), total_s=900.0),
    )


async def sim_stats(session: aiohttp.ClientSession, urls: list[str]) -> list[dict[str, Any]]:
    out = []
    for url in urls:
        async with session.get(url + "/sim/stats", timeout=aiohttp.ClientTimeout(total=60)) as resp:
            out.append(await resp.json())
    return out


async def reset_sims(session: aiohttp.ClientSession, urls: list[str]) -> None:
    for url in urls:
        async with session.post(
            url + "/sim/reset", json={"clear_cache": True}, timeout=aiohttp.ClientTimeout(total=30)
        ) as resp:
            await resp.read()


def run_one(
    args: argparse.Namespace, urls: list[str], policy: str, workload: str, data: Any
) -> dict[str, Any]:
    from gateway.app import create_app

    sim = Sim(args.speed, args.kv_tokens)
    cfg = gateway_config(urls, policy, sim)
    gw = create_app(cfg)
    servers = BackgroundServers(gw.listeners())

    async def go() -> dict[str, Any]:
        conn = aiohttp.TCPConnector(limit=256)
        async with aiohttp.ClientSession(connector=conn) as session:
            await reset_sims(session, urls)
            client = Client(session, f"http://{cfg.listen.host}:{cfg.listen.port}", Oracle())
            started = time.monotonic()
            if workload == "agent":
                await run_agents(client, data, args.speed)
            else:
                await run_open(client, data, "completions", args.speed)
            wall = time.monotonic() - started
            stats = await sim_stats(session, urls)
        return summarize(policy, workload, stats, client, wall, args.speed)

    with servers:
        _wait_healthy(gw, len(urls))
        return asyncio.run(go())


def _wait_healthy(gw: Any, n: int) -> None:
    end = time.monotonic() + 20
    while time.monotonic() < end and len(gw.registry.healthy()) < n:
        time.sleep(0.05)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(
    policy: str,
    workload: str,
    stats: list[dict[str, Any]],
    client: Client,
    wall: float,
    speed: float,
) -> dict[str, Any]:
    totals = [s["totals"] for s in stats]
    records = [r for s in stats for r in s["requests"]]
    ttft = [r["first_token"] - r["arrival"] for r in records if r["first_token"] is not None]
    prompt = sum(t["prompt_tokens"] for t in totals)
    hits = sum(t["prefix_hits_tokens"] for t in totals)
    per_replica = [len(s["requests"]) for s in stats]
    busy = [t["busy_time"] for t in totals]
    hit_rate = hits / prompt if prompt else 0.0
    oracle = client.oracle.hit_rate
    return {
        "policy": policy,
        "workload": workload,
        "requests": len(records),
        "errors": client.errors,
        "prompt_tokens": prompt,
        "hit_tokens": hits,
        "hit_rate": hit_rate,
        "oracle_hit_rate": oracle,
        "hit_vs_oracle": hit_rate / oracle if oracle else None,
        "ttft_p50_s": _pct(ttft, 0.5),
        "ttft_p99_s": _pct(ttft, 0.99),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
        "throughput_tokens_per_s": sum(t["generation_tokens"] for t in totals) / (wall * speed),
        "throughput_requests_per_s": len(records) / (wall * speed),
        "preemptions": sum(t["preemptions"] for t in totals),
        "requests_per_replica": per_replica,
        "max_mean_load": max(per_replica) / statistics.fmean(per_replica)
        if any(per_replica)
        else None,
        "busy_s_per_replica": [round(b, 2) for b in busy],
        "max_mean_busy": max(busy) / statistics.fmean(busy) if any(busy) else None,
        "wall_s": round(wall, 2),
        "simulated_s": round(wall * speed, 1),
        "slowest": _slowest(records),
    }


def _slowest(records: list[dict[str, Any]], n: int = 5) -> list[dict[str, Any]]:
    """The requests behind the TTFT tail: how long, how big, how much was cached, queued for how "
    "long."""
    done = [r for r in records if r["first_token"] is not None]
    done.sort(key=lambda r: r["first_token"] - r["arrival"], reverse=True)
    return [
        {
            "ttft_s": round(r["first_token"] - r["arrival"], 2),
            "prompt_tokens": r["prompt_tokens"],
            "cached_tokens": r["cached_tokens"],
            "queued_s": None if r["scheduled"] is None else round(r["scheduled"] - r["arrival"], 2),
        }
        for r in done[:n]
    ]


def build_workloads(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    chosen = args.workloads.split(",")
    data: dict[str, Any] = {}
    notes: dict[str, str] = {}
    if "agent" in chosen:
        spec = AgentSpec(sessions=args.agent_sessions, turns=args.agent_turns)
        data["agent"] = spec
        notes["agent"] = (
            f"{spec.sessions} concurrent sessions x {spec.turns} turns; shared system prompt of "
            f"{spec.system_tokens} tokens, task {spec.task_tokens}, tool results "
            f"{spec.tool_min}-{spec.tool_max} tokens per turn, {spec.output_tokens} output tokens; "
            f"starts spread over {spec.start_spread_s:g} simulated s"
        )
    if "trace" in chosen:
        trace = load_trace(args.trace, args.trace_requests, args.trace_time_scale, 120000, 512)
        data["trace"] = trace.requests
        notes["trace"] = trace.scaling
    if "unique" in chosen:
        data["unique"] = unique_workload(
            args.unique_requests, args.unique_rate, 2000, 16000, 64, seed=3
        )
        notes["unique"] = (
            f"{args.unique_requests} prompts of 2000-16000 unique tokens, Poisson "
            f"{args.unique_rate:g}/simulated s, 64 output tokens"
        )
    return data, notes


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.serve_sim:
        serve_sim(args)
        return 0
    t_start = time.monotonic()
    data, notes = build_workloads(args)
    proc, urls = start_sim(args)
    results: list[dict[str, Any]] = []
    try:
        for workload in data:
            for policy in args.policies.split(","):
                row = run_one(args, urls, policy, workload, data[workload])
                results.append(row)
                print(
                    json.dumps(
                        {
                            k: row[k]
                            for k in (
                                "workload",
                                "policy",
                                "hit_rate",
                                "hit_vs_oracle",
                                "ttft_p99_s",
                                "max_mean_load",
                                "wall_s",
                            )
                        }
                    ),
                    flush=True,
                )
    finally:
        stop_sim(proc)
    setup = {
        "replicas": REPLICAS,
        "speed": args.speed,
        "kv_tokens_per_replica": args.kv_tokens,
        "prefill_tokens_per_s_per_replica": 16000,
        "admission": "off (routing only)",
        "command": " ".join(
            [".venv/bin/python -m bench.routing", *(sys.argv[1:] if argv is None else argv)]
        ),
        "total_wall_s": round(time.monotonic() - t_start, 1),
    }
    write_reports(
        args.out,
        {"setup": setup, "workloads": notes, "hashing": hashing_costs(), "results": results},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
