"""The step-time model: attention over the context the running sequences attend to."""

from __future__ import annotations

import itertools

import httpx
import pytest

from gateway.sim.batching import BatchScheduler
from gateway.sim.config import SimConfig
from gateway.sim.engine import Engine, EngineCore, Work
from gateway.sim.request import RequestRecord, SimRequest
from gateway.sim.tokens import OutputText
from tests.sim.conftest import ClusterFactory
from tests.sim.helpers import chat, long_text, records

_ids = itertools.count()


def _req(context: int) -> SimRequest:
    rid = f"a{next(_ids)}"
    rec = RequestRecord(
        id=rid,
        x_request_id=None,
        endpoint="/t",
        arrival=0.0,
        arrival_wall=0.0,
        headers_seen={},
        body={},
        prompt_tokens=context,
    )
    req = SimRequest(
        rid=rid,
        prompt=list(range(context)),
        max_output=8,
        natural_len=8,
        output=OutputText(0, context, 1, 1),
        record=rec,
    )
    req.num_computed = context
    return req


def _engine(**kw: float) -> Engine:
    cfg = SimConfig(**kw)  # type: ignore[arg-type]
    core = EngineCore(cfg)
    return Engine(core, BatchScheduler(cfg, core))


def test_step_time_grows_with_the_kv_each_sequence_attends_to() -> None:
    engine = _engine(step_base_s=0.01, prefill_token_s=0.0, decode_seq_s=0.001)
    a = engine.core.config.attention_token_s
    assert a == pytest.approx(5e-8)  # the documented H100 default
    short = [Work(_req(100), 1, decode=True) for _ in range(4)]
    long = [Work(_req(50_000), 1, decode=True) for _ in range(4)]
    assert engine.step_time(short) == pytest.approx(0.01 + 4 * 0.001 + a * 4 * 101)
    assert engine.step_time(long) == pytest.approx(0.01 + 4 * 0.001 + a * 4 * 50_001)
    chunk = Work(_req(30_000), 2048, decode=False)  # a prefill chunk reads its context too
    assert engine.step_time([chunk]) == pytest.approx(0.01 + a * 32_048)


def test_attention_term_off_restores_the_linear_model() -> None:
    engine = _engine(
        step_base_s=0.01, prefill_token_s=0.0001, decode_seq_s=0.001, attention_token_s=0
    )
    plan = [Work(_req(50_000), 1, decode=True), Work(_req(0), 100, decode=False)]
    assert engine.step_time(plan) == pytest.approx(0.01 + 0.0001 * 100 + 0.001)


def test_long_context_decodes_slower_end_to_end(
    make_cluster: ClusterFactory, client: httpx.Client
) -> None:
    """Per-token time of a stream over a ~16k-token context against one over a
    few tokens, in simulated seconds: the difference is the attention term
    (the loop's own overhead between steps lands on both alike)."""
    cfg = {"step_base_s": 0.01, "prefill_token_s": 0.0, "decode_seq_s": 0.0, "speed": 10.0}
    cluster = make_cluster(1, attention_token_s=5e-6, max_model_len=32768, **cfg)
    url = cluster.urls[0] + "/v1/chat/completions"
    for words in (10, 8000):
        body = chat(long_text(words), max_tokens=20, ignore_eos=True)
        assert client.post(url, json=body).status_code == 200
    short, long = records(cluster)
    gap = [(r["finish"] - r["first_token"]) / (r["output_tokens"] - 1) for r in (short, long)]
    expected = 5e-6 * (long["prompt_tokens"] - short["prompt_tokens"])
    assert long["prompt_tokens"] > 10_000
    assert gap[1] - gap[0] == pytest.approx(expected, rel=0.2)


def test_attention_coefficient_is_a_cli_option() -> None:
    import argparse

    from gateway.sim.cli import add_sim_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    assert config_from_args(parser.parse_args([])).attention_token_s == pytest.approx(5e-8)
    cfg = config_from_args(parser.parse_args(["--attention-token-s", "0"]))
    assert cfg.attention_token_s == 0.0
