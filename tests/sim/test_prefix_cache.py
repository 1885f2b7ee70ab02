"""Prefix caching over HTTP: cached tokens, shorter simulated TTFT, salt isolation."""

from __future__ import annotations

from typing import Any

import httpx

from tests.sim.conftest import ClusterFactory
from tests.sim.helpers import chat, long_text, records, totals


def _ttft(rec: dict[str, Any]) -> float:
    return float(rec["first_token"] - rec["arrival"])


def _cached(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_shared_prefix_hits_and_is_faster_vllm(
    make_cluster: ClusterFactory, client: httpx.Client
) -> None:
    cluster = make_cluster(flavor="vllm", speed=10.0)
    u = cluster.urls[0] + "/v1/chat/completions"
    prefix = long_text(2500)
    first = client.post(u, json=chat(prefix + " first question", max_tokens=1))
    second = client.post(u, json=chat(prefix + " second question", max_tokens=1))
    assert _cached(first) == 0
    prompt = second.json()["usage"]["prompt_tokens"]
    assert prompt - 32 <= _cached(second) < prompt
    assert _cached(second) % 16 == 0
    recs = records(cluster)
    assert _ttft(recs[1]) < _ttft(recs[0]) / 3
    t = totals(cluster)
    assert t["prefix_hits_tokens"] == _cached(second)
    assert t["prefix_queries_tokens"] == recs[0]["prompt_tokens"] + recs[1]["prompt_tokens"]


def test_cache_salt_isolates(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    u = make_cluster(flavor="vllm").urls[0] + "/v1/chat/completions"
    prompt = long_text(400)
    assert _cached(client.post(u, json=chat(prompt, max_tokens=1))) == 0
    assert _cached(client.post(u, json=chat(prompt, max_tokens=1, cache_salt="a"))) == 0
    assert _cached(client.post(u, json=chat(prompt, max_tokens=1, cache_salt="a"))) > 0
    assert _cached(client.post(u, json=chat(prompt, max_tokens=1, cache_salt="b"))) == 0
    assert _cached(client.post(u, json=chat(prompt, max_tokens=1))) > 0


def test_generated_tokens_are_cached_for_the_next_turn(
    make_cluster: ClusterFactory, client: httpx.Client
) -> None:
    u = make_cluster(flavor="vllm").urls[0] + "/v1/chat/completions"
    history = [{"role": "user", "content": long_text(100)}]
    first = client.post(
        u, json={"model": "sim-model", "messages": history, "max_tokens": 64, "ignore_eos": True}
    ).json()
    answer = first["choices"][0]["message"]["content"]
    history += [{"role": "assistant", "content": answer}, {"role": "user", "content": "more"}]
    second = client.post(u, json={"model": "sim-model", "messages": history, "max_tokens": 1})
    # the template re-renders the answer; all but the last partial blocks hit
    assert _cached(second) >= first["usage"]["total_tokens"] - 2 * 16


def test_cache_reset_and_disabled(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    cluster = make_cluster(flavor="vllm")
    u = cluster.urls[0] + "/v1/chat/completions"
    prompt = long_text(300)
    client.post(u, json=chat(prompt, max_tokens=1))
    cluster.reset()
    assert _cached(client.post(u, json=chat(prompt, max_tokens=1))) == 0
    off = make_cluster(flavor="vllm", enable_prefix_caching=False).urls[0] + "/v1/chat/completions"
    client.post(off, json=chat(prompt, max_tokens=1))
    assert _cached(client.post(off, json=chat(prompt, max_tokens=1))) == 0


def test_llamacpp_slot_keeps_its_prompt(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    cluster = make_cluster(flavor="llamacpp", kv_tokens=32768, parallel=4, speed=20.0)
    u = cluster.urls[0] + "/v1/chat/completions"
    a, b = long_text(800, "a"), long_text(800, "b")
    assert _cached(client.post(u, json=chat(a + " one", max_tokens=1))) == 0
    assert _cached(client.post(u, json=chat(b + " one", max_tokens=1))) == 0
    hit_a = _cached(client.post(u, json=chat(a + " two", max_tokens=1)))
    hit_b = _cached(client.post(u, json=chat(b + " two", max_tokens=1)))
    assert hit_a > 1000 and hit_b > 1000
    recs = records(cluster)
    assert recs[0]["slot"] == recs[2]["slot"] != recs[1]["slot"] == recs[3]["slot"]
    assert _ttft(recs[2]) < _ttft(recs[0]) / 3
    pinned = client.post(u, json=chat(a + " three", max_tokens=1, id_slot=recs[1]["slot"]))
    assert _cached(pinned) < 100  # pinned to b's slot: a's prefix is not there
    no_cache = client.post(u, json=chat(b + " three", max_tokens=1, cache_prompt=False))
    assert _cached(no_cache) == 0
