"""Request parsing and engine-shaped errors for both flavours.

vLLM checks everything before the engine sees a request: model name, output
limits, the prompt against `max_model_len` (400), `priority` without the
priority policy (400), the queue bound (503, in `app.py`). llama.cpp checks
almost nothing up front: the context overflow surfaces only when a slot
picks the task up (`slots.py`).

Output caps: vLLM reads `max_completion_tokens`, else `max_tokens`; without
either, generation may run to `max_model_len`. llama.cpp reads `n_predict`,
else `max_completion_tokens`, else `max_tokens` (-1 = unlimited). A cap over
the remaining context is clamped (vLLM >= 0.32) or refused with
`reject_overlong_output` (older vLLM); a cap over `max_model_len` itself is a
400 naming `max_tokens`, and a negative `temperature` a 400 naming it (vLLM
0.32's `(parameter=..., value=...)` messages).

An `id_slot` outside the slot range runs on any slot, as in llama.cpp b11434.

Approximations: `n` > 1 is refused with a 400 (both engines support it);
stop strings, tools and sampling fields are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from gateway.sim.config import SimConfig
from gateway.sim.tokens import render_chat, tokenize

Endpoint = Literal["chat", "completion", "native"]

_VLLM_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    429: "TooManyRequestsError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}
_LLAMA_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
RECORDED_FIELDS = (
    "model",
    "max_tokens",
    "max_completion_tokens",
    "n_predict",
    "cache_salt",
    "id_slot",
    "priority",
)


class SimHTTPError(Exception):
    """An engine-shaped error response."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


def error_body(
    flavor: str, status: int, message: str, type_: str | None = None, param: str | None = None
) -> dict[str, Any]:
    if flavor == "vllm":
        kind = type_ or _VLLM_TYPES.get(status, "InternalServerError")
        return {"error": {"message": message, "type": kind, "param": param, "code": status}}
    kind = type_ or _LLAMA_TYPES.get(status, "server_error")
    return {"error": {"code": status, "message": message, "type": kind}}


def error(
    config: SimConfig, status: int, message: str, type_: str | None = None, param: str | None = None
) -> SimHTTPError:
    return SimHTTPError(status, error_body(config.flavor, status, message, type_, param))


@dataclass(frozen=True, slots=True)
class Job:
    """A parsed generation request."""

    endpoint: Endpoint
    prompt: list[int]
    model: str
    stream: bool
    include_usage: bool
    cap: int | None
    min_tokens: int
    ignore_eos: bool
    priority: int
    cache_salt: str | None
    id_slot: int | None
    cache_prompt: bool
    recorded: dict[str, Any]


def decode_body(config: SimConfig, raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        # vLLM's (FastAPI's) request validation error keeps the HTTP reason as its type
        kind = "Bad Request" if config.flavor == "vllm" else None
        raise error(config, 400, f"JSON decode error: {exc}", type_=kind) from exc
    if not isinstance(body, dict):
        raise error(config, 400, "request body must be a JSON object")
    return body


def parse_job(config: SimConfig, endpoint: Endpoint, body: dict[str, Any]) -> Job:
    model = _model(config, body)
    if _typed(config, body, "n", int, 1) != 1:
        raise error(config, 400, "the simulator supports only n = 1", param="n")
    prompt = _prompt(config, endpoint, body)
    stream = _typed(config, body, "stream", bool, False)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    job = Job(
        endpoint=endpoint,
        prompt=prompt,
        model=model,
        stream=stream,
        include_usage=include_usage,
        cap=_cap(config, body),
        min_tokens=_typed(config, body, "min_tokens", int, 0),
        ignore_eos=_typed(config, body, "ignore_eos", bool, False),
        priority=_priority(config, body),
        cache_salt=_cache_salt(config, body),
        id_slot=_id_slot(config, body),
        cache_prompt=_typed(config, body, "cache_prompt", bool, True),
        recorded={k: body.get(k) for k in RECORDED_FIELDS},
    )
    _check_context(config, job)
    _check_sampling(config, body)
    return job


def _typed(config: SimConfig, body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise error(config, 400, f"'{key}' must be of type {kind.__name__}", param=key)
    return value


def _model(config: SimConfig, body: dict[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        return config.model
    if not isinstance(model, str):
        raise error(config, 400, "'model' must be a string", param="model")
    if config.flavor == "vllm" and model != config.model:
        raise error(config, 404, f"The model `{model}` does not exist.", param="model")
    return model


def _prompt(config: SimConfig, endpoint: Endpoint, body: dict[str, Any]) -> list[int]:
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise error(config, 400, "'messages' must be a non-empty list", param="messages")
        try:
            return tokenize(render_chat(messages, body.get("tools")))
        except (TypeError, ValueError) as exc:
            raise error(config, 400, str(exc), param="messages") from exc
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list) and prompt and all(_is_token(t) for t in prompt):
        return list(prompt)
    raise error(config, 400, "'prompt' must be a string or a list of token ids", param="prompt")


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _cap(config: SimConfig, body: dict[str, Any]) -> int | None:
    keys: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
    if config.flavor == "llamacpp":
        keys = ("n_predict", "max_completion_tokens", "max_tokens")
    for key in keys:
        value = _typed(config, body, key, int, None)
        if value is None:
            continue
        if config.flavor == "llamacpp" and value < 0:
            return None
        if value < 1:
            raise error(config, 400, f"{key} must be at least 1, got {value}.", param=key)
        return int(value)
    return None


def _priority(config: SimConfig, body: dict[str, Any]) -> int:
    priority = int(_typed(config, body, "priority", int, 0))
    if config.flavor == "vllm" and priority != 0 and config.scheduling_policy != "priority":
        raise error(
            config,
            400,
            "Got priority != 0 but priority scheduling is not enabled.",
            param="priority",
        )
    return priority


def _cache_salt(config: SimConfig, body: dict[str, Any]) -> str | None:
    salt = _typed(config, body, "cache_salt", str, None)
    if salt is not None and not salt:
        raise error(
            config, 400, "Parameter 'cache_salt' must be a non-empty string.", param="cache_salt"
        )
    return None if salt is None else str(salt)


def _id_slot(config: SimConfig, body: dict[str, Any]) -> int | None:
    if config.flavor != "llamacpp":
        return None
    slot = _typed(config, body, "id_slot", int, None)
    if slot is None or not 0 <= slot < config.parallel:
        return None  # b11434: -1 or out of range means any slot (200, never an error)
    return int(slot)


def _vllm_param_error(config: SimConfig, message: str, param: str, value: Any) -> SimHTTPError:
    """vLLM 0.32's parameter errors: the message ends with the parameter and its value."""
    return error(config, 400, f"{message} (parameter={param}, value={value})", param=param)


def _check_sampling(config: SimConfig, body: dict[str, Any]) -> None:
    if config.flavor != "vllm":
        return
    t = body.get("temperature")
    if isinstance(t, int | float) and not isinstance(t, bool) and t < 0:
        t = float(t)
        raise _vllm_param_error(
            config, f"temperature must be non-negative, got {t}.", "temperature", t
        )


def _check_context(config: SimConfig, job: Job) -> None:
    if config.flavor != "vllm":
        return
    n, limit = len(job.prompt), config.max_model_len
    if n >= limit:
        raise _vllm_param_error(
            config,
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains at least {n} input tokens, which exceeds this limit even without any "
            "output tokens. Please reduce the length of the input prompt.",
            "input_tokens",
            n,
        )
    if config.reject_overlong_output and job.cap is not None and n + job.cap > limit:
        raise error(
            config,
            400,
            (
                f"'max_tokens' or 'max_completion_tokens' is too large: {job.cap}. This model's "
                f"maximum context length is {limit} tokens and your request has {n} input tokens "
                f"({job.cap} > {limit} - {n})."
            ),
        )
    if job.cap is not None and job.cap > limit:
        raise _vllm_param_error(
            config,
            f"max_tokens={job.cap} cannot be greater than max_model_len={limit}. "
            "Please request fewer output tokens.",
            "max_tokens",
            job.cap,
        )


def context_room(config: SimConfig, prompt_len: int) -> int:
    """Tokens a request may generate before the context ends."""
    limit = config.max_model_len if config.flavor == "vllm" else config.slot_ctx
    return max(limit - prompt_len, 1)
