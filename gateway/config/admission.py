"""The `admission` section: KV-headroom admission and the gateway queue
(docs/admission.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.config.ranges import check_ranges, ranged

PRIORITY_CLASSES = ("interactive", "standard", "batch")

_DEFAULTS: dict[str, dict[str, Any]] = {
    "watermarks": {"interactive": 0.92, "standard": 0.85, "batch": 0.70},
    "ttft_targets_s": {"interactive": 2.0, "standard": 10.0, "batch": 60.0},
    "queue_max_requests": {"interactive": 256, "standard": 512, "batch": 4096},
    "queue_max_tokens": {"interactive": 4_000_000, "standard": 8_000_000, "batch": 64_000_000},
}


def _per_class(name: str, given: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(given) - set(PRIORITY_CLASSES))
    if unknown:
        raise ValueError(
            f"{name}: unknown priority classes {unknown} (known: {list(PRIORITY_CLASSES)})"
        )
    return {**_DEFAULTS[name], **given}


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """KV-headroom admission and the gateway queue (see docs/admission.md).

    Per-class maps may name only some classes; the others keep their defaults.
    """

    enabled: bool = True
    watermarks: dict[str, float] = ranged(factory=dict, ge=0.01, le=1.0)
    ttft_targets_s: dict[str, float] = ranged(factory=dict, ge=0.001, le=86400)
    queue_max_requests: dict[str, int] = ranged(factory=dict, ge=0, le=10**7)
    queue_max_tokens: dict[str, int] = ranged(factory=dict, ge=0, le=10**12)
    poll_interval_s: float = ranged(0.25, gt=0)
    poll_timeout_s: float = ranged(1.0, gt=0)
    stale_after_s: float = ranged(2.0, gt=0)
    unhealthy_after_failures: int = ranged(3, gt=0)
    max_engine_waiting: int | None = ranged(4, ge=0)
    max_in_flight: int | None = ranged(None, ge=1)
    unknown_capacity_max_in_flight: int | None = ranged(None, ge=1)
    output_reservation: Literal["limit", "learned"] = "limit"
    learned_quantile: float = ranged(0.95, ge=0.5, lt=1.0)
    learned_min_samples: int = ranged(50, gt=0)
    default_output_tokens: int = ranged(1024, gt=0)
    default_prefill_tokens_per_s: float = ranged(8000.0, gt=0)
    chars_per_token: float = ranged(3.0, gt=0)
    lease_grace_s: float = ranged(30.0, gt=0)

    def __post_init__(self) -> None:
        for name in _DEFAULTS:
            object.__setattr__(self, name, _per_class(name, getattr(self, name)))
        check_ranges(self)
        if self.stale_after_s < self.poll_interval_s:
            raise ValueError(
                f"stale_after_s must be >= poll_interval_s ({self.poll_interval_s}), "
                f"got {self.stale_after_s}"
            )

    def watermark(self, cls: str) -> float:
        return self.watermarks.get(cls, self.watermarks["standard"])

    def ttft_target(self, cls: str) -> float:
        return self.ttft_targets_s.get(cls, self.ttft_targets_s["standard"])
