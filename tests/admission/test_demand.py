"""Output reservation: the learned quantile per task, and who chooses the mode
(the policy's `output_reservation`, else the admission config)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission.demand import _WINDOW, DemandEstimator, OutputLearner
from gateway.config.decode import ConfigError
from gateway.config.schema import AdmissionConfig
from gateway.policies.policyset import Policy, load_policy_set
from gateway.request.context import RequestContext
from tests.ctxkit import make_ctx


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 10_000) | st.none()), max_size=700
    ),
    q=st.sampled_from([0.5, 0.9, 0.95, 0.99]),
    min_samples=st.integers(1, 60),
)
def test_learned_quantile_is_the_windowed_quantile(
    events: list[tuple[str, int | None]], q: float, min_samples: int
) -> None:
    """Records interleaved with reads (None): every read equals the quantile of
    the task's last `_WINDOW` outputs, computed from scratch."""
    learner = OutputLearner(q, min_samples)
    seen: dict[str, list[int]] = {"a": [], "b": []}
    for task, value in events:
        if value is not None:
            learner.record(task, value)
            seen[task].append(value)
            continue
        window = sorted(seen[task][-_WINDOW:])
        expected = (
            window[min(len(window) - 1, int(q * len(window)))]
            if len(window) >= min_samples
            else None
        )
        assert learner.quantile(task) == expected
        assert learner.quantile(task) == expected  # the cached answer is the same


def _ctx(policy: Policy | None, output_limit: int) -> RequestContext:
    return make_ctx(policy=policy or Policy(name="agent"), prompt=100, output=output_limit)


def _policies(tmp_path: Path, mode: str) -> Policy | None:
    (tmp_path / "agent.yaml").write_text(f"name: agent\noutput_reservation: {mode}\n")
    return load_policy_set(str(tmp_path)).get("agent")


@pytest.mark.parametrize(
    ("config_mode", "policy_mode", "learned"),
    [
        ("limit", "learned", True),
        ("learned", "limit", False),
        ("learned", None, True),
        ("limit", None, False),
    ],
)
def test_the_policy_chooses_the_reservation_mode_else_the_config(
    tmp_path: Path, config_mode: str, policy_mode: str | None, learned: bool
) -> None:
    cfg = AdmissionConfig(output_reservation=config_mode, learned_min_samples=10)  # type: ignore[arg-type]
    est = DemandEstimator(cfg)
    policy = _policies(tmp_path, policy_mode) if policy_mode else None
    for _ in range(10):
        est.learner.record("agent", 300)
    assert est.reserved_output(_ctx(policy, 4000)) == (300 if learned else 4000)
    assert est.reserved_output(_ctx(policy, 200)) == 200  # never above the request's own limit
    assert est.demand(_ctx(policy, 4000)).kv_tokens == 100 + (300 if learned else 4000)


def test_an_unknown_reservation_mode_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "agent.yaml").write_text("name: agent\noutput_reservation: sometimes\n")
    with pytest.raises(ConfigError) as exc:
        load_policy_set(str(tmp_path))
    assert any("agent.yaml.output_reservation" in p for p in exc.value.problems)


def test_an_estimated_prompt_is_leased_at_the_ratio_learned_on_the_replica() -> None:
    from gateway.policy.learned import MIN_SAMPLES

    est = DemandEstimator(AdmissionConfig())
    ctx = make_ctx(prompt=1000, output=10)
    assert ctx.contract is not None and ctx.contract.prompt_source == "estimate"
    for _ in range(MIN_SAMPLES):
        est.ratios.record("a", ("vllm", "m"), "m", 1000, 550)
    assert est.demand(ctx, "a").prompt_tokens == 550
    assert est.demand(ctx, "b").prompt_tokens == 1000  # nothing learned there
    assert est.demand(ctx).prompt_tokens == 1000
    ctx.contract.prompt_source = "engine"  # an exact count is leased as it is
    assert est.demand(ctx, "a").prompt_tokens == 1000
