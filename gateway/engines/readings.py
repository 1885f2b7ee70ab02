"""Engine live-state parsing: Prometheus text and llama.cpp JSON → `EngineReading`.

vLLM (`GET /metrics`): capacity from `vllm:cache_config_info` (labels
`num_gpu_blocks` × `block_size`, or `kv_cache_size_tokens`), usage from
`vllm:kv_cache_usage_perc` (new) or `vllm:gpu_cache_usage_perc` (≤ 0.10),
queue gauges `vllm:num_requests_running|waiting`, counters `vllm:prompt_tokens`,
`vllm:generation_tokens`, `vllm:num_preemptions`. Several data-parallel
engines appear as several `engine` label values: capacities, usages and
counts are summed over them.

llama.cpp: `/props` (`total_slots`, `default_generation_settings.n_ctx`, the
per-slot context), `/slots` (busy slots and their tokens), `/metrics` when
enabled (`llamacpp:prompt_tokens_seconds` etc.). Its KV metrics were removed,
so headroom is derived from the slots: capacity = slots × per-slot n_ctx.

SGLang (`GET /metrics`, names from `sglang.srt.metrics.collector`): capacity
`sglang:max_total_num_tokens` (the KV pool), usage `sglang:num_used_tokens`
(else `sglang:token_usage` × capacity), `sglang:num_running_reqs`,
`sglang:num_queue_reqs`, counters `sglang:prompt_tokens_total`,
`sglang:generation_tokens_total`, `sglang:num_retracted_requests_total`
(retractions: its preemptions), gauge `sglang:gen_throughput`; one label set
per data-parallel rank, summed. `GET /get_server_info` (read once) gives
`max_running_requests` and, without metrics, `max_total_num_tokens`.

Text is parsed with `prometheus_client`'s parser, never with regexes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One poll of one replica, in tokens and request counts (None: not exposed)."""

    capacity_tokens: int | None = None
    used_tokens: int | None = None
    running: int | None = None
    waiting: int | None = None
    max_in_flight: int | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    preemptions_total: float | None = None
    #: Engine-reported average throughput (llama.cpp gauges), tokens/s.
    prompt_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    engines: int = 1


class MetricsParseError(ValueError):
    """The text is not valid Prometheus exposition format."""


def parse_prometheus(text: str) -> dict[str, list[Sample]]:
    """Samples by sample name (`_total` kept on counters), all label sets."""
    out: dict[str, list[Sample]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[sample.name].append(sample)
    except ValueError as exc:  # the parser raises ValueError (and subclasses) on bad input
        raise MetricsParseError(str(exc)) from exc
    return dict(out)


def _sum(samples: Mapping[str, list[Sample]], *names: str) -> float | None:
    """Sum over label sets of the first name present."""
    for name in names:
        found = samples.get(name)
        if found:
            return sum(s.value for s in found)
    return None


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


def _label_int(labels: Mapping[str, str], name: str) -> int | None:
    raw = labels.get(name)
    if raw is None:
        return None
    try:
        return int(float(raw))
    except ValueError:
        return None


def _engine_capacity(labels: Mapping[str, str]) -> int | None:
    blocks, block_size = _label_int(labels, "num_gpu_blocks"), _label_int(labels, "block_size")
    if blocks is not None and block_size is not None and blocks > 0 and block_size > 0:
        return blocks * block_size
    tokens = _label_int(labels, "kv_cache_size_tokens")
    return tokens if tokens is not None and tokens > 0 else None


def _by_engine(samples: Iterable[Sample]) -> dict[str, float]:
    return {s.labels.get("engine", ""): s.value for s in samples}


def _vllm_kv(samples: Mapping[str, list[Sample]]) -> tuple[int | None, int | None, int]:
    """(capacity, used, engines): per engine usage fraction × that engine's capacity."""
    capacity: dict[str, int] = {}
    for s in samples.get("vllm:cache_config_info", []):
        cap = _engine_capacity(s.labels)
        if cap is not None:
            capacity[s.labels.get("engine", "")] = cap
    usage = _by_engine(
        samples.get("vllm:kv_cache_usage_perc") or samples.get("vllm:gpu_cache_usage_perc") or []
    )
    engines = max(len(capacity), len(usage), 1)
    if not capacity:
        return None, None, engines
    total = sum(capacity.values())
    if not usage:
        return total, None, engines
    used = sum(frac * capacity.get(eng, total // engines) for eng, frac in usage.items())
    return total, round(used), engines


def parse_vllm_metrics(text: str) -> EngineReading:
    s = parse_prometheus(text)
    capacity, used, engines = _vllm_kv(s)
    return EngineReading(
        capacity_tokens=capacity,
        used_tokens=used,
        running=_int(_sum(s, "vllm:num_requests_running")),
        waiting=_int(_sum(s, "vllm:num_requests_waiting")),
        prompt_tokens_total=_sum(s, "vllm:prompt_tokens_total", "vllm:prompt_tokens"),
        generation_tokens_total=_sum(s, "vllm:generation_tokens_total", "vllm:generation_tokens"),
        preemptions_total=_sum(s, "vllm:num_preemptions_total", "vllm:num_preemptions"),
        engines=engines,
    )


def _props_slots(props: Any) -> tuple[int | None, int | None]:
    """(total_slots, per-slot n_ctx) from `/props`."""
    if not isinstance(props, dict):
        return None, None
    total = props.get("total_slots")
    settings = props.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    return (
        total if isinstance(total, int) and total > 0 else None,
        n_ctx if isinstance(n_ctx, int) and n_ctx > 0 else None,
    )


def _slot_tokens(slot: Mapping[str, Any]) -> int:
    """Tokens a busy slot holds now. In llama-server (b11434, checked live)
    `n_prompt_tokens` already includes the tokens generated so far, so it is
    the whole context of the slot; adding `next_token.n_decoded` would count
    every generated token twice."""
    tokens = slot.get("n_prompt_tokens")
    return tokens if isinstance(tokens, int) and tokens > 0 else 0


def parse_llamacpp(props: Any, slots: Any, metrics_text: str | None) -> EngineReading:
    """Combine `/props`, `/slots` (JSON-decoded) and optional `/metrics` text."""
    total_slots, n_ctx = _props_slots(props)
    slot_list = [x for x in slots if isinstance(x, dict)] if isinstance(slots, list) else []
    if total_slots is None and slot_list:
        total_slots = len(slot_list)
    if n_ctx is None and slot_list and isinstance(slot_list[0].get("n_ctx"), int):
        n_ctx = slot_list[0]["n_ctx"]
    busy = [x for x in slot_list if x.get("is_processing") is True]
    capacity = total_slots * n_ctx if total_slots and n_ctx else None
    m = parse_prometheus(metrics_text) if metrics_text else {}
    deferred = _int(_sum(m, "llamacpp:requests_deferred"))
    return EngineReading(
        capacity_tokens=capacity,
        used_tokens=sum(_slot_tokens(x) for x in busy) if slot_list else None,
        running=len(busy) if slot_list else _int(_sum(m, "llamacpp:requests_processing")),
        waiting=deferred,
        max_in_flight=total_slots,
        prompt_tokens_total=_sum(m, "llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens"),
        generation_tokens_total=_sum(
            m, "llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted"
        ),
        prompt_tokens_per_s=_positive(_sum(m, "llamacpp:prompt_tokens_seconds")),
        decode_tokens_per_s=_positive(_sum(m, "llamacpp:predicted_tokens_seconds")),
    )


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


def _positive_int(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None


def parse_sglang(metrics_text: str, server_info: Any) -> EngineReading:
    """SGLang's `/metrics` text and its `/get_server_info` (JSON-decoded, or None)."""
    s = parse_prometheus(metrics_text)
    info = server_info if isinstance(server_info, dict) else {}
    capacity = _int(_sum(s, "sglang:max_total_num_tokens")) or _positive_int(
        info.get("max_total_num_tokens")
    )
    used = _int(_sum(s, "sglang:num_used_tokens"))
    usage = _sum(s, "sglang:token_usage")
    if used is None and usage is not None and capacity:
        used = round(usage * capacity)
    return EngineReading(
        capacity_tokens=capacity or None,
        used_tokens=used,
        running=_int(_sum(s, "sglang:num_running_reqs")),
        waiting=_int(_sum(s, "sglang:num_queue_reqs")),
        max_in_flight=_positive_int(info.get("max_running_requests")),
        prompt_tokens_total=_sum(s, "sglang:prompt_tokens_total"),
        generation_tokens_total=_sum(s, "sglang:generation_tokens_total"),
        preemptions_total=_sum(s, "sglang:num_retracted_requests_total"),
        decode_tokens_per_s=_positive(_sum(s, "sglang:gen_throughput")),
        engines=max(len(s.get("sglang:num_running_reqs", [])), 1),
    )
