from __future__ import annotations

import pytest

from gateway.errors import BadRequest, InvalidJSON
from gateway.protocol import parse_request, prompt_parts


def test_chat_request_is_normalised() -> None:
    req = parse_request("chat", b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
                                b'"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":9}')
    assert (req.model, req.stream, req.client_wants_usage) == ("m", True, True)
    assert (req.requested_output, req.output_field) == (9, "max_completion_tokens")


@pytest.mark.parametrize(("raw", "fragment"), [
    (b"", "empty"),
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object, got list"),
    (b"\xff\xfe", "not valid"),
])
def test_invalid_bodies(raw: bytes, fragment: str) -> None:
    with pytest.raises(InvalidJSON) as exc:
        parse_request("chat", raw)
    assert fragment in exc.value.message


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"model": 3, "messages": [{"role":"user","content":"x"}]}', "model"),
    (b'{"messages": "hi"}', "messages"),
    (b'{"messages": [{"content":"x"}]}', "messages[0].role"),
    (b'{"messages": [{"role":"user","content":5}]}', "messages[0].content"),
    (b'{"messages": [{"role":"user","content":"x"}], "stream": "yes"}', "stream"),
    (b'{"messages": [{"role":"user","content":"x"}], "max_tokens": "10"}', "max_tokens"),
    (b'{"messages": [{"role":"user","content":"x"}], "max_tokens": -5}', "max_tokens"),
])
def test_wrong_types_name_the_field(raw: bytes, param: str) -> None:
    with pytest.raises(BadRequest) as exc:
        parse_request("chat", raw)
    assert exc.value.param == param
    assert param in exc.value.message


def test_completions_prompt_shapes() -> None:
    assert list(prompt_parts(parse_request("completions", b'{"prompt":"abc"}'))) == ["abc"]
    assert list(prompt_parts(parse_request("completions", b'{"prompt":[1,2]}'))) == ["<1>", "<2>"]
    with pytest.raises(BadRequest):
        parse_request("completions", b'{"prompt":[1,"a"]}')


def test_canonical_parts_order_tools_then_messages() -> None:
    req = parse_request("chat", b'{"tools":[{"type":"function"}],"messages":[{"role":"system","content":"S"},'
                                b'{"role":"user","content":[{"type":"text","text":"T"}]}]}')
    assert list(prompt_parts(req)) == ['[{"type":"function"}]', "<|system|>", "S", "<|user|>", "T"]
