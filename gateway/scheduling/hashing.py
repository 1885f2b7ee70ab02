"""Rendezvous (highest-random-weight) hashing and bounded-load placement.

Both depend only on the key and the replica names, so several gateways
agree without talking.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    from gateway.replicas.registry import Replica


def rendezvous_weight(key: str, name: str) -> int:
    return xxhash.xxh3_64_intdigest(f"{key}\x00{name}".encode("utf-8", "surrogatepass"))


def rendezvous_order(key: str, replicas: Sequence[Replica]) -> list[Replica]:
    return sorted(replicas, key=lambda r: rendezvous_weight(key, r.name), reverse=True)


def bounded_load_choice(
    key: str, replicas: Sequence[Replica], loads: Sequence[float], factor: float
) -> Replica:
    """The first replica in rendezvous order whose load stays within
    `factor` × the mean load (counting this placement)."""
    by_name = {r.name: load for r, load in zip(replicas, loads, strict=True)}
    bound = math.ceil(factor * (sum(loads) + 1) / len(replicas))
    order = rendezvous_order(key, replicas)
    for replica in order:
        if by_name[replica.name] + 1 <= bound:
            return replica
    return order[0]
