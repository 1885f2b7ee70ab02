"""Client disconnects: the request ends aborted and its memory returns to the pool."""

from __future__ import annotations

import httpx

from gateway.sim import SimCluster
from tests.sim.conftest import ClusterFactory
from tests.sim.helpers import TIMEOUT, chat, long_text, raw_request, records, totals, wait_until


def _stream_then_close(url: str, body: dict[str, object], chunks: int) -> None:
    with httpx.Client(timeout=TIMEOUT) as c, c.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= chunks:
                break


def _aborted(cluster: SimCluster, i: int) -> bool:
    recs = records(cluster)
    return len(recs) > i and recs[i]["aborted"]


def test_vllm_abort_mid_stream_frees_blocks(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(flavor="vllm", speed=20.0)
    url = cluster.urls[0] + "/v1/chat/completions"
    _stream_then_close(url, chat(long_text(200), max_tokens=5000, ignore_eos=True, stream=True), 4)
    wait_until(lambda: _aborted(cluster, 0))
    rec = records(cluster)[0]
    assert rec["finish_reason"] == "abort"
    assert 0 <= rec["abort_time"] - rec["disconnect_time"] < 0.05
    assert 2 <= rec["output_tokens"] < 5000
    t = totals(cluster)
    assert t["aborts"] == 1 and t["running"] == 0 and t["kv_blocks_pinned"] == 0
    assert t["kv_blocks_cached"] > 0  # cached prefix blocks stay until evicted


def test_vllm_abort_while_waiting_and_non_streaming(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(flavor="vllm", max_num_seqs=1, speed=20.0)
    url = cluster.urls[0]
    running = raw_request(url, "/v1/chat/completions", chat("a", max_tokens=5000, ignore_eos=True))
    wait_until(lambda: totals(cluster)["running"] == 1)
    waiting = raw_request(url, "/v1/chat/completions", chat("b", max_tokens=10))
    wait_until(lambda: totals(cluster)["waiting"] == 1)
    assert totals(cluster)["kv_blocks_pinned"] > 0
    waiting.close()
    wait_until(lambda: _aborted(cluster, 1))
    assert records(cluster)[1]["first_token"] is None
    assert totals(cluster)["waiting"] == 0
    running.close()  # non-streaming request, disconnected while generating
    wait_until(lambda: _aborted(cluster, 0))
    t = totals(cluster)
    assert t["aborts"] == 2 and t["running"] == 0 and t["kv_blocks_pinned"] == 0


def test_llamacpp_abort_mid_stream_at_next_write(
    make_cluster: ClusterFactory, client: httpx.Client
) -> None:
    cluster = make_cluster(flavor="llamacpp", speed=20.0, disconnect_poll_s=100.0)
    url = cluster.urls[0]
    _stream_then_close(
        url + "/v1/chat/completions", chat("hi", max_tokens=5000, ignore_eos=True, stream=True), 4
    )
    wait_until(lambda: _aborted(cluster, 0))
    rec = records(cluster)[0]
    assert rec["abort_time"] - rec["disconnect_time"] < 1.0  # a write, not the 100 s poll
    slots = client.get(url + "/slots").json()
    assert not any(s["is_processing"] for s in slots)
    assert totals(cluster)["kv_blocks_pinned"] == 0
    assert totals(cluster)["kv_tokens_used"] > 0  # the slot keeps its prompt


def test_llamacpp_abort_while_deferred_waits_for_poll(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(flavor="llamacpp", parallel=1, speed=50.0, disconnect_poll_s=2.0)
    url = cluster.urls[0]
    busy = raw_request(url, "/v1/chat/completions", chat("a", max_tokens=5000, ignore_eos=True))
    wait_until(lambda: totals(cluster)["running"] == 1)
    deferred = raw_request(url, "/v1/chat/completions", chat("b", max_tokens=10))
    wait_until(lambda: totals(cluster)["deferred"] == 1)
    deferred.close()
    wait_until(lambda: _aborted(cluster, 1))
    rec = records(cluster)[1]
    assert 0 < rec["abort_time"] - rec["disconnect_time"] <= 2.0 + 0.5
    busy.close()
    wait_until(lambda: _aborted(cluster, 0))
    t = totals(cluster)
    assert t["aborts"] == 2 and t["running"] == 0 and t["deferred"] == 0
