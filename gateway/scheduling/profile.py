"""A profile runs the fixed pipeline: filters → weighted scorers → picker,
clamping every score to [0, 1] and timing one cycle in `TIMING_SAMPLE`
(the histogram's shape is the same; observing every call cost more than
most plugins themselves)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from gateway.scheduling.interfaces import Filter, Picker, Scorer, clamp01
from gateway.scheduling.metrics import SchedulingMetrics

if TYPE_CHECKING:
    from prometheus_client import Histogram

    from gateway.replicas.registry import Replica
    from gateway.scheduling.cycle import Cycle


T = TypeVar("T")
TIMING_SAMPLE = 16


@dataclass(frozen=True, slots=True)
class Named(Generic[T]):
    name: str
    plugin: T
    timer: Histogram


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    named: Named[Scorer]
    weight: float


class Profile:
    def __init__(
        self,
        name: str,
        filters: Sequence[Named[Filter]],
        scorers: Sequence[WeightedScorer],
        picker: Named[Picker],
    ) -> None:
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.picker = picker
        self.weight_total = sum(s.weight for s in self.scorers) or 1.0
        self._runs = 0

    def run(self, cycle: Cycle, candidates: list[Replica]) -> list[Replica]:
        self._runs += 1
        if self._runs % TIMING_SAMPLE:
            return self._run_untimed(cycle, candidates)
        for f in self.filters:
            started = time.perf_counter()
            candidates = f.plugin.filter(cycle, candidates)
            f.timer.observe(time.perf_counter() - started)
        if not candidates:
            return []
        totals = self.total_scores(cycle, candidates)
        cycle.weight_total = self.weight_total
        started = time.perf_counter()
        ordered = self.picker.plugin.order(cycle, candidates, totals)
        self.picker.timer.observe(time.perf_counter() - started)
        return ordered

    def _run_untimed(self, cycle: Cycle, candidates: list[Replica]) -> list[Replica]:
        for f in self.filters:
            candidates = f.plugin.filter(cycle, candidates)
        if not candidates:
            return []
        totals = [0.0] * len(candidates)
        for s in self.scorers:
            for i, value in enumerate(s.named.plugin.score(cycle, candidates)):
                totals[i] += s.weight * clamp01(value)
        cycle.weight_total = self.weight_total
        return self.picker.plugin.order(cycle, candidates, totals)

    def total_scores(self, cycle: Cycle, candidates: Sequence[Replica]) -> list[float]:
        totals = [0.0] * len(candidates)
        for s in self.scorers:
            started = time.perf_counter()
            scores = s.named.plugin.score(cycle, candidates)
            s.named.timer.observe(time.perf_counter() - started)
            for i, value in enumerate(scores):
                totals[i] += s.weight * clamp01(value)
        return totals


def named(metrics: SchedulingMetrics, name: str, kind: str, plugin: T) -> Named[T]:
    return Named(name, plugin, metrics.plugin_seconds.labels(name, kind))
