"""What a request will cost a replica, in tokens (`Demand`).

- prompt tokens: `ctx.contract.prompt_tokens` (set by the policy stage), else an
  estimate of UTF-8 bytes / `admission.chars_per_token`. An estimated prompt is
  corrected on each replica by the ratio learned there for the model
  (`gateway/policy/learned.py`: the p90 of engine count / estimate), once
  enough answered requests taught it.
- reserved output: the request's output limit (`ctx.contract.output_limit`, else the
  client's `max_tokens`, else `admission.default_output_tokens`), or in
  `learned` mode a high quantile of the task's recent actual outputs,
  capped by that limit, once enough samples exist. The mode is per policy
  (`ctx.contract.policy.output_reservation` when the policy sets it), else config.
- prefill tokens: prompt tokens minus those the router expects cached on
  the chosen replica (`ctx.routing.cached_tokens[replica]`).
"""

from __future__ import annotations

from collections import deque

from gateway.admission.ledger import Demand
from gateway.config.schema import AdmissionConfig
from gateway.ingress.protocol import prompt_parts
from gateway.policy.learned import Identity, PromptRatios
from gateway.replicas.registry import Replica
from gateway.request.context import RequestContext

_WINDOW = 512
_MAX_TASKS = 1024


class OutputLearner:
    """Per-task sliding window of actual output lengths (bounded in tasks and
    samples). The quantile is computed once per change of the window, not on
    every admission decision that asks for it."""

    def __init__(self, quantile: float, min_samples: int) -> None:
        self._q = quantile
        self._min = min_samples
        self._samples: dict[str, deque[int]] = {}
        self._quantiles: dict[str, int] = {}  # task → quantile of its current window

    def record(self, task: str, output_tokens: int) -> None:
        window = self._samples.get(task)
        if window is None:
            if len(self._samples) >= _MAX_TASKS:
                oldest = next(iter(self._samples))
                del self._samples[oldest]
                self._quantiles.pop(oldest, None)
            window = self._samples[task] = deque(maxlen=_WINDOW)
        window.append(output_tokens)
        self._quantiles.pop(task, None)

    def quantile(self, task: str) -> int | None:
        known = self._quantiles.get(task)
        if known is not None:
            return known
        window = self._samples.get(task)
        if window is None or len(window) < self._min:
            return None
        ordered = sorted(window)
        value = self._quantiles[task] = ordered[min(len(ordered) - 1, int(self._q * len(ordered)))]
        return value


class DemandEstimator:
    def __init__(self, cfg: AdmissionConfig) -> None:
        self._cfg = cfg
        self.learner = OutputLearner(cfg.learned_quantile, cfg.learned_min_samples)
        self.ratios = PromptRatios()

    def prompt_tokens(self, ctx: RequestContext) -> int:
        if ctx.prompt_tokens is not None:
            return ctx.prompt_tokens
        if ctx.request is None:
            return 1
        size = sum(len(p.encode()) for p in prompt_parts(ctx.request))
        return max(1, int(size / self._cfg.chars_per_token))

    def output_limit(self, ctx: RequestContext) -> int:
        if ctx.output_limit is not None:
            return ctx.output_limit
        if ctx.request is not None and ctx.request.requested_output is not None:
            return ctx.request.requested_output
        return self._cfg.default_output_tokens

    def reserved_output(self, ctx: RequestContext) -> int:
        limit = self.output_limit(ctx)
        policy_mode = ctx.contract.policy.output_reservation if ctx.contract is not None else None
        mode = policy_mode or self._cfg.output_reservation
        if mode == "learned":
            learned = self.learner.quantile(ctx.task)
            if learned is not None:
                return min(limit, max(1, learned))
        return limit

    def demand(self, ctx: RequestContext, replica: str | None = None) -> Demand:
        prompt = self.prompt_tokens(ctx)
        contract = ctx.contract
        if replica is not None and contract is not None and contract.prompt_source == "estimate":
            prompt = self.ratios.corrected(replica, ctx.model or "", prompt)
        cached = ctx.routing.cached_tokens.get(replica, 0) if replica is not None else 0
        output = self.reserved_output(ctx) * ctx.choices  # every sequence holds its own output
        return Demand(prompt, output, max(0, prompt - min(cached, prompt)))

    def learn(self, ctx: RequestContext) -> None:
        usage = ctx.usage
        out = usage.completion_tokens if usage is not None else None
        if out is not None:
            # usage counts every sequence; the quantile is per sequence
            self.learner.record(ctx.task, -(-out // ctx.choices))
        contract, replica = ctx.contract, ctx.replica
        actual = usage.prompt_tokens if usage is not None else None
        if actual is None or contract is None or replica is None:
            return
        if contract.prompt_source == "estimate" and contract.prompt_tokens:
            model = ctx.model or ""
            self.ratios.record(
                replica.name, identity(replica), model, contract.prompt_tokens, actual
            )


def identity(replica: Replica) -> Identity:
    """What a learned ratio depends on: the engine kind and the models listed."""
    return (replica.kind, *sorted(str(m.get("id")) for m in replica.models))
