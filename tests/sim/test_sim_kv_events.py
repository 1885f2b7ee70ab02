"""The simulator's KV cache events (SimConfig.kv_events_endpoint), decoded by the gateway's
decoder; the wire format is compared with real vLLM in
tests/engine/vllm/test_sim_fidelity_vllm.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import zmq

from gateway.engines.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    decode_message,
)
from gateway.sim.cluster import SimCluster
from gateway.sim.config import SimConfig

BS = 16


@pytest.fixture()
def sub_and_sim(tmp_path: Path) -> Iterator[tuple[zmq.Socket[bytes], SimCluster]]:
    endpoint = f"ipc://{tmp_path}/kv.ipc"
    cfg = SimConfig(
        flavor="vllm", block_size=BS, kv_tokens=8 * BS, max_model_len=8 * BS, speed=100.0,
        kv_events_endpoint=endpoint,
    )  # fmt: skip
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        with SimCluster([cfg]) as cluster:
            sub.connect(endpoint)
            time.sleep(0.3)  # the subscription reaches the publisher
            yield sub, cluster
    finally:
        sub.close(linger=0)
        ctx.term()


def events(sub: zmq.Socket[bytes], wait_s: float = 1.0) -> list[tuple[int, KVEvent]]:
    out: list[tuple[int, KVEvent]] = []
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if sub.poll(50):
            batch = decode_message(sub.recv_multipart())
            assert batch.topic == b"kv" and batch.data_parallel_rank == 0
            out += [(batch.seq, e) for e in batch.events]
    return out


def complete(url: str, prompt: list[int]) -> None:
    r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=10)
    assert r.status_code == 200, r.text


def test_stored_removed_cleared(sub_and_sim: tuple[zmq.Socket[bytes], SimCluster]) -> None:
    sub, cluster = sub_and_sim
    url = cluster.urls[0]
    prompt = list(range(100, 100 + 3 * BS + 5))  # 3 full blocks
    complete(url, prompt)
    first = events(sub)
    stored = [e for _, e in first if isinstance(e, BlockStored)]
    assert stored and all(e.block_size == BS for e in stored)
    assert stored[0].parent_block_hash is None
    assert [t for e in stored for t in e.token_ids][: 3 * BS] == prompt[: 3 * BS]
    hashes = [h for e in stored for h in e.block_hashes]
    assert len(hashes) >= 3 and all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes)
    seqs = [s for s, _ in first]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))

    complete(url, prompt)  # cached: nothing new is stored
    assert not [e for _, e in events(sub) if isinstance(e, BlockStored)]

    # A different prompt of 7 of the 8 blocks evicts cached blocks (tails first).
    complete(url, list(range(5000, 5000 + 7 * BS)))
    removed = [h for _, e in events(sub) if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed and set(removed) <= set(hashes)
    assert hashes[-1] in removed and hashes[0] not in removed

    cluster.reset(clear_cache=True)
    assert any(isinstance(e, AllBlocksCleared) for _, e in events(sub))


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"kv_events_endpoint": "tcp://0.0.0.0:5557"}, "tcp://127.0.0.1:PORT"),
        ({"kv_events_endpoint": "ipc://"}, "ipc://PATH"),
        ({"kv_events_endpoint": "ipc:///x", "flavor": "llamacpp"}, "flavor must be 'vllm'"),
    ],
)
def test_endpoint_config_is_checked(kw: dict[str, str], needle: str) -> None:
    with pytest.raises(ValueError, match="kv_events_endpoint") as info:
        SimConfig(**kw)  # type: ignore[arg-type]
    assert needle in str(info.value)
