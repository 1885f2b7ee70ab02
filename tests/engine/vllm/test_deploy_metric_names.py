"""The vLLM metric families that deploy/ queries (kept in the repository, in
tests/deploy/enginemetrics.py, so that the deploy tests need no engine) against a real
vLLM: each one is exported, with the type and the label set the repository says."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.enginemetrics import VLLM_LABELS, VLLM_TYPES, VLLM_VERSION

from .vllmserver import VLLMServer


def exported(url: str) -> dict[str, tuple[str, frozenset[str]]]:
    """Exposed family name (a counter with `_total`) -> (type, labels of its samples)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for fam in text_string_to_metric_families(text):
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        labels = frozenset(k for s in fam.samples for k in s.labels if k not in ("le", "quantile"))
        out[name] = (fam.type, labels)
    return out


def test_deploy_engine_families_are_real_vllm_families(vllm_server: VLLMServer) -> None:
    assert VLLM_VERSION == "0.32.0"  # the version scripts/vllm_engine.py prepares
    real = exported(vllm_server.url)
    wrong = {
        name: real.get(name)
        for name, kind in VLLM_TYPES.items()
        if real.get(name) != (kind, VLLM_LABELS)
    }
    assert not wrong, f"differ from the real vLLM (type, labels): {wrong}"
