"""Per-engine adapters: health semantics, error normalisation, parameter mapping.

Engine-specific shapes are translated here, at the adapter boundary, and
nowhere else. Metrics parsing and capacity discovery live next to these
adapters (`gateway.engines.readings`).
"""

from __future__ import annotations

from gateway.engines.base import EngineAdapter, GenericAdapter
from gateway.engines.llamacpp import LlamaCppAdapter
from gateway.engines.vllm import VLLMAdapter

_ADAPTERS: dict[str, EngineAdapter] = {
    "vllm": VLLMAdapter(),
    "llamacpp": LlamaCppAdapter(),
    "unknown": GenericAdapter(),
}


def adapter_for(kind: str) -> EngineAdapter:
    return _ADAPTERS.get(kind, _ADAPTERS["unknown"])


__all__ = ["EngineAdapter", "adapter_for"]
