"""The vLLM batch scheduler and the llama.cpp slot scheduler, stepped by hand (pure)."""

from __future__ import annotations

import itertools
from typing import Any

from gateway.sim.batching import BatchScheduler
from gateway.sim.config import SimConfig
from gateway.sim.engine import EngineCore, Work
from gateway.sim.request import Failed, Finish, RequestRecord, SimRequest, State, Token
from gateway.sim.slots import SlotScheduler
from gateway.sim.tokens import OutputText

_ids = itertools.count()


def _req(prompt: list[int], out: int, arrival: float = 0.0, **kw: Any) -> SimRequest:
    rid = f"r{next(_ids)}"
    rec = RequestRecord(
        id=rid,
        x_request_id=None,
        endpoint="/t",
        arrival=arrival,
        arrival_wall=0.0,
        headers_seen={},
        body={},
        prompt_tokens=len(prompt),
    )
    return SimRequest(
        rid=rid,
        prompt=prompt,
        max_output=out,
        natural_len=1 << 40,
        output=OutputText(0, len(prompt), 1, 1),
        record=rec,
        **kw,
    )


def _run(sched: BatchScheduler | SlotScheduler, steps: int = 10_000) -> list[list[Work]]:
    plans = []
    for i in range(steps):
        plan = sched.schedule()
        if not plan:
            break
        plans.append(plan)
        sched.commit(plan, float(i))
    return plans


def _events(req: SimRequest) -> list[Any]:
    out = []
    while not req.events.empty():
        out.append(req.events.get_nowait())
    return out


def _vllm(**kw: Any) -> BatchScheduler:
    cfg = SimConfig(**{"kv_tokens": 256, "max_model_len": 128, "block_size": 16, **kw})
    return BatchScheduler(cfg, EngineCore(cfg))


def test_chunked_prefill_then_one_token_per_step() -> None:
    sched = _vllm(max_num_batched_tokens=32)
    req = _req(list(range(70)), out=3)
    sched.add(req)
    plans = _run(sched)
    assert [w.n for p in plans for w in p] == [32, 32, 6, 1, 1]
    assert [w.decode for p in plans for w in p] == [False, False, False, True, True]
    events = _events(req)
    assert [type(e) for e in events] == [Token, Token, Token, Finish]
    assert events[-2].finish_reason == "length"
    assert req.state is State.FINISHED and sched.pool.pinned == 0


def test_preempts_newest_and_recomputes() -> None:
    sched = _vllm(kv_tokens=128, max_model_len=128)  # 8 blocks
    old, new = _req(list(range(40)), out=40), _req(list(range(100, 140)), out=40)
    sched.add(old)
    sched.add(new)
    _run(sched)
    assert sched.core.totals.preemptions > 0
    assert new.record.preemptions > 0 and old.record.preemptions == 0
    assert len(old.output_ids) == len(new.output_ids) == 40
    assert sched.pool.pinned == 0


def test_priority_victim_and_queue_order() -> None:
    sched = _vllm(scheduling_policy="priority", max_num_seqs=1)
    reqs = [_req([p] * 20, out=1, arrival=float(i), priority=p) for i, p in enumerate([2, 0, 1])]
    for r in reqs:
        sched.add(r)
    order = [p[0].req.priority for p in _run(sched)]
    assert order == [0, 1, 2]


def test_prefix_hit_pins_cached_blocks() -> None:
    sched = _vllm()
    first, second = _req(list(range(50)), out=1), _req(list(range(50)), out=1)
    sched.add(first)
    _run(sched)
    sched.add(second)
    plans = _run(sched)
    assert second.record.cached_tokens == 48  # 3 full blocks; at least one token computed
    assert plans[0][0].n == 2
    assert sched.core.totals.prefix_hits_tokens == 48


def test_abort_removes_from_queue_and_batch() -> None:
    sched = _vllm(max_num_seqs=1)
    a, b = _req(list(range(20)), out=50), _req(list(range(20, 40)), out=50)
    sched.add(a)
    sched.add(b)
    sched.commit(sched.schedule(), 0.0)
    assert sched.pool.pinned > 0 and len(sched.waiting) == 1
    sched.remove(b)
    sched.remove(a)
    assert sched.pool.pinned == 0 and len(sched.waiting) == 0 and not sched.running


def _llama(**kw: Any) -> SlotScheduler:
    cfg = SimConfig(**{"flavor": "llamacpp", "kv_tokens": 400, "parallel": 2, **kw})
    return SlotScheduler(cfg, EngineCore(cfg))


def test_slot_choice_similarity_then_lru() -> None:
    sched = _llama()
    a, b = _req(list(range(50)), out=1), _req(list(range(100, 150)), out=1)
    sched.add(a)
    _run(sched)
    sched.add(b)
    _run(sched)
    assert a.slot is None and a.record.slot != b.record.slot
    again = _req(list(range(100, 160)), out=1)
    sched.add(again)
    _run(sched)
    assert again.record.slot == b.record.slot and again.record.cached_tokens == 50
    fresh = _req(list(range(500, 520)), out=1)
    sched.add(fresh)
    _run(sched)
    assert fresh.record.slot == a.record.slot  # least recently used


def test_pinned_slot_defers_and_context_error_on_pickup() -> None:
    sched = _llama(n_batch=16)
    a, b = _req(list(range(40)), out=5, id_slot=0), _req(list(range(40)), out=5, id_slot=0)
    sched.add(a)
    sched.add(b)
    sched.schedule()
    assert sched.gauges()["deferred"] == 1 and b.record.deferred
    _run(sched)
    assert b.record.slot == 0 and b.record.cached_tokens == 39
    big = _req(list(range(300)), out=1)
    sched.add(big)
    assert sched.schedule() == []
    (failed,) = _events(big)
    assert isinstance(failed, Failed) and failed.error["n_ctx"] == 200


def test_decode_tokens_fill_the_batch_before_prompts() -> None:
    sched = _llama(n_batch=8, kv_tokens=800)
    gen, reader = _req([1, 2], out=100), _req(list(range(30)), out=1)
    sched.add(gen)
    sched.commit(sched.schedule(), 0.0)
    sched.add(reader)
    plan = sched.schedule()
    assert [(w.req is gen, w.n, w.decode) for w in plan] == [(True, 1, True), (False, 7, False)]
