"""Engine live-state parsing: both vLLM metric generations, several engines, llama.cpp slots."""

from __future__ import annotations

import pytest

from gateway.engines.readings import MetricsParseError, parse_llamacpp, parse_vllm_metrics

VLLM_NEW_TWO_ENGINES = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="3000"} 1.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1200.0
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:prompt_tokens_total{engine="1",model_name="m"} 800.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 50.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_total{engine="1",model_name="m"} 1.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 2.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.3
"""

# vLLM <= 0.10: the old usage gauge, capacity given only as kv_cache_size_tokens, untyped counters.
VLLM_OLD = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.125
vllm:cache_config_info{block_size="32",kv_cache_size_tokens="64000",model_name="m"} 1.0
vllm:num_requests_running{model_name="m"} 7
vllm:num_requests_waiting{model_name="m"} 0
vllm:num_preemptions_total{model_name="m"} 9
vllm:prompt_tokens_total{model_name="m"} 31
"""


def test_vllm_new_generation_sums_engines() -> None:
    r = parse_vllm_metrics(VLLM_NEW_TWO_ENGINES)
    assert r.engines == 2
    assert r.capacity_tokens == 16 * 1000 + 16 * 3000
    # per-engine fraction times that engine's capacity, summed
    assert r.used_tokens == round(0.5 * 16000 + 0.25 * 48000)
    assert (r.running, r.waiting) == (5, 5)
    assert r.prompt_tokens_total == 2000.0
    assert r.generation_tokens_total == 50.0
    assert r.preemptions_total == 3.0


def test_vllm_old_generation() -> None:
    r = parse_vllm_metrics(VLLM_OLD)
    assert r.capacity_tokens == 64000
    assert r.used_tokens == 8000
    assert (r.running, r.waiting) == (7, 0)
    assert r.preemptions_total == 9.0
    assert r.prompt_tokens_total == 31.0


def test_vllm_without_cache_info_has_unknown_capacity() -> None:
    r = parse_vllm_metrics('vllm:num_requests_waiting{engine="0"} 2\n')
    assert r.capacity_tokens is None and r.used_tokens is None and r.waiting == 2


def test_bad_text_is_a_parse_error() -> None:
    with pytest.raises(MetricsParseError):
        parse_vllm_metrics("vllm:num_requests_waiting{engine=0 2\n")


LLAMA_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 4096
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 300
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 1500.5
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 42
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""


def _slots() -> list[dict[str, object]]:
    return [
        # n_prompt_tokens is the slot's whole context (prompt + decoded so far).
        {
            "id": 0,
            "n_ctx": 8192,
            "is_processing": True,
            "n_prompt_tokens": 1024,
            "next_token": [{"has_next_token": True, "n_decoded": 24}],
        },
        {
            "id": 1,
            "n_ctx": 8192,
            "is_processing": True,
            "n_prompt_tokens": 510,
            "next_token": {"n_decoded": 10},
        },
        {"id": 2, "n_ctx": 8192, "is_processing": False, "n_prompt_tokens": 7000},
        {"id": 3, "n_ctx": 8192, "is_processing": False},
    ]


def test_llamacpp_slots_props_and_metrics() -> None:
    props = {"total_slots": 4, "default_generation_settings": {"n_ctx": 8192}}
    r = parse_llamacpp(props, _slots(), LLAMA_METRICS)
    assert r.capacity_tokens == 4 * 8192
    assert r.used_tokens == 1024 + 510  # busy slots only; an idle slot's cached prompt is free
    assert (r.running, r.waiting, r.max_in_flight) == (2, 3, 4)
    assert r.prompt_tokens_total == 4096.0
    assert r.generation_tokens_total == 300.0
    assert r.prompt_tokens_per_s == 1500.5
    assert r.decode_tokens_per_s == 42.0


def test_llamacpp_without_metrics_or_props() -> None:
    r = parse_llamacpp(None, _slots(), None)
    assert r.capacity_tokens == 4 * 8192 and r.max_in_flight == 4
    assert r.running == 2 and r.waiting is None and r.prompt_tokens_total is None


def test_llamacpp_without_slots_endpoint() -> None:
    props = {"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
    r = parse_llamacpp(props, None, LLAMA_METRICS)
    assert r.capacity_tokens == 8192 and r.used_tokens is None and r.running == 2
