"""llama-server's larger static bodies: `/props`, `/v1/models`, sampling params.

Keys and value types copy llama.cpp b11434 (`tests/engine/golden/llamacpp_b11434.json`;
`tests/engine/test_sim_fidelity.py` compares them with a real server). Values are
llama-server's defaults; only the simulated model's numbers differ.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.sim.config import SimConfig

LLAMA_BUILD = "b11434-sim"
SAMPLERS = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}<|assistant|>\n"
)


def generation_params(
    n_predict: int = -1, stream: bool = False, ignore_eos: bool = False
) -> dict[str, Any]:
    """A slot's (or the server default) sampling parameters, as `/props` and `/slots` show them."""
    return {
        "seed": 4294967295,
        "temperature": 0.8,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "top_n_sigma": -1.0,
        "xtc_probability": 0.0,
        "xtc_threshold": 0.1,
        "typical_p": 1.0,
        "repeat_last_n": 64,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "dry_multiplier": 0.0,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": 64,
        "mirostat": 0,
        "mirostat_tau": 5.0,
        "mirostat_eta": 0.1,
        "adaptive_target": -1.0,
        "adaptive_decay": 0.9,
        "max_tokens": n_predict,
        "n_predict": n_predict,
        "n_keep": 0,
        "n_discard": 0,
        "ignore_eos": ignore_eos,
        "stream": stream,
        "n_probs": 0,
        "min_keep": 0,
        "chat_format": "Content-only",
        "reasoning_format": "none",
        "reasoning_in_content": False,
        "generation_prompt": "",
        "samplers": list(SAMPLERS),
        "speculative.types": "none",
        "timings_per_token": False,
        "post_sampling_probs": False,
        "backend_sampling": False,
        "lora": [],
    }


def task_settings(n_predict: int, stream: bool, ignore_eos: bool) -> dict[str, Any]:
    """`generation_settings` of a native `/completion` answer: the params plus the
    grammar, stop and bias fields (empty here)."""
    return {
        **generation_params(n_predict, stream, ignore_eos),
        "dry_sequence_breakers": ["\n", ":", '"', "*"],
        "stop": [],
        "logit_bias": [],
        "grammar": "",
        "grammar_lazy": False,
        "grammar_triggers": [],
        "preserved_tokens": [],
    }


def props_body(cfg: SimConfig) -> dict[str, Any]:
    path = f"/models/{cfg.model}.gguf"
    return {
        "default_generation_settings": {"params": generation_params(), "n_ctx": cfg.slot_ctx},
        "total_slots": cfg.parallel,
        "model_alias": cfg.model,
        "model_ftype": "Q4_K_M",
        "model_path": path,
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": "<__media__>",
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": cfg.metrics_enabled,
        "ui": True,
        "ui_settings": {},
        "chat_template": TEMPLATE,
        "chat_template_caps": {
            name: name == "supports_string_content" or name == "supports_system_role"
            for name in (
                "supports_object_arguments",
                "supports_parallel_tool_calls",
                "supports_preserve_reasoning",
                "supports_reasoning_effort",
                "supports_string_content",
                "supports_system_role",
                "supports_tool_calls",
                "supports_tools",
                "supports_typed_content",
            )
        },
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end|>",
        "build_info": LLAMA_BUILD,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
    }


def models_body(cfg: SimConfig) -> dict[str, Any]:
    """`/v1/models` (and `/models`): an Ollama-style `models` list plus OpenAI `data`."""
    meta = {
        "vocab_type": 2,
        "n_vocab": 131072,
        "n_ctx": cfg.slot_ctx,
        "n_ctx_train": cfg.max_model_len,
        "n_embd": 4096,
        "n_params": 8030261248,
        "size": 4920733696,
        "ftype": "Q4_K_M",
    }
    card = {
        "id": cfg.model,
        "aliases": [cfg.model],
        "tags": [],
        "object": "model",
        "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
        "created": int(time.time()),
        "owned_by": "llamacpp",
        "meta": meta,
    }
    details = {
        "parent_model": "",
        "format": "gguf",
        "family": "",
        "families": [""],
        "parameter_size": "",
        "quantization_level": "",
    }
    listing = {
        "name": cfg.model,
        "model": cfg.model,
        "modified_at": "",
        "size": "",
        "digest": "",
        "type": "model",
        "description": "",
        "tags": [""],
        "capabilities": ["completion"],
        "parameters": "",
        "details": details,
    }
    return {"models": [listing], "object": "list", "data": [card]}
