"""The estimate's error, learned online per replica and model (`PromptRatios`).

Every answered request whose prompt was estimated gives one sample: the
engine's `usage.prompt_tokens` / the estimate. A replica and model keep the
last `window` samples; their ratio is the `quantile` (p90) of that window,
clamped to `bounds`, so the corrected estimate (`ceil(estimate x ratio)`)
still covers nine requests in ten while reserving what the engine really
uses. No ratio applies before `min_samples` samples. A replica whose engine
kind or model list changes starts over (`identify`, also called on every
sample). A request without usage (a stream without the usage chunk, an
engine that reports none) teaches nothing.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

#: what a replica serves: its engine kind and the model ids it lists
Identity = tuple[str, ...]

QUANTILE = 0.9
MIN_SAMPLES = 20
WINDOW = 256
BOUNDS = (0.3, 1.0)
_MAX_KEYS = 4096


@dataclass(slots=True)
class _Window:
    samples: deque[float]
    ratio: float | None = None  # the window's clamped quantile, once computed


@dataclass(slots=True)
class _Replica:
    identity: Identity
    models: dict[str, _Window] = field(default_factory=dict)


class PromptRatios:
    def __init__(
        self,
        quantile: float = QUANTILE,
        min_samples: int = MIN_SAMPLES,
        window: int = WINDOW,
        bounds: tuple[float, float] = BOUNDS,
    ) -> None:
        self._q = quantile
        self._min = min_samples
        self._window = window
        self._low, self._high = bounds
        self._replicas: dict[str, _Replica] = {}

    def identify(self, replica: str, identity: Identity) -> None:
        """What `replica` serves now; a change forgets what was learned there."""
        known = self._replicas.get(replica)
        if known is None or known.identity != identity:
            self._replicas[replica] = _Replica(identity)

    def record(
        self, replica: str, identity: Identity, model: str, estimate: int, actual: int
    ) -> None:
        if estimate <= 0 or actual <= 0:
            return
        self.identify(replica, identity)
        models = self._replicas[replica].models
        win = models.get(model)
        if win is None:
            if len(models) >= _MAX_KEYS:
                del models[next(iter(models))]
            win = models[model] = _Window(deque(maxlen=self._window))
        win.samples.append(actual / estimate)
        win.ratio = None

    def ratio(self, replica: str, model: str) -> float | None:
        """The learned ratio for `model` on `replica`; None before enough samples."""
        known = self._replicas.get(replica)
        win = known.models.get(model) if known is not None else None
        if win is None or len(win.samples) < self._min:
            return None
        if win.ratio is None:
            ordered = sorted(win.samples)
            q = ordered[min(len(ordered) - 1, int(self._q * len(ordered)))]
            win.ratio = min(self._high, max(self._low, q))
        return win.ratio

    def corrected(self, replica: str, model: str, estimate: int) -> int:
        """The estimate scaled by the learned ratio (unchanged without one)."""
        ratio = self.ratio(replica, model)
        return estimate if ratio is None else max(1, math.ceil(estimate * ratio))

    def forget(self, replica: str) -> None:
        self._replicas.pop(replica, None)

    def describe(self) -> dict[str, Any]:
        """Per replica and model: samples, and the ratio applied (None: not yet)."""
        return {
            name: {
                model: {
                    "samples": len(win.samples),
                    "ratio": None if (r := self.ratio(name, model)) is None else round(r, 4),
                }
                for model, win in rep.models.items()
            }
            for name, rep in self._replicas.items()
        }

    def items(self) -> list[tuple[str, str, float]]:
        """(replica, model, ratio) for every ratio that applies (the metric)."""
        out = []
        for name, rep in self._replicas.items():
            for model in rep.models:
                ratio = self.ratio(name, model)
                if ratio is not None:
                    out.append((name, model, ratio))
        return out
