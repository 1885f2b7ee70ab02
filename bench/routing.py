"""Routing benchmark: the same simulated cluster, one run per policy and workload.

    .venv/bin/python -m bench.routing            # full run (~10 min on 2 cores)
    .venv/bin/python -m bench.routing --quick    # smoke run
    .venv/bin/python -m bench.routing --vllm-router /tmp/vrenv/bin/vllm-router \\
        --instances 1,2,4                        # + vllm-router rows, 1/2/4 gateway processes

4 simulated vLLM replicas (one subprocess, accelerated time). In front of
them, per row: the gateway in this process with admission off (so only
routing differs) under one policy or config variant (`--variant
NAME=JSON`, merged into the `scheduling` section), vllm-router under one of
its policies, or N gateway processes sharing a private redis-server
(`--instances`), the load generator round-robining requests over them.
Workloads: the Mooncake trace (subset, time-scaled), agent sessions
resending their growing history (`agent`, with a session key;
`agent-nokey`), a fleet of agent sessions sharing one long system prompt
with long streamed answers (`fleet`, without a key; `fleet-key`), and prompts
sharing nothing (`unique`). Per row: prefix cache hit rate in tokens
(simulator counters), relative to an unbounded single cache (oracle) and to
one LRU cache of all replicas' KV pooled, TTFT and ITL p50/p99 in simulated
seconds, max/mean requests (and output tokens, busy time) per replica.
Also the cost of hashing and ranking a 400 KB prompt. Writes
bench/results/routing.{json,md,png} (`--name` changes the file name).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

import gateway
from bench.manifest import router_record
from bench.routing_costs import hashing_costs
from bench.routing_report import write_reports
from bench.routing_stats import RowKey, index_expected, summarize
from bench.routing_targets import (
    Front,
    find_vllm_router,
    flush_redis,
    gateway_config,
    gateway_processes,
    in_process_gateway,
    redis_server,
    vllm_router,
)
from bench.routing_workloads import Oracle, Workload, build_workloads

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
POLICIES = (
    "round-robin",
    "least-load",
    "session-hash",
    "default",
    "vllm-router:cache_aware",
    "vllm-router:round_robin",
)
REPLICAS = 4
PREFILL_RATE = 16000.0
MAX_MODEL_LEN = 131072


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Routing benchmark (see module docstring).")
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--name", default="routing", help="output file name (without extension)")
    p.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "bench-routing-logs")
    p.add_argument("--policies", default=",".join(POLICIES), help="+variants: every variant")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=JSON")
    p.add_argument("--variants-file", type=Path, help="JSON object: variant name -> scheduling")
    p.add_argument("--workloads", default="agent,fleet,trace,unique")
    p.add_argument("--vllm-router", metavar="PATH", help="vllm-router binary (else rows skipped)")
    p.add_argument("--instances", default="", help="e.g. 1,2,4: gateway processes per row")
    p.add_argument("--instance-workloads", default="agent,agent-nokey,fleet")
    p.add_argument("--instance-policies", default="default")
    p.add_argument("--speed", type=float, default=10.0, help="simulator speed-up")
    p.add_argument("--kv-tokens", type=int, default=655360, help="KV pool per replica")
    p.add_argument("--trace-requests", type=int, default=600)
    p.add_argument("--trace-time-scale", type=float, default=1.0)
    p.add_argument("--trace-endpoint", choices=("chat", "completions"), default="chat")
    p.add_argument("--agent-sessions", type=int, default=24)
    p.add_argument("--agent-turns", type=int, default=14)
    p.add_argument("--fleet-sessions", type=int, default=16)
    p.add_argument("--fleet-turns", type=int, default=5)
    p.add_argument("--unique-requests", type=int, default=240)
    p.add_argument("--unique-rate", type=float, default=4.0, help="requests per simulated second")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    p.add_argument("--serve-sim", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.trace_requests, args.agent_sessions, args.agent_turns = 60, 6, 4
        args.unique_requests, args.fleet_sessions, args.fleet_turns = 40, 8, 2
    args.variants = json.loads(args.variants_file.read_text()) if args.variants_file else {}
    args.variants.update(_variant(p, v) for v in args.variant)
    return args


def _variant(p: argparse.ArgumentParser, spec: str) -> tuple[str, dict[str, Any]]:
    name, sep, raw = spec.partition("=")
    try:
        value = json.loads(raw) if sep else None
    except json.JSONDecodeError as exc:
        p.error(f"--variant {name}: invalid JSON: {exc}")
    if not name or not isinstance(value, dict):
        p.error(f"--variant wants NAME=JSON object, got {spec!r}")
    return name, value


# --- simulator subprocess -------------------------------------------------------------


def serve_sim(args: argparse.Namespace) -> None:
    from gateway.sim.cluster import SimCluster

    with SimCluster.start(
        REPLICAS,
        speed=args.speed,
        kv_tokens=args.kv_tokens,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=64,
    ) as cluster:
        print(json.dumps(cluster.urls), flush=True)
        sys.stdin.read()  # until the parent closes our stdin


@contextlib.contextmanager
def sim_cluster(args: argparse.Namespace) -> Iterator[list[str]]:
    cmd = [sys.executable, "-m", "bench.routing", "--serve-sim"]
    cmd += ["--speed", str(args.speed), "--kv-tokens", str(args.kv_tokens)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the simulator did not start")
        yield json.loads(line)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


# --- load generation ----------------------------------------------------------------------


class Client:
    """Sends each request to the next front end in turn (round-robin)."""

    def __init__(self, session: aiohttp.ClientSession, fronts: list[str], oracle: Oracle) -> None:
        self._session = session
        self._fronts = fronts
        self._next = 0
        self.oracle = oracle
        self.errors = 0

    async def send(
        self, endpoint: str, body: dict[str, Any], session_key: str | None = None
    ) -> str:
        self.oracle.observe(endpoint, body)
        url = self._fronts[self._next % len(self._fronts)]
        self._next += 1
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        headers = {"x-session-id": session_key} if session_key else {}
        text: list[str] = []
        timeout = aiohttp.ClientTimeout(total=900, sock_connect=10)
        try:
            async with self._session.post(
                url + path, json=body, headers=headers, timeout=timeout
            ) as r:
                if r.status != 200:
                    self.errors += 1
                    await r.read()
                    return ""
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        for choice in json.loads(line[6:]).get("choices") or ():
                            delta = choice.get("delta") or {}
                            text.append(delta.get("content") or choice.get("text") or "")
        except aiohttp.ClientError as exc:
            self.errors += 1
            print(f"request failed: {exc!r}", flush=True)
            return ""
        answer = "".join(text)
        if endpoint == "chat":
            self.oracle.learn_answer(body, answer)
        return answer


async def drive(client: Client, workload: Workload, speed: float) -> None:
    if workload.sessions is not None:
        await _run_sessions(client, workload, speed)
        return
    start = time.monotonic()

    async def one(at_s: float, body: dict[str, Any]) -> None:
        await asyncio.sleep(max(0.0, start + at_s / speed - time.monotonic()))
        await client.send(workload.endpoint, body)

    await asyncio.gather(*(one(r.at_s, r.body) for r in workload.requests))


async def _run_sessions(client: Client, workload: Workload, speed: float) -> None:
    spec = workload.sessions
    assert spec is not None

    async def loop(index: int) -> None:
        session = workload.session(index)
        await asyncio.sleep(spec.start_spread_s * index / max(1, spec.sessions) / speed)
        for turn in range(spec.turns):
            key = session.key if spec.keyed else None
            answer = await client.send("chat", session.body(), key)
            session.advance(answer, turn)

    await asyncio.gather(*(loop(i) for i in range(spec.sessions)))


async def _sim_call(session: aiohttp.ClientSession, urls: list[str], reset: bool) -> list[Any]:
    out = []
    for url in urls:
        if reset:
            req = session.post(url + "/sim/reset", json={"clear_cache": True})
        else:
            req = session.get(url + "/sim/stats")
        async with req as resp:
            out.append(await resp.json() if not reset else await resp.read())
    return out


def run_row(
    args: argparse.Namespace,
    sim_urls: list[str],
    key: RowKey,
    front: contextlib.AbstractContextManager[Front],
    workload: Workload,
) -> dict[str, Any]:
    async def go(fronts: Front) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=120)
        # a new connection per request: no race with a server closing an idle keep-alive one
        conn = aiohttp.TCPConnector(limit=256, force_close=True)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            await _sim_call(session, sim_urls, reset=True)
            client = Client(session, fronts.urls, Oracle(REPLICAS * args.kv_tokens))
            started = time.monotonic()
            await drive(client, workload, args.speed)
            wall = time.monotonic() - started
            stats = await _sim_call(session, sim_urls, reset=False)
            expected = await index_expected(session, fronts.admin_urls)
        row = summarize(key, stats, client.oracle, client.errors, wall, args.speed)
        row["index_expected_hit_rate"] = expected
        return row

    with front as fronts:
        row = asyncio.run(go(fronts))
    print(json.dumps({k: row[k] for k in _PRINTED}), flush=True)
    return row


_PRINTED = (
    "workload",
    "policy",
    "instances",
    "hit_rate",
    "index_expected_hit_rate",
    "hit_vs_oracle",
    "hit_vs_pooled",
    "ttft_p50_s",
    "ttft_p99_s",
    "itl_p99_s",
    "max_mean_load",
    "wall_s",
)


# --- rows ------------------------------------------------------------------------------------


def scheduling(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    """The `scheduling` section of a row: the policy (or variant) with the cluster's sizes."""
    base: dict[str, Any] = {
        "policy": policy,
        "default_capacity_tokens": args.kv_tokens,
        "default_prefill_rate": PREFILL_RATE,
    }
    variant = args.variants.get(policy)
    if variant is not None:
        base["policy"] = "default"
        base.update(variant)
    return base


def policy_rows(
    args: argparse.Namespace, urls: list[str], workloads: dict[str, Workload]
) -> list[dict[str, Any]]:
    router = find_vllm_router(args.vllm_router)
    policies: list[str] = []
    for p in args.policies.split(","):
        policies += list(args.variants) if p == "+variants" else [p] if p else []
    if router is None and any(p.startswith("vllm-router:") for p in policies):
        why = "no --vllm-router PATH given" if not args.vllm_router else "not found"
        print(f"note: vllm-router rows skipped ({why}: {args.vllm_router})", flush=True)
        policies = [p for p in policies if not p.startswith("vllm-router:")]
    logs = args.logs
    rows = []
    for name, workload in workloads.items():
        if name not in args.workloads.split(","):
            continue
        for policy in policies:
            if policy.startswith("vllm-router:"):
                assert router is not None
                front = vllm_router(router, urls, policy.split(":", 1)[1], logs)
            else:
                front = in_process_gateway(gateway_config(urls, scheduling(args, policy)))
            kind = "vllm-router" if policy.startswith("vllm-router:") else "gateway"
            key = RowKey(policy, name, kind, 1, workload.keyed)
            rows.append(run_row(args, urls, key, front, workload))
    return rows


def instance_rows(
    args: argparse.Namespace, urls: list[str], workloads: dict[str, Workload]
) -> list[dict[str, Any]]:
    counts = [int(n) for n in args.instances.split(",") if n]
    if not counts:
        return []
    logs = args.logs
    rows = []
    with redis_server(logs) as redis_url:
        for name in args.instance_workloads.split(","):
            workload = workloads[name]
            for policy in args.instance_policies.split(","):
                for n in counts:
                    flush_redis(redis_url)
                    sched = scheduling(args, policy)
                    front = gateway_processes(urls, sched, n, redis_url, logs)
                    key = RowKey(policy, name, "procs", n, workload.keyed)
                    rows.append(run_row(args, urls, key, front, workload))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.serve_sim:
        serve_sim(args)
        return 0
    t_start = time.monotonic()
    wanted = {w for w in args.workloads.split(",") if w}
    if args.instances:
        wanted |= set(args.instance_workloads.split(","))
    workloads = build_workloads(args, wanted)
    with sim_cluster(args) as urls:
        results = policy_rows(args, urls, workloads)
        results += instance_rows(args, urls, workloads)
    setup = {
        "replicas": REPLICAS,
        "speed": args.speed,
        "kv_tokens_per_replica": args.kv_tokens,
        "prefill_tokens_per_s_per_replica": PREFILL_RATE,
        "admission": "off (routing only)",
        "variants": args.variants,
        "gateway_package": str(Path(gateway.__file__).parent),
        "vllm_router": router_record(find_vllm_router(args.vllm_router)),
        "command": " ".join(
            [".venv/bin/python -m bench.routing", *(sys.argv[1:] if argv is None else argv)]
        ),
        "total_wall_s": round(time.monotonic() - t_start, 1),
    }
    notes = {name: w.note for name, w in workloads.items()}
    report = {"setup": setup, "workloads": notes, "hashing": hashing_costs(), "results": results}
    write_reports(args.out, args.name, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
