"""The types the OpenAI API gives request fields are checked at parse, with
the field's path in the error; well-typed values, null and fields the API
does not define pass."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import BadRequest
from gateway.ingress.protocol import parse_request

MSG = [{"role": "user", "content": "hi"}]


def refused(endpoint: str, body: dict[str, Any]) -> BadRequest:
    with pytest.raises(BadRequest) as exc:
        parse_request(endpoint, json.dumps(body).encode())  # type: ignore[arg-type]
    assert exc.value.code == "invalid_type"
    return exc.value


@pytest.mark.parametrize(
    ("extra", "param", "expected"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content[0].text",
            "a string, got number",
        ),
        (
            {"messages": [{"role": "user", "content": ["hi"]}]},
            "messages[0].content[0]",
            "an object, got string",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": 3}]}]},
            "messages[0].content[0].type",
            "a string, got number",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": 1}]}]},
            "messages[0].content[0].image_url",
            "an object, got number",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "name": 1}]},
            "messages[0].name",
            "a string, got number",
        ),
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": {}}]},
            "messages[0].tool_calls",
            "an array of objects, got object",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 1}}]}]},
            "messages[0].tool_calls[0].function.name",
            "a string, got number",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]},
            "messages[0].tool_calls[0].function.arguments",
            "a string, got object",
        ),
        (
            {"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]},
            "messages[0].tool_call_id",
            "a string, got number",
        ),
        ({"stop": 5}, "stop", "a string or an array of strings, got number"),
        ({"stop": ["a", 1]}, "stop", "a string or an array of strings, got array"),
        ({"tools": 5}, "tools", "an array of objects, got number"),
        ({"tools": [5]}, "tools[0]", "an object, got number"),
        (
            {"tools": [{"type": "function", "function": {"name": 5}}]},
            "tools[0].function.name",
            "a string, got number",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
            "an object, got array",
        ),
        ({"functions": [{"name": "f", "strict": "yes"}]}, "functions[0].strict", "a boolean"),
        ({"temperature": "hot"}, "temperature", "a number, got string"),
        ({"top_p": True}, "top_p", "a number, got boolean"),
        ({"n": 1.5}, "n", "an integer, got number"),
        ({"seed": "1"}, "seed", "an integer"),
        ({"logprobs": 1}, "logprobs", "a boolean, got number"),
        ({"top_logprobs": "3"}, "top_logprobs", "an integer"),
        ({"logit_bias": {"50256": "x"}}, "logit_bias", "an object of numbers"),
        ({"tool_choice": 1}, "tool_choice", "a string or an object"),
        ({"response_format": "json"}, "response_format", "an object, got string"),
        ({"parallel_tool_calls": "true"}, "parallel_tool_calls", "a boolean"),
        ({"metadata": []}, "metadata", "an object"),
        ({"modalities": "text"}, "modalities", "an array of strings"),
        ({"stream": "yes"}, "stream", "a boolean, got string"),
        ({"stream_options": []}, "stream_options", "an object"),
        ({"model": 3}, "model", "a string"),
        ({"user": 3}, "user", "a string"),
        ({"frequency_penalty": []}, "frequency_penalty", "a number"),
    ],
)
def test_chat_fields_of_the_wrong_type_are_refused_by_path(
    extra: dict[str, Any], param: str, expected: str
) -> None:
    err = refused("chat", {"model": "m", "messages": MSG, **extra})
    assert err.param == param
    assert err.message.startswith(f"'{param}' must be {expected}"), err.message


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"echo": 1}, "echo"),
        ({"suffix": 1}, "suffix"),
        ({"best_of": "2"}, "best_of"),
        ({"stop": 5}, "stop"),
    ],
)
def test_completions_fields_of_the_wrong_type_are_refused(
    extra: dict[str, Any], param: str
) -> None:
    assert refused("completions", {"model": "m", "prompt": "p", **extra}).param == param


def test_well_typed_null_and_unknown_fields_pass() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"text": "a part without a type"},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"},
        ],
        "stop": ["\n\n"],
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "temperature": 0,
        "top_p": 0.5,
        "n": None,
        "seed": None,
        "logit_bias": {"50256": -100},
        "top_k": "an engine extension, the engine's to judge",
        "stream": None,
    }
    req = parse_request("chat", json.dumps(body).encode())
    assert req.stream is False and req.body["top_k"].startswith("an engine")
    parse_request("completions", json.dumps({"prompt": "p", "stop": "x", "logprobs": 2}).encode())
