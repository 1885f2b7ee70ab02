"""The types the OpenAI API gives the fields of chat and completions requests
(openai-python's `CompletionCreateParams`), checked at ingress so a wrong
type is a 400 naming its path (`messages[0].content[1].text`, `stop`,
`tools[2].function.name`) instead of reaching the engine.

Only types are checked, and only for the fields the API defines: `null`
stands for "not given" everywhere, values (ranges, enums) are the engine's
to judge, and fields the API does not define (engine extensions such as
vLLM's `top_k`) pass untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from gateway.errors import BadRequest

Check = Callable[[Any], bool]


def _is_str(v: Any) -> bool:
    return type(v) is str


def _is_bool(v: Any) -> bool:
    return type(v) is bool


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_number(v: Any) -> bool:
    return type(v) is int or type(v) is float


def _is_object(v: Any) -> bool:
    return type(v) is dict


def _is_list(v: Any) -> bool:
    return type(v) is list


def _str_or_strs(v: Any) -> bool:
    return type(v) is str or (type(v) is list and all(type(s) is str for s in v))


def _strs(v: Any) -> bool:
    return type(v) is list and all(type(s) is str for s in v)


def _str_or_object(v: Any) -> bool:
    return type(v) is str or type(v) is dict


def _numbers_by_key(v: Any) -> bool:
    return type(v) is dict and all(type(x) is int or type(x) is float for x in v.values())


_STRING: Final = ("a string", _is_str)
_BOOLEAN: Final = ("a boolean", _is_bool)
_INTEGER: Final = ("an integer", _is_int)
_NUMBER: Final = ("a number", _is_number)
_OBJECT: Final = ("an object", _is_object)
_STOP: Final = ("a string or an array of strings", _str_or_strs)
_CHOICE: Final = ("a string or an object", _str_or_object)

_COMMON: Final[dict[str, tuple[str, Check]]] = {
    "model": _STRING,
    "frequency_penalty": _NUMBER,
    "presence_penalty": _NUMBER,
    "logit_bias": ("an object of numbers", _numbers_by_key),
    "max_tokens": _INTEGER,
    "n": _INTEGER,
    "seed": _INTEGER,
    "stop": _STOP,
    "stream": _BOOLEAN,
    "stream_options": _OBJECT,
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "user": _STRING,
}

CHAT_FIELDS: Final[dict[str, tuple[str, Check]]] = {
    **_COMMON,
    "max_completion_tokens": _INTEGER,
    "logprobs": _BOOLEAN,
    "top_logprobs": _INTEGER,
    "parallel_tool_calls": _BOOLEAN,
    "store": _BOOLEAN,
    "tools": ("an array of objects", _is_list),
    "functions": ("an array of objects", _is_list),
    "tool_choice": _CHOICE,
    "function_call": _CHOICE,
    "response_format": _OBJECT,
    "metadata": _OBJECT,
    "modalities": ("an array of strings", _strs),
    "reasoning_effort": _STRING,
    "service_tier": _STRING,
    "verbosity": _STRING,
    "prediction": _OBJECT,
    "audio": _OBJECT,
    "web_search_options": _OBJECT,
    "prompt_cache_key": _STRING,
    "safety_identifier": _STRING,
}

COMPLETIONS_FIELDS: Final[dict[str, tuple[str, Check]]] = {
    **_COMMON,
    "best_of": _INTEGER,
    "echo": _BOOLEAN,
    "logprobs": _INTEGER,
    "suffix": _STRING,
}

_MESSAGE_FIELDS: Final[dict[str, tuple[str, Check]]] = {
    "role": _STRING,
    "name": _STRING,
    "tool_call_id": _STRING,
    "refusal": _STRING,
    "tool_calls": ("an array of objects", _is_list),
}

#: A content part's payload by its `type`: the key that holds it, and its type.
_PART_PAYLOAD: Final[dict[str, tuple[str, tuple[str, Check]]]] = {
    "text": ("text", _STRING),
    "refusal": ("refusal", _STRING),
    "image_url": ("image_url", _OBJECT),
    "input_audio": ("input_audio", _OBJECT),
    "file": ("file", _OBJECT),
}


def type_error(param: str, expected: str, value: Any) -> BadRequest:
    got = "null" if value is None else _json_type(value)
    return BadRequest(f"'{param}' must be {expected}, got {got}.", param=param, code="invalid_type")


def _json_type(value: Any) -> str:
    kind = type(value)
    if kind is bool:
        return "boolean"
    if kind is int or kind is float:
        return "number"
    if kind is str:
        return "string"
    if kind is list:
        return "array"
    return "object" if kind is dict else kind.__name__


def check_fields(
    body: dict[str, Any], spec: Mapping[str, tuple[str, Check]], path: str = ""
) -> None:
    """Each field of `spec` present (and not null) in `body` has its type."""
    for name in body.keys() & spec.keys():  # a set operation: one pass in C
        value = body[name]
        if value is not None:
            expected, ok = spec[name]
            if not ok(value):
                raise type_error(f"{path}{name}", expected, value)


def check_top_level(endpoint: str, body: dict[str, Any]) -> None:
    """The typed top-level fields, then the items of the arrays of objects."""
    check_fields(body, CHAT_FIELDS if endpoint == "chat" else COMPLETIONS_FIELDS)
    if endpoint == "chat":
        _check_functions("tools", body.get("tools"), nested=True)
        _check_functions("functions", body.get("functions"), nested=False)


def _check_functions(param: str, items: Any, nested: bool) -> None:
    """`tools[i]` is `{"type": ..., "function": {"name": ...}}`; `functions[i]` the inner object."""
    for i, item in enumerate(items or ()):
        where = f"{param}[{i}]"
        if type(item) is not dict:
            raise type_error(where, "an object", item)
        if nested:
            check_fields(item, {"type": _STRING, "function": _OBJECT}, f"{where}.")
            item = item.get("function")
            where = f"{where}.function"
            if item is None:
                continue
        check_fields(
            item, {"name": _STRING, "description": _STRING, "strict": _BOOLEAN}, f"{where}."
        )
        check_fields(item, {"parameters": _OBJECT}, f"{where}.")


def check_message(i: int, msg: dict[str, Any]) -> None:
    """A message's typed fields besides `content` (checked by the caller)."""
    if msg.keys() - {"role", "content"}:  # most messages: role and content only
        check_fields(msg, _MESSAGE_FIELDS, f"messages[{i}].")
        calls = msg.get("tool_calls")
        for j, call in enumerate(calls or ()):
            where = f"messages[{i}].tool_calls[{j}]"
            if type(call) is not dict:
                raise type_error(where, "an object", call)
            check_fields(call, {"id": _STRING, "type": _STRING, "function": _OBJECT}, f"{where}.")
            function = call.get("function")
            if function is not None:
                spec = {"name": _STRING, "arguments": _STRING}
                check_fields(function, spec, f"{where}.function.")
    elif type(msg.get("role")) is not str:
        raise type_error(f"messages[{i}].role", "a string", msg.get("role"))


def check_parts(i: int, content: list[Any]) -> None:
    """Each content part is an object whose `type` is a string and whose
    payload (`text` of a text part, ...) has the type the API gives it."""
    for j, part in enumerate(content):
        if type(part) is not dict:
            raise type_error(f"messages[{i}].content[{j}]", "an object", part)
        kind = part.get("type")
        if kind is None:  # (engines infer a part's kind from its payload key)
            continue
        if type(kind) is not str:
            raise type_error(f"messages[{i}].content[{j}].type", "a string", kind)
        payload = _PART_PAYLOAD.get(kind)
        if payload is not None:
            key, (expected, ok) = payload
            value = part.get(key)
            if not ok(value):
                raise type_error(f"messages[{i}].content[{j}].{key}", expected, value)
