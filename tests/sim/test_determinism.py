"""Same seed and workload, same totals."""

from __future__ import annotations

import threading
from typing import Any

import httpx

from gateway.sim import SimCluster
from tests.sim.helpers import TIMEOUT, chat, long_text, queued, totals, wait_until

DETERMINISTIC = (
    "requests",
    "finished",
    "preemptions",
    "deferrals",
    "aborts",
    "prefix_queries_tokens",
    "prefix_hits_tokens",
    "prompt_tokens",
    "prompt_tokens_processed",
    "generation_tokens",
    "steps",
    "busy_time",
)


def _workload() -> list[dict[str, Any]]:
    shared = long_text(150, "sys")
    bodies = [chat(shared + long_text(40, f"q{i}")) for i in range(6)]
    bodies += [chat(long_text(80, f"r{i}"), max_tokens=120, ignore_eos=True) for i in range(4)]
    return bodies


def _run(seed: int, **overrides: Any) -> dict[str, Any]:
    """Queue the workload in a fixed order on a paused engine, then let it run."""
    with SimCluster.start(1, seed=seed, speed=200.0, **overrides) as cluster:
        cluster.set_fault(0, paused=True)
        url = cluster.urls[0] + "/v1/chat/completions"
        threads: list[threading.Thread] = []
        with httpx.Client(timeout=TIMEOUT) as client:
            for i, body in enumerate(_workload()):
                t = threading.Thread(target=client.post, args=(url,), kwargs={"json": body})
                t.start()
                threads.append(t)
                wait_until(queued(cluster, i + 1))
            cluster.set_fault(0, paused=False)
            for t in threads:
                t.join(timeout=10.0)
        wait_until(lambda: totals(cluster)["finished"] == len(threads))
        return {k: totals(cluster)[k] for k in DETERMINISTIC}


def test_vllm_same_seed_same_totals() -> None:
    kw = {
        "flavor": "vllm",
        "kv_tokens": 2048,
        "max_model_len": 1024,
        "max_num_batched_tokens": 512,
        "output_len_max": 96,
    }
    first, second = _run(7, **kw), _run(7, **kw)
    assert first == second
    assert first["preemptions"] > 0 and first["prefix_hits_tokens"] > 0
    assert _run(8, **kw)["generation_tokens"] != first["generation_tokens"]


def test_llamacpp_same_seed_same_totals() -> None:
    kw = {"flavor": "llamacpp", "kv_tokens": 8192, "parallel": 2, "output_len_max": 96}
    first, second = _run(3, **kw), _run(3, **kw)
    assert first == second
    assert first["deferrals"] > 0 and first["prefix_hits_tokens"] > 0
