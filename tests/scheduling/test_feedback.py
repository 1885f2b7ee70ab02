"""Feedback from the engines' answers: a real gateway in front of one
simulated vLLM replica whose reported cache hits correct the prefix index.

The prediction is read from `gateway_routing_prefix_prediction_error_tokens`
(predicted - reported cached tokens, one observation per answer)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from gateway.config.scheduling import SchedulingConfig
from gateway.request.context import PrefixBlocks
from gateway.scheduling.feedback import apply_feedback
from gateway.scheduling.metrics import SchedulingMetrics
from gateway.scheduling.prefix import PrefixIndex
from gateway.sim.cluster import SimCluster
from tests.gwharness import RunningGateway, running_gateway
from tests.scheduling.test_routing import wait_healthy


def prompt(tag: str, n: int = 300) -> str:
    return f"conversation {tag}: " + " ".join(f"{tag}-word{i}" for i in range(n))


def buckets(gw: RunningGateway) -> dict[float, float]:
    """Cumulative counts of the prediction-error histogram by upper bound."""
    pattern = r'^gateway_routing_prefix_prediction_error_tokens_bucket\{le="([^"]+)",[^}]*\} (\S+)$'
    return {float(le): float(n) for le, n in re.findall(pattern, gw.metrics_text(), re.M)}


def send(gw: RunningGateway, content: str) -> tuple[int, float]:
    """(engine-reported cached tokens, upper bound of the histogram bucket its
    predicted - reported error fell in) of one request."""
    before = buckets(gw)
    resp = gw.openai().chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": content}], max_tokens=2
    )
    after = buckets(gw)
    assert after[float("inf")] == before.get(float("inf"), 0) + 1
    bound = min(le for le, n in after.items() if n > before.get(le, 0))
    assert resp.usage is not None and resp.usage.prompt_tokens_details is not None
    cached = resp.usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    return cached, bound


EXACT = 0.5  # the bucket (-0.5, 0.5]: no error
WITHIN_BLOCK = (-16.0, EXACT, 16.0)  # |error| <= 16 tokens: the engine's block rounding


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    with SimCluster.start(1, speed=40, kv_tokens=8192, max_model_len=4096) as c:
        yield c


@pytest.fixture
def gw(cluster: SimCluster) -> Iterator[RunningGateway]:
    cluster.reset()
    with running_gateway(cluster.urls) as g:
        wait_healthy(g, 1)
        yield g


def test_a_prediction_the_engine_confirms_has_no_error(gw: RunningGateway) -> None:
    a = prompt("a")
    assert send(gw, a) == (0, EXACT)
    cached, error = send(gw, a)
    assert cached > 0
    assert error in WITHIN_BLOCK


def test_an_engine_that_lost_its_cache_corrects_older_entries(
    gw: RunningGateway, cluster: SimCluster
) -> None:
    a, c, b = prompt("a"), prompt("c"), prompt("b")
    for p in (a, c, b):
        send(gw, p)
    cluster.reset(clear_cache=True)  # the engine's KV is gone, as after a restart
    cached, error = send(gw, b)
    assert cached == 0 and error >= 256  # the index believed b cached
    # b's miss says everything used no later than b went too: a and c.
    assert send(gw, a) == (0, EXACT)
    assert send(gw, c) == (0, EXACT)
    # What the engine recomputed is held again, and the index knows it.
    cached, error = send(gw, b)
    assert cached > 0 and error in WITHIN_BLOCK


def test_an_engine_evicting_under_pressure_is_followed(cluster: SimCluster) -> None:
    """The index sizes itself from an estimate (here 8 bytes per token: twice
    what the engine holds); the engine's misses correct it."""
    cluster.reset()
    with running_gateway(cluster.urls, scheduling=SchedulingConfig(chars_per_token=8.0)) as gw:
        wait_healthy(gw, 1)
        first, second = prompt("first"), prompt("second")
        send(gw, first)
        send(gw, second)
        for i in range(6):  # ~2,700 tokens each through a KV of 8,192: both are evicted
            send(gw, prompt(f"other{i}", 350))
        cached, error = send(gw, second)
        assert cached == 0 and error >= 256  # the index still believed it held `second`
        # ... and so everything used before it: `first` is predicted uncached.
        assert send(gw, first) == (0, EXACT)


def learned(gw: RunningGateway) -> float:
    found = re.findall(
        r"^gateway_routing_prefix_index_learned_blocks_total\{[^}]*\} (\S+)$",
        gw.metrics_text(),
        re.M,
    )
    return sum(float(n) for n in found)


def test_an_engine_holding_more_than_predicted_is_learned(cluster: SimCluster) -> None:
    """An index sized too small (1 byte per token: 8 blocks) forgets what the
    engine still holds; the engine's hits say so."""
    cluster.reset()
    with running_gateway(cluster.urls, scheduling=SchedulingConfig(chars_per_token=1.0)) as gw:
        wait_healthy(gw, 1)
        a = prompt("a")
        send(gw, a)
        for tag in "bcde":  # 2 blocks each: the index's 8 no longer hold `a`; the engine does
            send(gw, prompt(tag))
        assert learned(gw) == 0
        cached, error = send(gw, a)
        assert cached > 0 and error <= -256  # the engine held more than predicted
        assert learned(gw) >= 2


def test_a_streamed_answer_corrects_the_index_too(gw: RunningGateway, cluster: SimCluster) -> None:
    a, b = prompt("a"), prompt("b")
    send(gw, a)
    send(gw, b)
    cluster.reset(clear_cache=True)
    before = buckets(gw)
    stream = gw.openai().chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": b}],
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert len(usage) == 1 and usage[0].prompt_tokens_details is not None
    assert usage[0].prompt_tokens_details.cached_tokens == 0
    after = buckets(gw)
    assert after[float("inf")] == before[float("inf")] + 1
    assert min(le for le, n in after.items() if n > before.get(le, 0)) >= 256
    assert send(gw, a) == (0, EXACT)  # dropped by b's streamed miss


def test_a_one_block_shortfall_is_rounding_and_two_blocks_drop() -> None:
    idx = PrefixIndex(capacity_blocks=100, ttl_s=60.0, clock=lambda: 0.0)
    metrics = SchedulingMetrics(None)
    old, chain = [10, 11, 12], [1, 2, 3, 4]
    blocks = PrefixBlocks(tuple(chain), 4096, 1024)
    idx.insert(old)
    idx.insert(chain)
    stamps = idx.insert(chain)  # routed again: the engine computes it
    apply_feedback(idx, "r", stamps, blocks, 3, metrics)  # one block short: rounding
    assert idx.matched_blocks(old) == 3
    apply_feedback(idx, "r", stamps, blocks, 2, metrics)  # blocks 2.. were gone, and older
    assert idx.matched_blocks(old) == 0
    assert idx.matched_blocks(chain) == 4
