"""The learned prompt ratio: engine count / estimate, per replica and model."""

from __future__ import annotations

import math

import pytest

from gateway.policy.learned import MIN_SAMPLES, PromptRatios

VLLM = ("vllm", "m")


def test_no_ratio_before_the_minimum_then_the_windowed_p90() -> None:
    ratios = PromptRatios()
    for i in range(MIN_SAMPLES - 1):
        ratios.record("a", VLLM, "m", 100, 50 + i)
    assert ratios.ratio("a", "m") is None
    assert ratios.corrected("a", "m", 1000) == 1000
    ratios.record("a", VLLM, "m", 100, 50 + MIN_SAMPLES - 1)
    samples = sorted((50 + i) / 100 for i in range(MIN_SAMPLES))
    p90 = samples[int(0.9 * MIN_SAMPLES)]
    assert ratios.ratio("a", "m") == pytest.approx(p90)
    assert ratios.corrected("a", "m", 1000) == math.ceil(1000 * p90)
    # It covers nine requests in ten: few samples lie above it.
    assert sum(s > p90 for s in samples) <= MIN_SAMPLES // 10
    assert ratios.ratio("b", "m") is None and ratios.ratio("a", "other") is None


def test_the_ratio_is_bounded() -> None:
    ratios = PromptRatios()
    for _ in range(MIN_SAMPLES):
        ratios.record("low", VLLM, "m", 1000, 1)  # 0.001: clamped up
        ratios.record("high", VLLM, "m", 100, 300)  # an estimate under the count: never below it
    assert ratios.ratio("low", "m") == 0.3
    assert ratios.ratio("high", "m") == 1.0
    assert ratios.corrected("high", "m", 77) == 77


def test_a_replica_whose_model_or_engine_changes_starts_over() -> None:
    ratios = PromptRatios()
    for _ in range(MIN_SAMPLES):
        ratios.record("a", VLLM, "m", 100, 60)
    assert ratios.ratio("a", "m") == pytest.approx(0.6)
    ratios.identify("a", VLLM)
    assert ratios.ratio("a", "m") == pytest.approx(0.6)
    ratios.identify("a", ("vllm", "other-model"))
    assert ratios.ratio("a", "m") is None and ratios.describe() == {"a": {}}
    for _ in range(MIN_SAMPLES):
        ratios.record("a", ("vllm", "other-model"), "m", 100, 60)
    ratios.record("a", ("llamacpp", "other-model"), "m", 100, 60)  # another engine: one sample
    assert ratios.describe() == {"a": {"m": {"samples": 1, "ratio": None}}}
    ratios.forget("a")
    assert ratios.describe() == {}


def test_a_request_without_a_count_teaches_nothing() -> None:
    ratios = PromptRatios()
    for _ in range(MIN_SAMPLES):
        ratios.record("a", VLLM, "m", 100, 0)
        ratios.record("a", VLLM, "m", 0, 100)
    assert ratios.describe() == {}
    assert ratios.items() == []
