"""Hostile JSON bodies: never anything but a 400/413 `GatewayError` (issue 19, item 1)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError, InvalidJSON
from gateway.ingress.protocol import MAX_INT_DIGITS, MAX_JSON_DEPTH, parse_request
from gateway.sim.cluster import SimCluster
from tests.gwharness import running_gateway

MSG = b'[{"role":"user","content":"x"}]'
DEEP = b"[" * 980 + b"]" * 980


def _refused(raw: bytes, endpoint: Any = "chat") -> InvalidJSON:
    with pytest.raises(InvalidJSON) as exc:
        parse_request(endpoint, raw)
    assert exc.value.status == 400 and exc.value.code == "invalid_json"
    return exc.value


def test_deep_nesting_in_messages_and_unknown_field() -> None:
    err = _refused(b'{"messages":' + DEEP + b"}")
    # `param` is None when the decoder itself hit the recursion limit first
    assert str(MAX_JSON_DEPTH) in err.message and err.param in ("messages", None)
    err = _refused(b'{"messages":' + MSG + b',"extra":' + b'{"a":' * 980 + b"1" + b"}" * 981)
    assert str(MAX_JSON_DEPTH) in err.message and err.param in ("extra", None)
    err = _refused(b'{"messages":' + MSG + b',"extra":' + b'{"a":' * 200 + b"1" + b"}" * 201)
    assert err.param == "extra"


def test_depth_limit_is_exact() -> None:
    def body(levels: int) -> bytes:  # the body's object is level 1
        inner = levels - 1
        return b'{"messages":' + MSG + b',"x":' + b"[" * inner + b"]" * inner + b"}"

    parse_request("chat", body(MAX_JSON_DEPTH))
    assert _refused(body(MAX_JSON_DEPTH + 1)).param == "x"


def test_huge_integers() -> None:
    err = _refused(b'{"messages":' + MSG + b',"seed":' + b"9" * 5000 + b"}")
    assert str(MAX_INT_DIGITS) in err.message
    err = _refused(b'{"messages":' + MSG + b',"seed":[-' + b"9" * (MAX_INT_DIGITS + 1) + b"]}")
    assert err.param == "seed"
    parse_request("chat", b'{"messages":' + MSG + b',"seed":' + b"9" * MAX_INT_DIGITS + b"}")
    _refused(b'{"prompt":[1,2,' + b"1" * (MAX_INT_DIGITS + 1) + b"]}", "completions")


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"[1.5,-1e400]"])
def test_non_finite_numbers(literal: bytes) -> None:
    _refused(b'{"messages":' + MSG + b',"temperature":' + literal + b"}")


@pytest.mark.parametrize(
    "content",
    [rb'"a\ud800b"', rb'"\udc00"', rb'"\ud800\ud800\udc00"', rb'[{"type":"text","text":"\uDBFF"}]'],
)
def test_lone_surrogates(content: bytes) -> None:
    err = _refused(b'{"messages":[{"role":"user","content":' + content + b"}]}")
    assert err.param == "messages" and "surrogate" in err.message


def test_lone_surrogate_in_a_key() -> None:
    _refused(b'{"messages":' + MSG + rb',"x":{"\ud800":1}}')


@pytest.mark.parametrize("content", [rb'"a\ud83d\ude00b"', rb'"a\\ud800"', rb'"\\\ud83d\ude00"'])
def test_surrogate_pairs_and_escaped_backslashes_pass(content: bytes) -> None:
    parse_request("chat", b'{"messages":[{"role":"user","content":' + content + b"}]}")


# -- fuzz ----------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**99, max_value=10**120),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=5), kids, max_size=4)
    ),
    max_leaves=20,
)
_FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "n_predict",
    "stream",
    "stream_options",
    "n",
    "temperature",
    "tools",
    "user",
    "prompt_cache_key",
    "cache_salt",
    "extra",
]


@st.composite
def hostile_bodies(draw: st.DrawFn) -> bytes:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    for name in draw(st.lists(st.sampled_from(_FIELDS), max_size=4)):
        body[name] = draw(_values)
    raw = json.dumps(body).encode()
    mutation = draw(st.integers(0, 6))
    if mutation == 1:  # deep nesting spliced into a field
        depth = draw(st.integers(1, 1500))
        opener = draw(st.sampled_from([b"[", b'{"k":']))
        closer = b"]" if opener == b"[" else b"}"
        name = draw(st.sampled_from(_FIELDS)).encode()
        raw = raw[:-1] + b',"' + name + b'":' + opener * depth + b"1" + closer * depth + b"}"
    elif mutation == 2:  # a huge or non-finite number
        number = draw(
            st.sampled_from(
                [
                    b"9" * 5000,
                    b"-" + b"1" * 4400,
                    b"NaN",
                    b"Infinity",
                    b"1e999",
                    b"1" * 101,
                    b"0." + b"5" * 400,
                ]
            )
        )
        raw = raw[:-1] + b',"' + draw(st.sampled_from(_FIELDS)).encode() + b'":' + number + b"}"
    elif mutation == 3:  # invalid UTF-8 / stray bytes
        pos = draw(st.integers(0, len(raw)))
        raw = raw[:pos] + draw(st.binary(min_size=1, max_size=4)) + raw[pos:]
    elif mutation == 4:  # surrogate escapes, lone or paired
        esc = draw(st.sampled_from([rb"\ud800", rb"\udfff", rb"\ud83d\ude00", rb"\\ud800"]))
        raw = raw.replace(b'"x"', b'"x' + esc + b'"', 1)
    elif mutation == 5:  # truncation
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_bodies(), st.sampled_from(["chat", "completions"]))
def test_hostile_bodies_never_raise_anything_else(raw: bytes, endpoint: Any) -> None:
    try:
        parse_request(endpoint, raw)
    except GatewayError as exc:
        assert exc.status in (400, 413), exc


# -- end to end ----------------------------------------------------------------


def test_deep_body_gets_a_full_400_through_the_gateway() -> None:
    with SimCluster.start(1, speed=200) as cluster, running_gateway(cluster.urls) as gw:
        body = b'{"model":"sim-model","messages":' + DEEP + b"}"
        resp = httpx.post(
            gw.url + "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json", "authorization": "Bearer sk-test-client"},
            timeout=30,
        )
        assert resp.status_code == 400
        assert resp.headers["x-gateway-reject-reason"] == "invalid_json"
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_json")
        assert error["param"] in ("messages", None)
        assert str(MAX_JSON_DEPTH) in error["message"]
        assert httpx.get(gw.url + "/healthz", timeout=10).status_code == 200
