"""Task policies: resolve the task of a request and apply its limits.

Seam only for now: the policies/budgets work fills it in.
"""

from __future__ import annotations

from gateway.context import RequestContext


class PolicyStage:
    async def apply(self, ctx: RequestContext) -> None:
        ctx.task = "default"


def check_policies(cfg: object) -> None:
    """Validate the policies a config refers to (raises ConfigError)."""
    return None
