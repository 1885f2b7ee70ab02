"""Lock-free counters, gauges and histograms for the per-request hot path.

prometheus_client guards every sample with a `threading.Lock` (~1 µs per
increment, and a request touches a dozen samples). The gateway updates its
hot metrics only from its event-loop thread, so a plain float per labelled
child is enough; a scrape (same thread, or another thread under the GIL)
reads whole floats. Each metric is a `Collector` on the app's own registry
and exposes the same names, HELP, TYPE and labels as the prometheus_client
metric it replaces (without the `_created` samples).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector


class Cell:
    """One labelled child of a counter or gauge."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount


class Buckets:
    """One labelled child of a histogram."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1  # le: value <= bound
        self.sum += value


class _Labelled(Collector):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry | None,
    ) -> None:
        self._name = name
        self._doc = documentation
        self._labelnames = tuple(labelnames)
        if registry is not None:
            registry.register(self)

    def _key(self, values: tuple[object, ...]) -> tuple[str, ...]:
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name}: expected labels {self._labelnames}, got {values}")
        return tuple(str(v) for v in values)

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def _family(self) -> Metric:
        raise NotImplementedError


class LockFreeCounter(_Labelled):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._cells: dict[tuple[str, ...], Cell] = {}
        super().__init__(name, documentation, labelnames, registry)
        # An unlabelled metric is exposed (as 0) from the start, and its one
        # cell is kept at hand: `inc` / `dec` then skip the label lookup.
        self._only: Cell | None = None if self._labelnames else self.labels()

    def labels(self, *values: object) -> Cell:
        key = self._key(values)
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = Cell()
        return cell

    def inc(self, amount: float = 1.0) -> None:
        (self._only or self.labels()).inc(amount)

    def remove_where(self, label: str, value: str) -> None:
        """Drop every series whose `label` is `value` (e.g. a replica that left)."""
        i = self._labelnames.index(label)
        for key in [k for k in self._cells if k[i] == value]:
            del self._cells[key]

    def _family(self) -> Metric:
        return CounterMetricFamily(self._name, self._doc, labels=self._labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        assert isinstance(family, CounterMetricFamily | GaugeMetricFamily)
        for key, cell in list(self._cells.items()):
            family.add_metric(key, cell.value)
        yield family


class LockFreeGauge(LockFreeCounter):
    def dec(self, amount: float = 1.0) -> None:
        (self._only or self.labels()).dec(amount)

    def _family(self) -> Metric:
        return GaugeMetricFamily(self._name, self._doc, labels=self._labelnames)


class LockFreeHistogram(_Labelled):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._bounds = tuple(sorted(float(b) for b in buckets if b != float("inf")))
        self._children: dict[tuple[str, ...], Buckets] = {}
        super().__init__(name, documentation, labelnames, registry)

    def labels(self, *values: object) -> Buckets:
        key = self._key(values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = Buckets(self._bounds)
        return child

    def observe(self, value: float) -> None:
        self.labels().observe(value)

    def _family(self) -> Metric:
        return HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        assert isinstance(family, HistogramMetricFamily)
        for key, child in list(self._children.items()):
            counts, total = list(child.counts), child.sum
            cumulative, buckets = 0, []
            for bound, count in zip([*self._bounds, float("inf")], counts, strict=True):
                cumulative += count
                buckets.append((_le(bound), float(cumulative)))
            family.add_metric(list(key), buckets, total)
        yield family


def _le(bound: float) -> str:
    """The `le` label as prometheus_client writes it (floatToGoString)."""
    if bound == float("inf"):
        return "+Inf"
    return repr(float(bound))
