"""Parse OpenAI request bodies into a normalised request.

Validates only what the gateway itself relies on (types of `model`,
`messages`, `prompt`, `stream`, output limits, session hints), with errors
that name the field; everything else is forwarded untouched for the engine
to judge.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from gateway.errors import BadRequest, InvalidJSON

Endpoint = Literal["chat", "completions"]

OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "n_predict")


@dataclass(slots=True, eq=False)
class ParsedRequest:
    endpoint: Endpoint
    body: dict[str, Any]
    model: str | None
    stream: bool
    client_wants_usage: bool
    requested_output: int | None
    output_field: str | None

    def set_model(self, model: str) -> None:
        self.model = model
        self.body["model"] = model


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise InvalidJSON("Request body is empty; expected a JSON object.")
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"Request body is not valid UTF-8: {exc.reason}.") from exc
    except json.JSONDecodeError as exc:
        raise InvalidJSON(
            f"Request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}."
        ) from exc
    if not isinstance(data, dict):
        raise InvalidJSON(f"Request body must be a JSON object, got {type(data).__name__}.")
    return data


def _type_error(param: str, expected: str, value: Any) -> BadRequest:
    got = "null" if value is None else type(value).__name__
    return BadRequest(f"'{param}' must be {expected}, got {got}.", param=param, code="invalid_type")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise _type_error("messages", "a non-empty array", messages)
    for i, msg in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise _type_error(param, "an object", msg)
        if not isinstance(msg.get("role"), str):
            raise _type_error(f"{param}.role", "a string", msg.get("role"))
        content = msg.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise _type_error(f"{param}.content", "a string or an array of parts", content)


def _check_prompt(prompt: Any) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return
    raise _type_error("prompt", "a string, an array of strings or an array of token ids", prompt)


def _output_limit(body: dict[str, Any]) -> tuple[int | None, str | None]:
    for name in OUTPUT_FIELDS:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(name, "an integer", value)
        if value < 0 and not (name == "n_predict" and value == -1):
            raise BadRequest(f"'{name}' must be >= 0, got {value}.", param=name, code="invalid_value")
        if value >= 0:
            return value, name
    return None, None


def parse_request(endpoint: Endpoint, raw: bytes) -> ParsedRequest:
    body = parse_json_object(raw)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _type_error("model", "a string", model)
    if endpoint == "chat":
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body.get("prompt"))
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _type_error("stream", "a boolean", stream)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _type_error("stream_options", "an object", opts)
    wants_usage = bool(stream and opts and opts.get("include_usage") is True)
    for name in ("user", "prompt_cache_key", "cache_salt"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise _type_error(name, "a string", body[name])
    requested, field_name = _output_limit(body)
    return ParsedRequest(endpoint, body, model, stream, wants_usage, requested, field_name)


def prompt_parts(req: ParsedRequest) -> Iterator[str]:
    """The prompt as text parts, in canonical order: tools, then each message
    (role, then content parts in order); for completions, the prompt as is."""
    body = req.body
    if req.endpoint == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            yield prompt
        elif isinstance(prompt, list):
            yield from (p if isinstance(p, str) else f"<{p}>" for p in prompt)
        return
    tools = body.get("tools")
    if tools:
        yield json.dumps(tools, sort_keys=True, separators=(",", ":"))
    for msg in body.get("messages") or ():
        yield f"<|{msg.get('role')}|>"
        yield from _content_parts(msg.get("content"))
        if msg.get("tool_calls"):
            yield json.dumps(msg["tool_calls"], sort_keys=True, separators=(",", ":"))


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
            yield json.dumps(part, sort_keys=True, separators=(",", ":"))
