"""Parse OpenAI request bodies into a normalised request.

The JSON itself is checked by `gateway.ingress.jsonbody`; the types the
OpenAI API gives its fields by `gateway.ingress.fields` (a wrong type is a
400 naming the field's path); what the gateway relies on besides (the shape
of `messages` and `prompt`, output limits, session hints) here. Values are
forwarded untouched for the engine to judge.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gateway.config.schema import LimitsConfig
from gateway.errors import BadRequest
from gateway.ingress.fields import check_message, check_parts, check_top_level, type_error
from gateway.ingress.jsonbody import (
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    canonical_json,
    parse_json_document,
    parse_json_object,
)
from gateway.request.parsed import Endpoint, ParsedRequest

__all__ = [
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "OUTPUT_FIELDS",
    "Endpoint",
    "ParsedRequest",
    "canonical_json",
    "parse_json_document",
    "parse_json_object",
    "parse_request",
    "prompt_parts",
]

OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "n_predict")
_DEFAULT_LIMITS = LimitsConfig()


def _check_messages(messages: Any, limits: LimitsConfig) -> None:
    if not isinstance(messages, list) or not messages:
        raise type_error("messages", "a non-empty array", messages)
    if len(messages) > limits.max_messages:
        raise _too_many("messages", len(messages), limits.max_messages, "messages")
    parts = 0
    for i, msg in enumerate(messages):  # the param names are built only for an error
        if not isinstance(msg, dict):
            raise type_error(f"messages[{i}]", "an object", msg)
        check_message(i, msg)
        content = msg.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise type_error(f"messages[{i}].content", "a string or an array of parts", content)
        parts += len(content)
        if parts > limits.max_content_parts:
            raise _too_many(f"messages[{i}].content", parts, limits.max_content_parts, "parts")
        check_parts(i, content)


def _too_many(param: str, count: int, limit: int, what: str) -> BadRequest:
    """OpenAI's answer to an over-long array: `array_above_max_length` naming it."""
    return BadRequest(
        f"'{param}' brings the request to {count} {what}, over the limit of {limit} {what} per "
        "request.",
        param=param,
        code="array_above_max_length",
    )


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return
    raise type_error("prompt", "a string, an array of strings or an array of token ids", prompt)


def _output_limit(body: dict[str, Any]) -> tuple[int | None, str | None]:
    for name in OUTPUT_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise type_error(name, "an integer", value)
        if value < 0 and not (name == "n_predict" and value == -1):
            raise BadRequest(
                f"'{name}' must be >= 0, got {value}.", param=name, code="invalid_value"
            )
        if value >= 0:
            return value, name
    return None, None


def max_objects(limits: LimitsConfig) -> int:
    """The most JSON objects a body may hold: twice what its messages and content
    parts may be (tool schemas, tool calls and the like are objects too)."""
    return 2 * (limits.max_messages + limits.max_content_parts) + 1024


def parse_request(
    endpoint: Endpoint, raw: bytes, limits: LimitsConfig = _DEFAULT_LIMITS
) -> ParsedRequest:
    body, forwardable = parse_json_document(raw, max_objects(limits))
    check_top_level(endpoint, body)  # the types the OpenAI API gives its fields
    model = body.get("model")
    if endpoint == "chat":
        _check_messages(body.get("messages"), limits)
    else:
        _check_prompt(body.get("prompt"))
    stream = body.get("stream") or False
    opts = body.get("stream_options")
    wants_usage = bool(stream and opts and opts.get("include_usage") is True)
    for name in ("prompt_cache_key", "cache_salt"):  # session hints (also on completions)
        if body.get(name) is not None and not isinstance(body[name], str):
            raise type_error(name, "a string", body[name])
    requested, field_name = _output_limit(body)
    return ParsedRequest(
        endpoint,
        body,
        model,
        stream,
        wants_usage,
        requested,
        field_name,
        raw if forwardable else None,
        dict(body),
        size=len(raw),
    )


def prompt_parts(req: ParsedRequest) -> list[str]:
    """The prompt as text parts, in canonical order: tools, then each message
    (role, then content parts in order); for completions, the prompt as is.
    Rendered once per request: stages edit only top-level keys other than the
    prompt (see `ParsedRequest`)."""
    if req.parts is None:
        req.parts = _render_parts(req)
    return req.parts


def _render_parts(req: ParsedRequest) -> list[str]:
    """The parts as one list (no generators: an agent request has ~750 parts,
    and this runs on every request)."""
    body = req.body
    out: list[str] = []
    if req.endpoint == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            out.append(prompt)
        elif isinstance(prompt, list):
            out.extend(p if isinstance(p, str) else f"<{p}>" for p in prompt)
        return out
    append = out.append
    tools = body.get("tools")
    if tools:
        append(canonical_json(tools))
    marks = _ROLE_MARKS
    for msg in body.get("messages") or ():
        role = msg.get("role")
        mark = marks.get(role) if isinstance(role, str) else None
        append(mark if mark is not None else f"<|{role}|>")
        content = msg.get("content")
        if isinstance(content, str):
            append(content)
        elif content:
            out.extend(_content_parts(content))
        tool_calls = msg.get("tool_calls")
        if tool_calls:
            append(canonical_json(tool_calls))
    return out


_ROLE_MARKS = {
    role: f"<|{role}|>" for role in ("system", "developer", "user", "assistant", "tool", "function")
}


def _content_parts(content: Any) -> Iterator[str]:
    if isinstance(content, str):
        yield content
        return
    for part in content or ():
        if not isinstance(part, dict):
            continue
        text = part.get("text")
        if isinstance(text, str):
            yield text
        else:
            yield canonical_json(part)
