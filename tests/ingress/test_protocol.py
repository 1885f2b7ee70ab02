from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import BadRequest, InvalidJSON
from gateway.ingress.protocol import canonical_json, parse_request, prompt_parts


def test_chat_request_is_normalised() -> None:
    req = parse_request(
        "chat",
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
        b'"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":9}',
    )
    assert (req.model, req.stream, req.client_wants_usage) == ("m", True, True)
    assert (req.requested_output, req.output_field) == (9, "max_completion_tokens")


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"", "empty"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, got list"),
        (b"\xff\xfe", "not valid"),
    ],
)
def test_invalid_bodies(raw: bytes, fragment: str) -> None:
    with pytest.raises(InvalidJSON) as exc:
        parse_request("chat", raw)
    assert fragment in exc.value.message


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model": 3, "messages": [{"role":"user","content":"x"}]}', "model"),
        (b'{"messages": "hi"}', "messages"),
        (b'{"messages": [{"content":"x"}]}', "messages[0].role"),
        (b'{"messages": [{"role":"user","content":5}]}', "messages[0].content"),
        (b'{"messages": [{"role":"user","content":"x"}], "stream": "yes"}', "stream"),
        (b'{"messages": [{"role":"user","content":"x"}], "max_tokens": "10"}', "max_tokens"),
        (b'{"messages": [{"role":"user","content":"x"}], "max_tokens": -5}', "max_tokens"),
    ],
)
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
    req = parse_request(
        "chat",
        b'{"tools":[{"type":"function"}],"messages":[{"role":"system","content":"S"},'
        b'{"role":"user","content":[{"type":"text","text":"T"}]}]}',
    )
    assert list(prompt_parts(req)) == ['[{"type":"function"}]', "<|system|>", "S", "<|user|>", "T"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_canonical_json_is_sorted_compact_ascii_json_dumps(value: object) -> None:
    """The reused C encoder renders prompt parts exactly as `json.dumps` would (the
    prefix hashes and token estimates depend on these bytes), call after call."""
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"))
    assert canonical_json(value) == expected
    assert canonical_json(value) == expected


def _reference_parts(body: dict[str, object]) -> list[str]:
    """The canonical part order, written plainly (what `prompt_parts` must equal)."""
    out: list[str] = []
    if body.get("tools"):
        out.append(json.dumps(body["tools"], sort_keys=True, separators=(",", ":")))
    for msg in body["messages"]:  # type: ignore[attr-defined]
        out.append(f"<|{msg['role']}|>")
        content = msg.get("content")
        if isinstance(content, str):
            out.append(content)
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict):
                text = part.get("text")
                out.append(
                    text
                    if isinstance(text, str)
                    else json.dumps(part, sort_keys=True, separators=(",", ":"))
                )
        if msg.get("tool_calls"):
            out.append(json.dumps(msg["tool_calls"], sort_keys=True, separators=(",", ":")))
    return out


_untyped_key = st.text(max_size=4).filter(lambda k: k not in ("type", "function", "id"))
# Well-typed parts (wrong types are refused at parse: tests/ingress/test_fields.py)
_parts = st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=5)})
    | st.fixed_dictionaries(
        {
            "type": st.just("image_url"),
            "image_url": st.fixed_dictionaries({"url": st.text(max_size=5)}),
        }
    )
    | st.fixed_dictionaries(
        {"type": st.sampled_from(["input_text", "x"])},
        optional={"text": st.text(max_size=5) | st.integers(), "data": st.integers()},
    )
    | st.dictionaries(
        st.sampled_from(["text", "image_url"]), st.text(max_size=5) | st.integers(), max_size=2
    ),
    max_size=3,
)
_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "critic", ""])},
        optional={
            "content": st.none() | st.text(max_size=10) | _parts,
            "tool_calls": st.none()
            | st.lists(st.dictionaries(_untyped_key, st.text(max_size=4)), max_size=2),
        },
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(
    messages=_messages,
    tools=st.none() | st.lists(st.dictionaries(_untyped_key, st.integers()), max_size=2),
)
def test_prompt_parts_follow_the_canonical_order(
    messages: list[dict[str, object]], tools: object
) -> None:
    body: dict[str, object] = {"model": "m", "messages": messages}
    if tools is not None:
        body["tools"] = tools
    assert prompt_parts(parse_request("chat", json.dumps(body).encode())) == _reference_parts(body)
