"""vLLM 0.32's response fields the simulator fills with constants (nulls, mostly).

Checked against a real vLLM 0.32.0 by `tests/engine/vllm/test_sim_fidelity_vllm.py`.
"""

from __future__ import annotations

from typing import Any

VLLM_FINGERPRINT = "vllm-0.32.0-sim"


def vllm_message(text: str) -> dict[str, Any]:
    """A chat choice's `message`."""
    return {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }


def vllm_choice_extras(endpoint: str, stream: bool) -> dict[str, Any]:
    """Null fields of a choice (after `finish_reason` / `stop_reason`)."""
    extras: dict[str, Any] = {"token_ids": None}
    if endpoint == "completion":
        extras["prompt_token_ids"] = None
        if not stream:
            extras["prompt_logprobs"] = None
    if not stream:
        extras["routed_experts"] = None
    return extras


def vllm_body_extras(endpoint: str) -> dict[str, Any]:
    """Top-level fields of a whole (non-streamed) body besides id/object/choices/usage."""
    extras: dict[str, Any] = {
        "service_tier": None,
        "system_fingerprint": VLLM_FINGERPRINT,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
    if endpoint == "chat":
        extras.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    return extras


def model_permission(created: int) -> dict[str, Any]:
    """The one entry of a model card's `permission` list."""
    return {
        "id": f"modelperm-sim{created:x}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
