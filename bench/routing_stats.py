"""One row of bench/routing.py: hit rates, latencies and load balance, from
the simulators' counters and per-request records (simulated seconds)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.routing_workloads import Oracle


@dataclass(frozen=True, slots=True)
class RowKey:
    """What a row measured: front end, instances, workload, session keys."""

    policy: str
    workload: str
    #: "gateway" (in this process), "vllm-router", or "procs" (gateway processes)
    front: str = "gateway"
    instances: int = 1
    keyed: bool | None = None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _max_mean(values: list[float]) -> float | None:
    return max(values) / statistics.fmean(values) if any(values) else None


def itl(record: dict[str, Any]) -> float | None:
    """A request's mean inter-token latency: (last token - first token) / (tokens - 1)."""
    n = int(record["output_tokens"])
    if record["first_token"] is None or record["finish"] is None or n < 2:
        return None
    return (float(record["finish"]) - float(record["first_token"])) / (n - 1)


def summarize(
    key: RowKey,
    stats: list[dict[str, Any]],
    oracle: Oracle,
    errors: int,
    wall: float,
    speed: float,
) -> dict[str, Any]:
    totals = [s["totals"] for s in stats]
    records = [r for s in stats for r in s["requests"]]
    ttft = [r["first_token"] - r["arrival"] for r in records if r["first_token"] is not None]
    itls = [v for r in records if (v := itl(r)) is not None]
    prompt = sum(t["prompt_tokens"] for t in totals)
    hits = sum(t["prefix_hits_tokens"] for t in totals)
    hit_rate = hits / prompt if prompt else 0.0
    per_replica = [len(s["requests"]) for s in stats]
    out_tokens = [float(sum(r["output_tokens"] for r in s["requests"])) for s in stats]
    busy = [t["busy_time"] for t in totals]
    return {
        "policy": key.policy,
        "workload": key.workload,
        "front": key.front,
        "instances": key.instances,
        "keyed": key.keyed,
        "requests": len(records),
        "errors": errors,
        "prompt_tokens": prompt,
        "hit_tokens": hits,
        "hit_rate": hit_rate,
        "oracle_hit_rate": oracle.hit_rate,
        "pooled_hit_rate": oracle.pooled_hit_rate,
        "hit_vs_oracle": _ratio(hit_rate, oracle.hit_rate),
        "hit_vs_pooled": _ratio(hit_rate, oracle.pooled_hit_rate),
        "ttft_p50_s": pct(ttft, 0.5),
        "ttft_p99_s": pct(ttft, 0.99),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
        "itl_p50_s": pct(itls, 0.5),
        "itl_p99_s": pct(itls, 0.99),
        "throughput_tokens_per_s": sum(t["generation_tokens"] for t in totals) / (wall * speed),
        "preemptions": sum(t["preemptions"] for t in totals),
        "requests_per_replica": per_replica,
        "max_mean_load": _max_mean([float(n) for n in per_replica]),
        "out_tokens_per_replica": [int(n) for n in out_tokens],
        "max_mean_out_tokens": _max_mean(out_tokens),
        "busy_s_per_replica": [round(b, 2) for b in busy],
        "max_mean_busy": _max_mean(busy),
        "wall_s": round(wall, 2),
        "simulated_s": round(wall * speed, 1),
        "slowest": _slowest(records),
    }


def _slowest(records: list[dict[str, Any]], n: int = 5) -> list[dict[str, Any]]:
    """The requests behind the TTFT tail: how long, how big, how much was
    cached, queued for how long."""
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


_EXPECTED = ("gateway_routing_prompt_tokens_total", "gateway_routing_matched_prefix_tokens_total")


async def index_expected(session: aiohttp.ClientSession, admin_urls: list[str]) -> float | None:
    """The hit rate the gateways' prefix indexes expected (matched / prompt tokens
    routed, summed over instances): next to the engines' hit rate, it tells a
    routing loss (the index knew) from an index that was wrong."""
    sums = dict.fromkeys(_EXPECTED, 0.0)
    for url in admin_urls:
        async with session.get(url + "/metrics") as resp:
            for line in (await resp.text()).splitlines():
                name = line.split("{", 1)[0].split(" ", 1)[0]
                if name in sums:
                    sums[name] += float(line.rsplit(" ", 1)[1])
    prompt, matched = sums[_EXPECTED[0]], sums[_EXPECTED[1]]
    return matched / prompt if admin_urls and prompt else None
