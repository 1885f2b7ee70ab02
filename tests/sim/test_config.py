"""SimConfig validation (pure)."""

from __future__ import annotations

import pytest

from gateway.sim import SimConfig


def test_defaults_are_valid() -> None:
    cfg = SimConfig()
    assert cfg.flavor == "vllm" and cfg.model == "sim-model" and cfg.block_size == 16
    assert cfg.num_gpu_blocks * cfg.block_size == cfg.kv_tokens
    assert SimConfig(flavor="llamacpp", kv_tokens=1000, parallel=4).slot_ctx == 250
    assert SimConfig(flavor="llamacpp", kv_tokens=1000, unified_kv=True).slot_ctx == 1000


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"flavor": "tgi"}, "flavor"),
        ({"speed": 0}, "speed"),
        ({"kv_tokens": 0}, "kv_tokens"),
        ({"block_size": True}, "block_size"),
        ({"step_base_s": -1.0}, "step_base_s"),
        ({"attention_token_s": -1e-9}, "attention_token_s"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy"),
        ({"max_num_queued_reqs": 0}, "max_num_queued_reqs"),
        ({"api_key": ""}, "api_key"),
        ({"output_len_min": 9, "output_len_max": 3}, "output_len_min"),
        ({"max_model_len": 100, "kv_tokens": 64}, "max_model_len"),
        ({"flavor": "llamacpp", "kv_tokens": 16, "parallel": 32}, "parallel"),
        ({"unified_kv": 1}, "unified_kv"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_invalid_values_name_the_field(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(**overrides)  # type: ignore[arg-type]
