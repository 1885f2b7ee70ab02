"""Output length semantics, request ids, and what `/sim/stats` records per request."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.sim import SimCluster
from tests.sim.conftest import ClusterFactory
from tests.sim.helpers import TIMEOUT, chat, queued, records, wait_until


@pytest.fixture(scope="module")
def vllm() -> Iterator[SimCluster]:
    with SimCluster.start(
        1,
        flavor="vllm",
        speed=200.0,
        max_model_len=512,
        kv_tokens=8192,
        output_len_min=5,
        output_len_max=12,
    ) as cluster:
        yield cluster


def _post(
    client: httpx.Client, cluster: SimCluster, body: dict[str, Any], **headers: str
) -> dict[str, Any]:
    r = client.post(cluster.urls[0] + "/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _out(body: dict[str, Any]) -> tuple[int, str]:
    return body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"]


def test_natural_length_is_deterministic_and_in_range(
    client: httpx.Client, vllm: SimCluster
) -> None:
    first = _out(_post(client, vllm, chat("tell me")))
    assert 5 <= first[0] <= 12 and first[1] == "stop"
    assert _out(_post(client, vllm, chat("tell me"))) == first
    lengths = {_out(_post(client, vllm, chat(f"prompt {i}")))[0] for i in range(12)}
    assert len(lengths) > 1


def test_caps_ignore_eos_and_min_tokens(client: httpx.Client, vllm: SimCluster) -> None:
    assert _out(_post(client, vllm, chat("x", max_tokens=37, ignore_eos=True))) == (37, "length")
    assert _out(_post(client, vllm, chat("x", max_tokens=3))) == (3, "length")
    both = chat("x", max_tokens=2, max_completion_tokens=30, ignore_eos=True)
    assert _out(_post(client, vllm, both)) == (30, "length")
    assert _out(_post(client, vllm, chat("x", min_tokens=20, max_tokens=50))) == (20, "stop")


def test_no_cap_stops_at_context_end(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    cluster = make_cluster(
        flavor="vllm", max_model_len=64, kv_tokens=1024, output_len_min=500, output_len_max=500
    )
    body = _post(client, cluster, chat("hi"))
    assert body["usage"]["total_tokens"] == 64
    assert body["choices"][0]["finish_reason"] == "length"
    llama = make_cluster(
        flavor="llamacpp", kv_tokens=256, parallel=2, output_len_min=500, output_len_max=500
    )
    body = _post(client, llama, chat("hi"))
    assert body["usage"]["total_tokens"] == 128


def test_llamacpp_n_predict_wins(make_cluster: ClusterFactory, client: httpx.Client) -> None:
    cluster = make_cluster(flavor="llamacpp")
    body = chat("x", n_predict=4, max_tokens=9, ignore_eos=True)
    assert _out(_post(client, cluster, body)) == (4, "length")
    assert _out(_post(client, cluster, chat("x", max_tokens=6, ignore_eos=True))) == (6, "length")


def test_request_id_headers_and_body_are_recorded(client: httpx.Client, vllm: SimCluster) -> None:
    vllm.reset()
    body = chat("x", max_tokens=2, cache_salt="tenant-a")
    resp = _post(
        client,
        vllm,
        body,
        **{"X-Request-Id": "rid-1", "Authorization": "Bearer t", "X-Request-Deadline": "123.5"},
    )
    assert resp["id"] == "chatcmpl-rid-1"
    rec = records(vllm)[0]
    assert rec["id"] == "chatcmpl-rid-1" and rec["x_request_id"] == "rid-1"
    assert rec["headers_seen"] == {
        "authorization": "Bearer t",
        "x-request-id": "rid-1",
        "x-request-deadline": "123.5",
    }
    assert rec["body"]["max_tokens"] == 2 and rec["body"]["cache_salt"] == "tenant-a"
    assert rec["body"]["max_completion_tokens"] is None and rec["body"]["model"] == "sim-model"
    for key in (
        "arrival",
        "arrival_wall",
        "first_token",
        "finish",
        "prompt_tokens",
        "cached_tokens",
        "output_tokens",
        "aborted",
        "abort_time",
        "abort_wall",
        "finish_reason",
        "priority",
        "slot",
    ):
        assert key in rec
    assert rec["arrival"] <= rec["first_token"] <= rec["finish"]
    assert rec["output_tokens"] == 2 and rec["aborted"] is False


def test_priority_policy_orders_the_queue(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(flavor="vllm", scheduling_policy="priority", max_num_seqs=1)
    cluster.set_fault(0, paused=True)
    url = cluster.urls[0] + "/v1/chat/completions"
    threads = []
    with httpx.Client(timeout=TIMEOUT) as c:
        for i, prio in enumerate([5, 1, 3]):
            t = threading.Thread(
                target=c.post,
                args=(url,),
                kwargs={"json": chat(f"p{prio}", max_tokens=3, priority=prio)},
            )
            t.start()
            threads.append(t)
            wait_until(queued(cluster, i + 1))
        cluster.set_fault(0, paused=False)
        for t in threads:
            t.join(10.0)
    recs = sorted(records(cluster), key=lambda r: r["first_token"])
    assert [r["priority"] for r in recs] == [1, 3, 5]
