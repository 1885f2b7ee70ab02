"""Tenant and session budgets: reserve the worst case before dispatch, settle after.

Seam only for now: the policies/budgets work fills it in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.context import RequestContext


class Budgets:
    @asynccontextmanager
    async def reserve(self, ctx: RequestContext) -> AsyncIterator[None]:
        yield
