"""The engines' metric families that deploy/ may query, kept in the repository.

llama.cpp: the golden capture of the real llama-server (tests/engine/golden/), which
tests/engine/test_golden_shapes.py compares with the real server. vLLM: the families of
vLLM 0.32.0's Prometheus logger (vllm/v1/metrics/loggers.py; every one labelled
`model_name`, `engine`), the ones the dashboard and the rules may use; the real-vLLM
suite verifies them against a running vLLM (tests/engine/vllm/test_deploy_metric_names.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tests.deploy.deployfiles import ROOT

LLAMACPP_GOLDEN = ROOT / "tests" / "engine" / "golden" / "llamacpp_b11434.json"
VLLM_VERSION = "0.32.0"
VLLM_LABELS = frozenset({"model_name", "engine"})
VLLM_TYPES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries_total": "counter",
    "vllm:prefix_cache_hits_total": "counter",
    "vllm:num_preemptions_total": "counter",
    "vllm:prompt_tokens_total": "counter",
    "vllm:generation_tokens_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
}


@dataclass(frozen=True)
class EngineFamily:
    name: str
    type: str
    labels: frozenset[str]


def engine_families() -> dict[str, EngineFamily]:
    """Both engines' families by exposed name (a counter with `_total`)."""
    out = {n: EngineFamily(n, t, VLLM_LABELS) for n, t in VLLM_TYPES.items()}
    golden = json.loads(LLAMACPP_GOLDEN.read_text())
    for fam in golden["metrics"]["families"]:
        out[fam["name"]] = EngineFamily(fam["name"], fam["type"], frozenset(fam["labels"]))
    return out


def engine_family(name: str, fams: dict[str, EngineFamily]) -> EngineFamily | None:
    """The family of a series name (`x_bucket` of histogram `x`)."""
    if name in fams:
        return fams[name]
    for suffix in ("_bucket", "_sum", "_count"):
        base = name.removesuffix(suffix)
        if base != name and base in fams and fams[base].type == "histogram":
            return fams[base]
    return None
