"""The limits of a task policy, applied to one request's prompt count.

The input limit (`max_input_tokens`), `n` / `best_of`, the output limit
(default injected; clamp or reject), and the context window (the prompt
alone, and the prompt with the output). Every refusal says how its count
was made (`described`: counted by the engine, or estimated).
"""

from __future__ import annotations

import math

from gateway.errors import BadRequest, ContextLengthExceeded
from gateway.policy.estimate import MAX_OVERCOUNT
from gateway.policy.tokens import EstimateCounter, TokenCount, TokenCounter, described
from gateway.request.context import Contract
from gateway.request.parsed import ParsedRequest

FALLBACK_OUTPUT_TOKENS = 4096


def check_limits(
    contract: Contract, req: ParsedRequest, counted: TokenCount, max_model_len: int | None
) -> None:
    contract.prompt_tokens = counted.tokens
    contract.prompt_source = counted.source
    how = described(counted.source)
    _check_input(contract, req, how)
    contract.choices = choices(contract, req)
    contract.output_limit = output_limit(contract, req, max_model_len, how)


def fits(
    contract: Contract, req: ParsedRequest, counted: TokenCount, max_model_len: int | None
) -> bool:
    try:
        check_limits(contract, req, counted, max_model_len)
    except ContextLengthExceeded:
        return False
    return True


def true_floor(counter: TokenCounter, req: ParsedRequest) -> int:
    """A lower bound of the prompt's real count: an estimate's own floor is
    only a floor of the estimate, which over-counts by up to `MAX_OVERCOUNT`."""
    floor = counter.floor(req)
    return math.ceil(floor / MAX_OVERCOUNT) if isinstance(counter, EstimateCounter) else floor


def _input_param(req: ParsedRequest) -> str:
    return "messages" if req.endpoint == "chat" else "prompt"


def _check_input(contract: Contract, req: ParsedRequest, how: str) -> None:
    policy = contract.policy
    limit, tokens = policy.limits.max_input_tokens, contract.prompt_tokens or 0
    if limit is not None and tokens > limit:
        raise ContextLengthExceeded(
            f"The input of this request is {tokens} tokens ({how}), over the {limit}-token input "
            "limit of "
            f"task '{policy.name}'. Please reduce the length of the {_input_param(req)}.",
            param=_input_param(req),
        )


def check_floor(
    contract: Contract, req: ParsedRequest, floor: int, max_model_len: int | None
) -> None:
    """Refuse, before it is counted, a prompt that is over the input limit or
    the context even at its counter's lower bound (`TokenCounter.floor`): the
    answer the count would give, without the count (estimating a
    30 MB prompt held the event loop for seconds)."""
    policy, param = contract.policy, _input_param(req)
    limit = policy.limits.max_input_tokens
    if limit is not None and floor > limit:
        raise ContextLengthExceeded(
            f"The input of this request is at least {floor} tokens, over the {limit}-token input "
            f"limit of task '{policy.name}'. Please reduce the length of the {param}.",
            param=param,
        )
    if max_model_len is not None and floor >= max_model_len:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"{param} resulted in at least {floor} input tokens.",
            param=param,
        )


def choices(contract: Contract, req: ParsedRequest) -> int:
    """`n` (and vLLM's `best_of`, which generates that many): an integer from 1
    to the policy's `limits.max_n`. Every sequence holds KV and output tokens,
    so reservations and budgets count all of them."""
    most = 1
    for name in ("n", "best_of"):
        value = req.body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(
                f"'{name}' must be an integer, got {type(value).__name__}.",
                param=name,
                code="invalid_type",
            )
        limit = contract.policy.limits.max_n
        if not 1 <= value <= limit:
            raise BadRequest(
                f"'{name}' is {value}; task '{contract.policy.name}' allows 1 to {limit}.",
                param=name,
                code="invalid_value",
            )
        most = max(most, value)
    return most


def output_limit(
    contract: Contract, req: ParsedRequest, max_model_len: int | None, how: str
) -> int:
    policy = contract.policy
    lim, prompt = policy.limits, contract.prompt_tokens or 0
    requested, param = req.requested_output, req.output_field or "max_tokens"
    if requested == 0:  # both engines refuse it: say so before any engine work
        raise BadRequest(f"'{param}' must be >= 1, got 0.", param=param, code="invalid_value")
    injected = requested is None
    if requested is None:
        fits = max_model_len - prompt if max_model_len is not None else None
        output = (
            lim.default_output_tokens or lim.max_output_tokens or fits or FALLBACK_OUTPUT_TOKENS
        )
    elif lim.max_output_tokens is not None and requested > lim.max_output_tokens:
        if lim.on_excess == "reject":
            raise BadRequest(
                f"'{param}' is {requested}, over the {lim.max_output_tokens}-token output limit of "
                f"task '{policy.name}'.",
                param=param,
                code="output_limit_exceeded",
                reason="output_limit_exceeded",
            )
        output = lim.max_output_tokens
        contract.clamped_from = requested
    else:
        output = requested
    if max_model_len is None:
        return output
    if prompt >= max_model_len:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"{_input_param(req)} resulted in {prompt} input tokens ({how}).",
            param=_input_param(req),
        )
    if prompt + output > max_model_len:
        if injected:
            return max_model_len - prompt
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            "requested "
            f"{prompt + output} tokens ({prompt} in the {_input_param(req)}, {how}, {output} in "
            "the completion). "
            f"Please reduce the length of the {_input_param(req)} or the completion.",
            param=param,
        )
    return output
