"""The session table of the admin API: what the gateway tracks per session
(agent chain), read from the stages that own it.

- budgets (`gateway/policy/budgets.py`): the counters of sessions whose task
  policy sets a `session` budget, in the state store (in-process or Redis);
- affinity: the session → replica map, in the shared store with several
  instances (`gateway/scheduling/affinity.py`), else this instance's router.

Session keys are user data: never logged here.
"""

from __future__ import annotations

from typing import Any

from gateway.policy.budgets import Budgets
from gateway.scheduling.affinity import SessionAffinity
from gateway.scheduling.router import Router


class SessionTable:
    def __init__(self, budgets: Budgets, router: Router, affinity: SessionAffinity | None) -> None:
        self._budgets = budgets
        self._router = router
        self._affinity = affinity

    async def count(self) -> dict[str, Any]:
        affinity = self._affinity
        return {
            "budgets": await self._budgets.count_sessions(),
            "affinity": self._router.session_count()
            if affinity is None
            else await affinity.count(),
            "affinity_scope": "instance" if affinity is None else "shared",
        }

    async def lookup(self, key: str, tenant: str | None) -> dict[str, Any] | None:
        budget = await self._budgets.session_counters(tenant, key)
        replica = await self._affinity.replica_of(key) if self._affinity is not None else None
        replica = replica or self._router.session_replica(key)
        if budget is None and replica is None:
            return None
        return {"tenant": tenant, "replica": replica, "budget": budget}
