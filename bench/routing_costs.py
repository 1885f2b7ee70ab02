"""Cost of prefix hashing and of ranking 4 replicas for a 400 KB agent prompt."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.datastructures import Headers

from bench.routing_workloads import words
from gateway.config.scheduling import SchedulingConfig
from gateway.config.schema import ReplicaConfig
from gateway.ingress.protocol import parse_request, prompt_parts
from gateway.replicas.registry import Replica
from gateway.request.context import Parsed, RequestContext
from gateway.request.parsed import ClientDeadlines
from gateway.scheduling.prefix import prefix_blocks
from gateway.scheduling.router import build_router

BLOCK_SIZES = (256, 512, 1024, 2048, 4096)


def _body() -> bytes:
    messages = [{"role": "system", "content": words("sys", 2000)}]
    while len(json.dumps(messages)) < 400_000:
        i = len(messages)
        messages.append({"role": "assistant" if i % 2 else "tool", "content": words(f"m{i}", 4000)})
    return json.dumps({"model": "m", "messages": messages}).encode()


def _median_us(fn: Callable[[], object], repeat: int = 30) -> dict[str, float]:
    """Min and median of `repeat` timed calls, in microseconds (min: least disturbed by other "
    "load)."""
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    samples.sort()
    return {"min": round(samples[0] * 1e6, 1), "median": round(samples[len(samples) // 2] * 1e6, 1)}


def hashing_costs() -> dict[str, Any]:
    raw = _body()
    req = parse_request("chat", raw)
    out: dict[str, Any] = {"prompt_bytes": len(raw), "hash_us_by_block_bytes": {}}
    for bs in BLOCK_SIZES:

        def hash_once(size: int = bs) -> object:
            return prefix_blocks(prompt_parts(req), "m", None, size)

        out["hash_us_by_block_bytes"][str(bs)] = _median_us(hash_once)
    out["parse_json_us"] = _median_us(lambda: parse_request("chat", raw))
    out["rank_us_4_replicas_incl_hashing"] = _rank_cost(raw)
    return out


def _rank_cost(raw: bytes) -> dict[str, float]:
    router = build_router(SchedulingConfig(), registry=CollectorRegistry(), rng=random.Random(0))
    replicas = []
    for i in range(4):
        r = Replica(ReplicaConfig(url=f"http://127.0.0.1:{9000 + i}", name=f"r{i}", kind="vllm"))
        r.health.healthy = True
        replicas.append(r)

    def ctx() -> RequestContext:
        c = RequestContext(
            request_id="x", endpoint="chat", path="/", headers=Headers({}), received_at=0.0
        )
        c.parsed = Parsed(parse_request("chat", raw), "s", ClientDeadlines())
        return c

    warm = ctx()
    ranking = router.rank(warm, replicas)
    router.on_routed(warm, ranking, ranking.replicas[0])
    contexts = [ctx() for _ in range(60)]
    it = iter(contexts)
    return _median_us(lambda: router.rank(next(it), replicas), repeat=60)


if __name__ == "__main__":
    print(json.dumps(hashing_costs(), indent=2))
