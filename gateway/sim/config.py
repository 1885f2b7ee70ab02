"""Every knob of one simulated replica, in one frozen dataclass.

Times are *simulated* seconds: the simulator divides every wait by `speed`,
so `speed=100` runs a 2 s generation in 20 ms of wall time. Defaults are
loosely calibrated to an 8B model in bf16 on one H100-class GPU:

- prefill ~16k tokens/s (`prefill_token_s` = 62.5 us per uncached token),
- a decode step of ~15 ms plus 0.3 ms per sequence in the batch
  (~25 ms at batch 32, ~55 ms at batch 128),
- plus 50 ns per KV token each sequence in the step attends to
  (`attention_token_s`). Attention reads every sequence's whole context
  from HBM each step: Llama-3-8B (32 layers, 8 KV heads of 128, bf16)
  keeps 128 KiB of K and V per token, and an H100 SXM streams ~2.7 TB/s
  of its 3.35 TB/s peak in paged-attention kernels: 131072 B / 2.7e12 B/s
  ≈ 49 ns. So 32 sequences of 8k tokens add ~13 ms a step, and one of
  100k tokens 5 ms: long contexts and many streams slow every step,
- a KV pool of 262,144 tokens (vLLM `num_gpu_blocks` x `block_size`;
  llama.cpp `--ctx-size`).

These figures are orders of magnitude, not measurements of a real engine.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

Flavor = Literal["vllm", "llamacpp", "sglang"]
SchedulingPolicy = Literal["fcfs", "priority"]

_FLAVORS = ("vllm", "llamacpp", "sglang")
_POLICIES = ("fcfs", "priority")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Knobs of one simulated engine replica (see the module docstring for units)."""

    flavor: Flavor = "vllm"
    model: str = "sim-model"
    #: vLLM `--max-model-len`; llama.cpp reports it as `n_ctx_train`.
    max_model_len: int = 32768
    #: KV pool in tokens: vLLM `num_gpu_blocks * block_size`; llama.cpp `--ctx-size`.
    kv_tokens: int = 262144
    block_size: int = 16
    enable_prefix_caching: bool = True
    # --- vLLM scheduler -------------------------------------------------------
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    scheduling_policy: SchedulingPolicy = "fcfs"
    #: vLLM `--max-num-queued-reqs`: 503 "engine is currently busy" beyond it.
    max_num_queued_reqs: int | None = None
    #: vLLM <= 0.31: 400 when prompt + max_tokens > max_model_len (later: clamp).
    reject_overlong_output: bool = False
    #: Export the old `vllm:gpu_cache_usage_perc` gauge too (vLLM <= 0.10).
    legacy_metrics: bool = False
    #: Publish KV cache events on this ZMQ endpoint (bound; `ipc://PATH` or
    #: `tcp://127.0.0.1:PORT`), as vLLM's `--kv-events-config`; None: off.
    kv_events_endpoint: str | None = None
    # --- llama.cpp slots ------------------------------------------------------
    #: `--parallel`: number of slots, each `kv_tokens // parallel` tokens.
    parallel: int = 4
    #: `--kv-unified`: every slot may use the whole context, sharing one pool.
    unified_kv: bool = False
    #: `--batch-size`: prompt tokens processed per llama_decode() call.
    n_batch: int = 2048
    #: `--slot-prompt-similarity`: minimum prefix overlap to prefer a slot.
    slot_prompt_similarity: float = 0.1
    #: `--metrics`: expose `/metrics` (llama.cpp only; vLLM always does).
    metrics_enabled: bool = True
    #: How often llama-server notices a closed connection (simulated seconds).
    disconnect_poll_s: float = 1.0
    # --- both flavours --------------------------------------------------------
    #: `--api-key`: protects the inference routes (not /health, /metrics, /tokenize).
    api_key: str | None = None
    #: Loading time before the server is ready (simulated seconds).
    warmup_s: float = 0.0
    #: Wall-clock speed-up: every simulated duration is divided by it.
    speed: float = 1.0
    seed: int = 0
    # --- time model: base + prefill tokens * a + decoding seqs * b + attended KV * c
    step_base_s: float = 0.015
    prefill_token_s: float = 0.0000625
    decode_seq_s: float = 0.0003
    #: Per KV token each sequence of a step attends to (its context so far
    #: plus the step's new tokens); 0 turns the attention term off.
    attention_token_s: float = 0.00000005
    # --- natural output length when the request sets no cap -------------------
    output_len_min: int = 16
    output_len_max: int = 256

    def __post_init__(self) -> None:
        problems = [p for p in (_check_field(self, f.name) for f in fields(self)) if p]
        problems += _check_relations(self)
        if problems:
            raise ValueError("invalid SimConfig: " + "; ".join(problems))

    @property
    def num_gpu_blocks(self) -> int:
        return self.kv_tokens // self.block_size

    @property
    def slot_ctx(self) -> int:
        """Tokens one llama.cpp slot may hold (its `n_ctx`)."""
        return self.kv_tokens if self.unified_kv else self.kv_tokens // self.parallel


_POSITIVE_INTS = (
    "max_model_len",
    "kv_tokens",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "parallel",
    "n_batch",
    "output_len_min",
    "output_len_max",
)
_NON_NEGATIVE_FLOATS = (
    "warmup_s",
    "step_base_s",
    "prefill_token_s",
    "decode_seq_s",
    "attention_token_s",
    "slot_prompt_similarity",
)
_BOOLS = (
    "enable_prefix_caching",
    "reject_overlong_output",
    "legacy_metrics",
    "unified_kv",
    "metrics_enabled",
)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _non_negative_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _positive_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _check_field(cfg: SimConfig, name: str) -> str | None:
    value = getattr(cfg, name)
    if name in _POSITIVE_INTS and not _positive_int(value):
        return f"{name} must be a positive integer, got {value!r}"
    if name in _NON_NEGATIVE_FLOATS and not _non_negative_number(value):
        return f"{name} must be a number >= 0, got {value!r}"
    if name in _BOOLS and not isinstance(value, bool):
        return f"{name} must be a bool, got {value!r}"
    return _check_special(name, value)


def _check_special(name: str, value: object) -> str | None:
    if name == "flavor" and value not in _FLAVORS:
        return f"flavor must be one of {_FLAVORS}, got {value!r}"
    if name == "scheduling_policy" and value not in _POLICIES:
        return f"scheduling_policy must be one of {_POLICIES}, got {value!r}"
    if name == "model" and not (isinstance(value, str) and value):
        return f"model must be a non-empty string, got {value!r}"
    if name == "max_num_queued_reqs" and value is not None and not _positive_int(value):
        return f"max_num_queued_reqs must be a positive integer or None, got {value!r}"
    if name == "api_key" and value is not None and not (isinstance(value, str) and value):
        return f"api_key must be a non-empty string or None, got {value!r}"
    if name == "kv_events_endpoint" and value is not None and not _local_endpoint(value):
        return f"kv_events_endpoint must be ipc://PATH or tcp://127.0.0.1:PORT, got {value!r}"
    if name in ("speed", "disconnect_poll_s") and not _positive_number(value):
        return f"{name} must be a number > 0, got {value!r}"
    if name == "seed" and not _is_int(value):
        return f"seed must be an integer, got {value!r}"
    return None


def _local_endpoint(value: object) -> bool:
    if not isinstance(value, str):
        return False
    if value.startswith("ipc://"):
        return len(value) > len("ipc://")
    port = value.removeprefix("tcp://127.0.0.1:")
    return value.startswith("tcp://127.0.0.1:") and port.isdigit() and 0 < int(port) < 65536


def _check_relations(cfg: SimConfig) -> list[str]:
    problems: list[str] = []
    if cfg.kv_events_endpoint is not None and cfg.flavor != "vllm":
        problems.append("kv_events_endpoint is a vLLM setting (flavor must be 'vllm')")
    if (
        _is_int(cfg.output_len_min)
        and _is_int(cfg.output_len_max)
        and (cfg.output_len_min > cfg.output_len_max)
    ):
        problems.append("output_len_min must be <= output_len_max")
    if not (_is_int(cfg.kv_tokens) and _is_int(cfg.block_size) and _is_int(cfg.parallel)):
        return problems
    if cfg.kv_tokens < cfg.block_size:
        problems.append("kv_tokens must hold at least one block")
    if cfg.flavor == "vllm" and _is_int(cfg.max_model_len) and cfg.max_model_len > cfg.kv_tokens:
        # vLLM refuses to start when one max-length sequence cannot fit.
        problems.append(
            f"max_model_len ({cfg.max_model_len}) exceeds the KV pool ({cfg.kv_tokens} tokens)"
        )
    if cfg.flavor == "llamacpp" and cfg.kv_tokens < cfg.parallel:
        problems.append("kv_tokens must be >= parallel")
    return problems
