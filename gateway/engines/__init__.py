"""Per-engine adapters: everything engine-specific, one adapter per engine kind.

Output limits, error normalisation, cancellation behaviour, kind detection,
context length, live-state readings, exact token counts, slot pinning and
cache feedback are the adapter's (`base.EngineAdapter`); nothing outside this
package branches on the engine kind (`tests/engines/test_engine_kinds.py`).
"""

from __future__ import annotations

from gateway.engines.base import EngineAdapter, GenericAdapter
from gateway.engines.llamacpp import LlamaCppAdapter
from gateway.engines.probe import EngineGet, EnginePost, LiveReader
from gateway.engines.sglang import SGLangAdapter
from gateway.engines.vllm import VLLMAdapter

GENERIC: EngineAdapter = GenericAdapter()

#: in the order `kind: auto` asks: each probe is one GET the others do not answer alike
_DETECTED: tuple[EngineAdapter, ...] = (LlamaCppAdapter(), SGLangAdapter(), VLLMAdapter())

_ADAPTERS: dict[str, EngineAdapter] = {a.kind: a for a in (*_DETECTED, GENERIC)}


def adapter_for(kind: str) -> EngineAdapter:
    """The adapter of an engine kind; the generic one for `unknown` or `auto`."""
    return _ADAPTERS.get(kind, GENERIC)


async def detect_kind(get: EngineGet) -> str:
    """The kind of the engine behind `get`, or `unknown`."""
    for adapter in _DETECTED:
        if await adapter.detect(get):
            return adapter.kind
    return GENERIC.kind


__all__ = [
    "GENERIC",
    "EngineAdapter",
    "EngineGet",
    "EnginePost",
    "LiveReader",
    "adapter_for",
    "detect_kind",
]
