"""The upstream body is the client's own bytes when the gateway only added keys."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.schema import GatewayConfig, ReplicaConfig, UpstreamConfig
from gateway.forward import rawbody
from gateway.forward.forwarder import Forwarder
from gateway.forward.upstream import UpstreamClient
from gateway.http.serving import BackgroundServers, Listener, free_port
from gateway.ingress.protocol import parse_request
from gateway.request.context import Isolation
from tests.ctxkit import make_ctx
from tests.gwharness import RunningGateway, running_gateway
from tests.upstreams import Script, scripted_app

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_KEYS = st.text(min_size=1, max_size=6)


def _raw(body: dict[str, Any], spaced: bool) -> bytes:
    text = json.dumps(body, indent=2 if spaced else None, ensure_ascii=spaced)
    return (text + ("\n  " if spaced else "")).encode()


@settings(max_examples=200, deadline=None)
@given(
    body=st.dictionaries(_KEYS, _VALUES, max_size=5),
    spaced=st.booleans(),
    added=st.dictionaries(st.text(min_size=7, max_size=9), _VALUES, max_size=3),
    changed=st.lists(_KEYS, max_size=2),
    removed=st.lists(_KEYS, max_size=2),
)
def test_spliced_bytes_mean_exactly_the_final_body(
    body: dict[str, Any],
    spaced: bool,
    added: dict[str, Any],
    changed: list[str],
    removed: list[str],
) -> None:
    raw = _raw(body, spaced)
    original = json.loads(raw)
    final = dict(original)
    for k in changed:
        if k in final:
            final[k] = ["changed", final[k]]
    for k in removed:
        final.pop(k, None)
    final.update(added)
    out = rawbody.spliced(raw, original, final)
    untouched = all(final.get(k) is v for k, v in original.items()) and len(final) - len(
        added
    ) == len(original)
    if untouched:
        assert out is not None
        assert json.loads(out) == final
        assert out.startswith(raw.rstrip()[:-1].rstrip())  # the client's bytes, unchanged
    else:
        assert out is None  # re-encoded instead


def test_equal_scalars_count_as_unchanged() -> None:
    raw = b'{"max_tokens": 100000, "model": "m"}'
    original = json.loads(raw)
    final = {**original, "max_tokens": int("100000"), "stream_options": {"include_usage": True}}
    assert final["max_tokens"] is not original["max_tokens"]
    assert rawbody.spliced(raw, original, final) == (
        b'{"max_tokens": 100000, "model": "m","stream_options":{"include_usage":true}}'
    )


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "max_tokens": 10, "max_tokens": 99999, '
        b'"messages": [{"role": "user", "content": "x"}]}',
        b'{"model": "m", "messages": [{"role": "user", "role": "system", "content": "x"}]}',
        b'\xef\xbb\xbf{"model": "m", "messages": [{"role": "user", "content": "x"}]}',
    ],
)
def test_repeated_keys_or_a_bom_are_never_forwarded_as_is(raw: bytes) -> None:
    req = parse_request("chat", raw)
    assert req.raw is None
    assert rawbody.spliced(req.raw, req.original, req.body) is None


@pytest.fixture
def gw_scripted() -> Iterator[tuple[Script, RunningGateway]]:
    script = Script()
    port = free_port()
    with (
        BackgroundServers([Listener(scripted_app(script), "127.0.0.1", port)]),
        running_gateway([ReplicaConfig(url=f"http://127.0.0.1:{port}", kind="vllm")]) as gw,
    ):
        yield script, gw


def test_the_engine_receives_the_clients_bytes_plus_added_keys(
    gw_scripted: tuple[Script, RunningGateway],
) -> None:
    script, gw = gw_scripted
    sent = (
        b'{ "model" : "m",\n  "messages": [{"role": "user", "content": "caf\\u00e9 1.50e2"}],'
        b'\n  "temperature": 1.0e-1, "stream": true }\n'
    )
    r = httpx.post(
        gw.base_url + "/chat/completions",
        content=sent,
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    got = script.seen[-1]["raw"]
    head = sent.rstrip()[:-1].rstrip()
    assert got.startswith(head + b",")  # byte for byte, formatting and escapes kept
    extra = json.loads(b"{" + got[len(head) + 1 :])
    assert extra["stream_options"] == {"include_usage": True}  # usage for accounting
    assert isinstance(extra["max_tokens"], int)  # the policy's default output limit


def test_a_clamped_limit_is_re_encoded(gw_scripted: tuple[Script, RunningGateway]) -> None:
    script, gw = gw_scripted
    sent = (
        b'{"model": "m", "max_tokens": 10, "max_tokens": 999999999, '
        b'"messages": [{"role": "user", "content": "x"}]}'
    )
    r = httpx.post(
        gw.base_url + "/chat/completions",
        content=sent,
        headers={"content-type": "application/json"},
        timeout=10,
    )
    got = script.seen[-1]["raw"] if script.seen else b""
    if r.status_code == 200:
        assert got.count(b'"max_tokens"') == 1  # one value, the one the gateway enforced
        assert json.loads(got)["max_tokens"] < 999999999
    else:
        assert r.status_code == 400 and not script.seen


# --- the stages' typed edits, applied once by the forwarder ------------------------------


def _forwarded(ctx: Any) -> tuple[bytes, dict[str, Any]]:
    data, _ = Forwarder(GatewayConfig(), UpstreamClient(UpstreamConfig())).upstream_body(ctx)
    return data, json.loads(data)


def test_the_records_edit_the_upstream_body_and_not_the_clients() -> None:
    ctx = make_ctx(body={"cache_salt": "client", "x": 1.50}, output=7)
    assert ctx.contract is not None and ctx.request is not None
    sent = dict(ctx.request.body)
    ctx.contract.model = "real-model"
    ctx.contract.isolation = Isolation("tenant-salt")
    ctx.routing.pinned_slot, ctx.routing.pinned_field = 3, "id_slot"
    _, body = _forwarded(ctx)
    assert body["model"] == "real-model" and body["cache_salt"] == "tenant-salt"
    assert body["id_slot"] == 3 and body["max_tokens"] == 7
    assert ctx.request.body == sent  # the client's body as parsed, untouched
    assert (ctx.model, ctx.cache_salt) == ("real-model", "tenant-salt")


def test_added_keys_only_keep_the_clients_bytes() -> None:
    ctx = make_ctx(body={"x": 1.50}, output=7)
    ctx.routing.pinned_slot, ctx.routing.pinned_field = 0, "id_slot"
    data, body = _forwarded(ctx)
    assert ctx.request is not None and ctx.request.raw is not None
    assert data.startswith(ctx.request.raw.rstrip()[:-1])  # spliced, not re-encoded
    assert body["id_slot"] == 0


def test_isolation_without_a_tenant_drops_the_clients_salt() -> None:
    ctx = make_ctx(body={"cache_salt": "client"}, output=7)
    assert ctx.contract is not None
    ctx.contract.isolation = Isolation(None)
    _, body = _forwarded(ctx)
    assert "cache_salt" not in body and ctx.cache_salt is None
