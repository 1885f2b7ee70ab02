"""Admission: take a lease on a replica before forwarding.

This first version admits at once to the best-ranked replica and counts
in-flight requests; KV-headroom admission with its priority/deadline queue
replaces `PassThroughAdmission` behind the same interface.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from gateway.config import AdmissionConfig
from gateway.context import RequestContext
from gateway.errors import NoHealthyReplica
from gateway.replicas import Replica


@dataclass(slots=True, eq=False)
class Lease:
    replica: Replica


class PassThroughAdmission:
    def __init__(self, cfg: AdmissionConfig) -> None:
        self._cfg = cfg

    @asynccontextmanager
    async def acquire(self, ctx: RequestContext, ranked: list[Replica]) -> AsyncIterator[Lease]:
        if not ranked:
            raise NoHealthyReplica("No healthy replica is available.", retry_after=1.0)
        replica = ranked[0]
        ctx.queued_at = ctx.admitted_at = time.monotonic()
        replica.in_flight += 1
        try:
            yield Lease(replica)
        finally:
            replica.in_flight -= 1
