"""Simulator fidelity: the same requests to real vLLM 0.32.0 (CPU) and to the simulator's
vLLM flavour, compared by shape, with an EMPTY allow-list.

Compared per probe: status code, media type, the JSON shape of bodies (keys and value
types, recursively) and the values the gateway relies on (error type and code, `object`);
for SSE the shape of each kind of chunk and their order, `[DONE]`; for `/metrics` the type
and label names of every family the gateway or its tests read; the KV event wire format
(`test_sim_kv_events_match_vllm`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from gateway.sim.cluster import SimCluster
from gateway.sim.config import SimConfig

from ..capture_golden import shape
from ..test_sim_fidelity import (
    Probe,
    _media_type,
    _merge_shapes,
    _observe_sse,
    differences,
    facts,
)
from .vllmserver import (
    BLOCK_SIZE,
    MAX_BATCHED_TOKENS,
    MAX_MODEL_LEN,
    MODEL,
    SHARED_BLOCKS,
    VLLMServer,
)

pytestmark = [pytest.mark.engine]

HI = [{"role": "user", "content": "Say hi."}]
CHAT = {"model": MODEL, "messages": HI, "max_tokens": 4, "temperature": 0}
COMP = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
USAGE = {"stream": True, "stream_options": {"include_usage": True}}
BIG = [{"role": "user", "content": "hello " * 2100}]  # > 2048 tokens on both sides

PROBES = (
    Probe("health", "GET", "/health"),
    Probe("models", "GET", "/v1/models"),
    Probe("tokenize_prompt", "POST", "/tokenize", {"model": MODEL, "prompt": "hello world"}),
    Probe("tokenize_messages", "POST", "/tokenize", {"model": MODEL, "messages": HI}),
    Probe("chat", "POST", "/v1/chat/completions", CHAT),
    Probe("chat_stream_usage", "POST", "/v1/chat/completions", {**CHAT, **USAGE}, sse=True),
    Probe("chat_stream", "POST", "/v1/chat/completions", {**CHAT, "stream": True}, sse=True),
    Probe("completions", "POST", "/v1/completions", COMP),
    Probe("completions_stream", "POST", "/v1/completions", {**COMP, **USAGE}, sse=True),
    Probe("bad_temperature", "POST", "/v1/chat/completions", {**CHAT, "temperature": -1}),
    Probe("unknown_model", "POST", "/v1/chat/completions", {**CHAT, "model": "nope"}),
    Probe("over_context", "POST", "/v1/chat/completions", {**CHAT, "messages": BIG}),
    Probe("max_tokens_too_big", "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 3000}),
    Probe("bad_json", "POST", "/v1/chat/completions", raw=b'{"messages": [}'),
    Probe("not_found", "GET", "/no/such/path"),
)

#: Families the gateway (gateway/engines/readings.py) or the vLLM tests read.
READ_FAMILIES = (
    "vllm:cache_config_info",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:num_preemptions",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:time_to_first_token_seconds",
)
#: `cache_config_info` labels the gateway reads (it carries ~40 more config labels).
CACHE_CONFIG_LABELS = {
    "engine",
    "block_size",
    "num_gpu_blocks",
    "kv_cache_size_tokens",
    "enable_prefix_caching",
}


def metric_families(text: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name not in READ_FAMILIES:
            continue
        labels = {k for s in fam.samples if not s.name.endswith("_created") for k in s.labels}
        if fam.name == "vllm:cache_config_info":
            labels &= CACHE_CONFIG_LABELS
        out[fam.name] = {"type": fam.type, "labels": sorted(labels - {"le"})}
    return out


def _request(c: httpx.Client, p: Probe) -> httpx.Response:
    if p.raw is not None:
        return c.request(p.method, p.path, content=p.raw, headers={"content-type": "x/json"})
    return c.request(p.method, p.path, json=p.body)


def observe(url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=60) as c:
        for p in PROBES:
            if p.sse:
                with c.stream(p.method, p.path, json=p.body) as r:
                    obs = {"status": r.status_code, "media_type": _media_type(r)}
                    obs.update(_observe_sse(r))
            else:
                r = _request(c, p)
                obs = {"status": r.status_code, "media_type": _media_type(r)}
                try:
                    body = r.json()
                except ValueError:
                    obs["shape"] = f"not JSON: {r.text[:60]!r}"
                else:
                    obs["shape"] = shape(body)
                    obs["facts"] = facts(body)
            out[p.name] = obs
        out["metrics"] = metric_families(c.get("/metrics").text)
    return out


@pytest.fixture()
def sim_url() -> Iterator[str]:
    cfg = SimConfig(
        flavor="vllm",
        model=MODEL,
        max_model_len=MAX_MODEL_LEN,
        kv_tokens=SHARED_BLOCKS * BLOCK_SIZE,
        block_size=BLOCK_SIZE,
        speed=50.0,
    )
    with SimCluster([cfg]) as cluster:
        yield cluster.urls[0]


def test_simulator_matches_real_vllm(vllm_idle: list[VLLMServer], sim_url: str) -> None:
    real = observe(vllm_idle[0].url)
    sim = observe(sim_url)
    found = list(differences(real, sim, ""))
    assert not found, (
        "simulator (vLLM flavour) differs from vLLM 0.32.0; fix gateway/sim:\n"
        + "".join(f"  {d}\n" for d in found)
    )


# --------------------------------------------------------------------------- KV events


def wire_shape(messages: list[list[bytes]]) -> dict[str, Any]:
    """Frame count and sizes, payload layout, and each event type's map shape."""
    out: dict[str, Any] = {"events": {}}
    for frames in messages:
        out["frames"] = len(frames)
        out["topic"] = frames[0].decode()
        out["seq_bytes"] = len(frames[1])
        payload = msgpack.unpackb(frames[2], raw=False)
        out["payload"] = [shape(payload[0]), "events", shape(payload[2])]
        for event in payload[1]:
            kind = event["type"]
            out["events"][kind] = _merge_shapes(out["events"].get(kind), shape(event))
    return out


def kv_messages(endpoint: str, url: str, bodies: list[dict[str, Any]]) -> list[list[bytes]]:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)
        time.sleep(0.5)  # a batch published before the subscription is joined is lost
        for body in bodies:
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
        out: list[list[bytes]] = []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            if sub.poll(100):
                out.append(sub.recv_multipart())
        return out
    finally:
        sub.close(linger=0)
        ctx.term()


def test_sim_kv_events_match_vllm(vllm_idle: list[VLLMServer], tmp_path: Path) -> None:
    # Four fresh prompts of ~1,000 vLLM tokens (~2,000 simulator tokens) each: more blocks
    # than either 24-block cache holds, so both store and evict.
    bodies = [
        {
            "model": MODEL,
            "messages": [
                {"role": "user", "content": uuid.uuid4().hex + " river stone garden" * 320}
            ],
            "max_tokens": 1,
        }
        for _ in range(4)
    ]
    server = vllm_idle[0]
    real = wire_shape(kv_messages(server.kv_events_endpoint, server.url, bodies))
    endpoint = f"ipc://{tmp_path}/sim-kv.ipc"
    cfg = SimConfig(
        flavor="vllm", model=MODEL, max_model_len=MAX_MODEL_LEN,
        kv_tokens=SHARED_BLOCKS * BLOCK_SIZE, block_size=BLOCK_SIZE, speed=50.0,
        max_num_batched_tokens=MAX_BATCHED_TOKENS, kv_events_endpoint=endpoint,
    )  # fmt: skip
    with SimCluster([cfg]) as cluster:
        sim = wire_shape(kv_messages(endpoint, cluster.urls[0], bodies))
    assert {"BlockStored", "BlockRemoved"} <= real["events"].keys(), real
    found = list(differences(real, sim, ""))
    assert not found, (
        "simulator KV events differ from vLLM 0.32.0:\n" + "\n".join(found) + f"\nreal: {real}"
    )
