"""API keys: hashed or plaintext/env keys, constant-time matching, OpenAI-shaped 401s."""

from __future__ import annotations

import hashlib
import time

import pytest
from starlette.datastructures import Headers

from gateway.config.decode import ConfigError, decode
from gateway.config.schema import ApiKeyConfig, AuthConfig, TenantConfig
from gateway.errors import Unauthorized
from gateway.ingress.auth import Authenticator
from gateway.request.context import RequestContext


def ctx_with(headers: dict[str, str]) -> RequestContext:
    return RequestContext(
        request_id="r",
        endpoint="chat",
        path="/v1/chat/completions",
        headers=Headers(headers),
        received_at=time.monotonic(),
    )


def auth() -> Authenticator:
    return Authenticator(
        AuthConfig(
            enabled=True,
            keys=(
                ApiKeyConfig(tenant="a", key="sk-plain-aaaa"),
                ApiKeyConfig(tenant="b", sha256=hashlib.sha256(b"sk-hashed-bbbb").hexdigest()),
            ),
            tenants={"a": TenantConfig(), "b": TenantConfig()},
        )
    )


def test_bearer_and_x_api_key_map_to_tenants() -> None:
    a = auth()
    for headers, tenant in (
        ({"authorization": "Bearer sk-plain-aaaa"}, "a"),
        ({"authorization": "bearer  sk-hashed-bbbb "}, "b"),
        ({"x-api-key": "sk-hashed-bbbb"}, "b"),
    ):
        ctx = ctx_with(headers)
        a.authenticate(ctx)
        assert ctx.tenant == tenant


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "missing_api_key"),
        ({"authorization": "Basic xyz"}, "missing_api_key"),
        ({"authorization": "Bearer sk-plain-aaab"}, "invalid_api_key"),
        (
            {"authorization": "Bearer " + hashlib.sha256(b"sk-hashed-bbbb").hexdigest()},
            "invalid_api_key",
        ),
    ],
)
def test_missing_or_wrong_key_is_401(headers: dict[str, str], code: str) -> None:
    with pytest.raises(Unauthorized) as exc:
        auth().authenticate(ctx_with(headers))
    assert exc.value.status == 401 and exc.value.code == code
    assert "sk-plain" not in exc.value.message


def test_disabled_auth_sets_no_tenant() -> None:
    ctx = ctx_with({"authorization": "Bearer whatever"})
    Authenticator(AuthConfig()).authenticate(ctx)
    assert ctx.tenant is None


def test_config_validation() -> None:
    with pytest.raises(ConfigError) as exc:
        decode(
            AuthConfig,
            {"enabled": True, "keys": [{"tenant": "x", "key": "k", "sha256": "ab"}]},
            "auth",
        )
    assert "auth.keys[0]: give exactly one of key" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        decode(AuthConfig, {"enabled": True, "keys": [{"tenant": "ghost", "key": "k"}]}, "auth")
    assert "undefined tenants ['ghost']" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        decode(
            AuthConfig,
            {"keys": [{"tenant": "t", "key": "${NOT_SET_ANYWHERE_42}"}], "tenants": {"t": {}}},
            "auth",
            env={},
        )
    assert "NOT_SET_ANYWHERE_42" in str(exc.value)
    cfg = decode(
        AuthConfig,
        {"enabled": True, "keys": [{"tenant": "t", "key": "${K}"}], "tenants": {"t": {}}},
        "auth",
        env={"K": "sk-from-env"},
    )
    ctx = ctx_with({"authorization": "Bearer sk-from-env"})
    Authenticator(cfg).authenticate(ctx)
    assert ctx.tenant == "t"
