"""A disconnect storm: clients that drop at random points (streaming and not,
queued and running, some with deadlines) through one gateway in front of the
simulator, then the residue check: nothing held anywhere afterwards.

Used by tests/pipeline/test_cancel_noleak.py (a small storm) and
tests/hardening/test_disconnect_storm.py (hundreds of clients at once).
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


def one_client(gw: RunningGateway, seed: int) -> str:
    """One request that completes, or drops after a random delay or a random
    number of stream chunks; returns which."""
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
            req.read_until(b"data: ", count=rng.randint(1, 20), timeout=30)  # (queued first)
        else:
            time.sleep(rng.uniform(0.0, 0.4))
    finally:
        req.close()
    return how


def engines_idle(sims: Sims) -> bool:
    for i in range(len(sims.urls)):
        totals = sims.stats(i)["totals"]
        if totals["running"] or totals["waiting"] or totals["kv_blocks_pinned"]:
            return False
    return True


def labelled(text: str, name: str, label: str) -> dict[str, float]:
    """Every value of `label` on the samples of `name`."""
    values = {
        line.split(f'{label}="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith(name + "{") and f'{label}="' in line
    }
    return {v: metric(text, name, **{label: v}) for v in sorted(values)}


def storm(n: int, workers: int, seed: int, max_in_flight: int) -> dict[str, float]:
    """Runs `n` clients, `workers` at a time, and asserts zero residue:
    no lease, queue slot, reservation or in-flight count in the gateway, nothing
    running, waiting or pinned in the simulators, and counters that add up
    (admitted = finished + cancelled + failed). Returns the cancellations by stage."""
    configs = [SimConfig(speed=40, kv_tokens=32768, max_num_seqs=8, seed=i) for i in range(2)]
    with (
        running_sims(configs) as sims,
        running_gateway(
            [ReplicaConfig(url=u, kind="vllm") for u in sims.urls],
            admission=AdmissionConfig(max_in_flight=max_in_flight),
        ) as gw,
    ):
        with ThreadPoolExecutor(max_workers=workers) as pool:
            kinds = list(pool.map(lambda s: one_client(gw, s), range(seed, seed + n)))
        assert len(kinds) == n
        text = settled(gw)
        wait_for(lambda: engines_idle(sims), timeout=20)

        admitted = metric(text, "gateway_requests_admitted_total")
        outcomes = labelled(text, "gateway_requests_total", "outcome")
        cancelled_at = labelled(text, "gateway_cancellations_total", "stage")
        print(f"\nadmitted={admitted:.0f} outcomes={outcomes} cancellations={cancelled_at}")
        finished = outcomes.get("ok", 0.0)
        cancelled = outcomes.get("cancelled", 0.0)
        failed = sum(outcomes.values()) - finished - cancelled
        assert admitted + cancelled_at.get("ingress", 0.0) == n
        assert admitted == finished + cancelled + failed
        assert cancelled > 10 and finished > 10 and failed > 0, "the mix must exercise every path"
        assert metric(text, "gateway_in_flight_requests") == 0
        assert metric(text, "gateway_admission_queue_length") == 0
        assert gw.gateway.store.live_reservations == 0
        assert all(r["in_flight"] == 0 for r in gw.replicas())
        records = [r for i in range(len(sims.urls)) for r in sims.records(i)]
        aborted = sum(1 for r in records if r["aborted"])
        print(f"engine aborts={aborted} engine requests={len(records)}")
        assert aborted > 0
        return cancelled_at
