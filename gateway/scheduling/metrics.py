"""Routing metrics: one histogram times every plugin call; the prefix
index's prediction error and corrections from the engines' answers."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Histogram

from gateway.observability.cells import Cell, LockFreeCounter
from gateway.observability.metrics import Children

#: predicted - reported cached tokens (negative: the engine held more)
_ERROR_BUCKETS = (
    *(-float(4**k) for k in range(9, 1, -1)),
    -0.5,
    0.5,
    *(float(4**k) for k in range(2, 10)),
)
_BUCKETS = (1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1)


class SchedulingMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        r = registry or CollectorRegistry(auto_describe=True)
        self.plugin_seconds = Histogram(
            "gateway_scheduling_plugin_duration_seconds",
            "Time spent in one call of a scheduling plugin.",
            ["plugin", "extension"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.decisions = LockFreeCounter(
            "gateway_routing_decisions",
            "Routing decisions by policy and replica.",
            ["policy", "replica"],
            registry=r,
        )
        self.prompt_tokens = LockFreeCounter(
            "gateway_routing_prompt_tokens",
            "Prompt tokens routed (estimated).",
            ["replica"],
            registry=r,
        )
        self.matched_tokens = LockFreeCounter(
            "gateway_routing_matched_prefix_tokens",
            "Prompt tokens the prefix index expected to be cached on the chosen replica.",
            ["replica"],
            registry=r,
        )
        self.prediction_error = Histogram(
            "gateway_routing_prefix_prediction_error_tokens",
            "Prompt tokens the prefix index predicted cached on the chosen replica "
            "minus the tokens the engine reported cached.",
            ["replica"],
            buckets=_ERROR_BUCKETS,
            registry=r,
        )
        self.dropped_blocks = LockFreeCounter(
            "gateway_routing_prefix_index_dropped_blocks",
            "Prefix-index blocks dropped because an engine reported it no longer held them.",
            ["replica"],
            registry=r,
        )
        self.learned_blocks = LockFreeCounter(
            "gateway_routing_prefix_index_learned_blocks",
            "Prefix-index blocks learned because an engine reported more cached than predicted.",
            ["replica"],
            registry=r,
        )
        self.dropped_blocks_by = Children(self.dropped_blocks)
        self.learned_blocks_by = Children(self.learned_blocks)
        self.decisions_by = Children(self.decisions)
        self.prompt_tokens_by = Children(self.prompt_tokens)
        self.matched_tokens_by = Children(self.matched_tokens)
        self._routed: dict[tuple[str, str], tuple[Cell, Cell, Cell]] = {}

    def forget_replica(self, replica: str) -> None:
        """Drop the series of a replica that left the set."""
        for counter, children, index in (
            (self.decisions, self.decisions_by, 1),
            (self.prompt_tokens, self.prompt_tokens_by, 0),
            (self.matched_tokens, self.matched_tokens_by, 0),
            (self.dropped_blocks, self.dropped_blocks_by, 0),
            (self.learned_blocks, self.learned_blocks_by, 0),
        ):
            counter.remove_where("replica", replica)
            children.forget_where(index, replica)
        with contextlib.suppress(KeyError):
            self.prediction_error.remove(replica)
        for key in [k for k in self._routed if k[1] == replica]:
            del self._routed[key]

    def routed_to(self, policy: str, replica: str) -> tuple[Cell, Cell, Cell]:
        """The decision, prompt-token and matched-token counters of one route
        (one lookup per request instead of three)."""
        cells = self._routed.get((policy, replica))
        if cells is None:
            cells = self._routed[(policy, replica)] = (
                self.decisions_by(policy, replica),
                self.prompt_tokens_by(replica),
                self.matched_tokens_by(replica),
            )
        return cells
