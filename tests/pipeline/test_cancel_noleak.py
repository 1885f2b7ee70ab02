"""No leaks: 200 requests with random disconnect points and random deadlines.

Afterwards every lease, queue slot, budget reservation and simulator KV
block is free, and the gateway's counters add up:
admitted = finished + cancelled + failed.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

from gateway.config.schema import AdmissionConfig, ReplicaConfig
from gateway.sim.config import SimConfig
from tests.gwharness import RunningGateway, running_gateway
from tests.rawhttp import RawRequest
from tests.simkit import Sims, chat_body, metric, running_sims, settled, wait_for

N = 200
SEED = 7


def _one(gw: RunningGateway, seed: int) -> str:
    rng = random.Random(seed)
    stream = rng.random() < 0.6
    headers = {"Connection": "close"}
    if rng.random() < 0.5:
        headers["X-Request-Timeout"] = f"{rng.uniform(0.02, 1.0):.3f}"
    body = chat_body(stream=stream, max_tokens=rng.randint(10, 600))
    req = RawRequest(gw.url + "/v1/chat/completions", body, headers, timeout=30)
    how = rng.choice(["complete", "close_after_delay", "close_after_chunks"])
    try:
        if how == "complete":
            req.read_all(timeout=30)
        elif how == "close_after_chunks" and stream:
            req.read_until(b"data: ", count=rng.randint(1, 20), timeout=10)
        else:
            time.sleep(rng.uniform(0.0, 0.4))
    finally:
        req.close()
    return how


def _engines_idle(sims: Sims) -> bool:
    for i in range(len(sims.urls)):
        totals = sims.stats(i)["totals"]
        if totals["running"] or totals["waiting"] or totals["kv_blocks_pinned"]:
            return False
    return True


def test_no_leaks_under_random_disconnects_and_deadlines() -> None:
    configs = [SimConfig(speed=40, kv_tokens=32768, max_num_seqs=8, seed=i) for i in range(2)]
    with (
        running_sims(configs) as sims,
        running_gateway(
            [ReplicaConfig(url=u, kind="vllm") for u in sims.urls],
            admission=AdmissionConfig(max_in_flight=3),
        ) as gw,
    ):
        with ThreadPoolExecutor(max_workers=12) as pool:
            kinds = list(pool.map(lambda s: _one(gw, s), range(SEED, SEED + N)))
        assert len(kinds) == N
        text = settled(gw)
        wait_for(lambda: _engines_idle(sims), timeout=20)

        admitted = metric(text, "gateway_requests_admitted_total")
        finished = metric(text, "gateway_requests_total", outcome="ok")
        cancelled = metric(text, "gateway_requests_total", outcome="cancelled")
        total = metric(text, "gateway_requests_total")
        failed = total - finished - cancelled
        deadline_exceeded = metric(text, "gateway_requests_total", outcome="deadline_exceeded")
        print(
            f"\nadmitted={admitted:.0f} finished={finished:.0f} cancelled={cancelled:.0f} "
            f"failed={failed:.0f} "
            f"deadline_exceeded={deadline_exceeded:.0f} "
            f"ingress_cancel={metric(text, 'gateway_cancellations_total', stage='ingress'):.0f}"
        )
        outcomes = sorted(
            {
                line.split('outcome="')[1].split('"')[0]
                for line in text.splitlines()
                if line.startswith("gateway_requests_total{")
            }
        )
        print({o: metric(text, "gateway_requests_total", outcome=o) for o in outcomes})
        assert admitted + metric(text, "gateway_cancellations_total", stage="ingress") == N
        assert admitted == finished + cancelled + failed
        assert cancelled > 10 and finished > 10 and failed > 0, "the mix must exercise every path"
        assert metric(text, "gateway_in_flight_requests") == 0
        assert metric(text, "gateway_admission_queue_length") == 0
        assert gw.gateway.store.live_reservations == 0
        assert all(r["in_flight"] == 0 for r in gw.replicas())
        aborted = sum(1 for i in range(2) for r in sims.records(i) if r["aborted"])
        print(
            f"engine aborts={aborted} engine requests={sum(len(sims.records(i)) for i in range(2))}"
        )
        assert aborted > 0
