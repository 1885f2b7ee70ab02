"""Plugin type name → (extension point, parameter class, factory).

Adding a plugin: write its module (type constant, `Params`, `factory`, class)
and add one line to `REGISTRY`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gateway.scheduling import filters, pickers
from gateway.scheduling.scorers import (
    estimated_ttft,
    kv_headroom,
    least_load,
    prefix_affinity,
    queue_depth,
    session_affinity,
)

Kind = Literal["filter", "scorer", "picker"]


@dataclass(frozen=True, slots=True)
class PluginType:
    kind: Kind
    params: type
    factory: Callable[[Any, Any], Any]


REGISTRY: dict[str, PluginType] = {
    filters.HEALTHY: PluginType("filter", filters.NoParams, filters.healthy_factory),
    filters.ADMISSIBLE: PluginType("filter", filters.NoParams, filters.admissible_factory),
    prefix_affinity.TYPE: PluginType("scorer", prefix_affinity.Params, prefix_affinity.factory),
    session_affinity.TYPE: PluginType("scorer", session_affinity.Params, session_affinity.factory),
    kv_headroom.TYPE: PluginType("scorer", kv_headroom.Params, kv_headroom.factory),
    queue_depth.TYPE: PluginType("scorer", queue_depth.Params, queue_depth.factory),
    least_load.TYPE: PluginType("scorer", least_load.Params, least_load.factory),
    estimated_ttft.TYPE: PluginType("scorer", estimated_ttft.Params, estimated_ttft.factory),
    pickers.MAX_SCORE: PluginType("picker", pickers.MaxScoreParams, pickers.max_score_factory),
    pickers.RANDOM_WEIGHTED: PluginType(
        "picker", pickers.RandomWeightedParams, pickers.random_weighted_factory
    ),
}
