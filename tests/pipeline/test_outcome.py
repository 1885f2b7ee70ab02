"""How a request ended: one typed outcome, set once by the pipeline, with the
error's reason beside it (the metrics label and the access line read both)."""

from __future__ import annotations

import pytest

from gateway.pipeline.record import access_fields
from tests.ctxkit import make_ctx


def test_an_error_carries_its_reason_into_the_label_and_the_access_line() -> None:
    ctx = make_ctx()
    ctx.finish("error", "queue_full")
    assert (ctx.outcome, ctx.reason, ctx.outcome_label) == ("error", "queue_full", "queue_full")
    fields = access_fields(ctx, 0.01)
    assert (fields["outcome"], fields["reason"]) == ("error", "queue_full")


@pytest.mark.parametrize("outcome", ["ok", "cancelled"])
def test_a_success_or_a_cancel_has_no_reason(outcome: str) -> None:
    ctx = make_ctx()
    ctx.finish(outcome)  # type: ignore[arg-type]
    assert (ctx.outcome_label, ctx.reason) == (outcome, None)
    fields = access_fields(ctx, 0.01)
    assert (fields["outcome"], fields["reason"]) == (outcome, None)


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [("error", None), ("ok", "queue_full"), ("cancelled", "x"), ("pending", None)],
)
def test_a_contradicting_reason_is_refused(outcome: str, reason: str | None) -> None:
    ctx = make_ctx()
    with pytest.raises(ValueError, match="outcome"):
        ctx.finish(outcome, reason)  # type: ignore[arg-type]
    assert ctx.outcome == "pending" and ctx.reason is None
