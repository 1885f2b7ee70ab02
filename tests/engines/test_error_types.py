"""Every error `type` a client sees is one of the OpenAI API's: the gateway's own
errors, and engines' errors, whose own names (vLLM's exception class names,
llama.cpp's extra types) are replaced by the type of the HTTP status; OpenAI types
the engine sends are kept."""

from __future__ import annotations

import json

import openai
import pytest

from gateway import errors
from gateway.config.schema import ReplicaConfig
from gateway.engines import adapter_for
from gateway.errors import OPENAI_ERROR_TYPES, GatewayError, error_body
from gateway.sim.config import SimConfig
from tests.gwharness import running_gateway
from tests.simkit import running_sims


def _body(type_: str, message: str = "m") -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "code": None}}).encode()


@pytest.mark.parametrize(
    ("kind", "status", "engine_type", "client_type"),
    [
        ("vllm", 400, "BadRequestError", "invalid_request_error"),
        ("vllm", 401, "Unauthorized", "authentication_error"),
        ("vllm", 404, "NotFoundError", "not_found_error"),
        ("vllm", 429, "TooManyRequestsError", "rate_limit_error"),
        ("vllm", 500, "InternalServerError", "server_error"),
        ("vllm", 503, "ServiceUnavailableError", "server_error"),
        ("llamacpp", 501, "not_supported_error", "server_error"),
        ("llamacpp", 503, "unavailable_error", "server_error"),
        ("llamacpp", 403, "permission_error", "permission_error"),
        ("unknown", 422, "ValidationError", "invalid_request_error"),
        ("unknown", 404, "not_found_error", "not_found_error"),
    ],
)
def test_engine_error_types_become_openai_types(
    kind: str, status: int, engine_type: str, client_type: str
) -> None:
    err = adapter_for(kind).normalize_error(status, _body(engine_type))
    out = error_body(err)["error"]
    assert err.status == status
    assert out["type"] == client_type
    assert out["type"] in OPENAI_ERROR_TYPES


def test_an_unknown_model_reaches_the_client_as_not_found_error() -> None:
    with (
        running_sims([SimConfig(flavor="vllm", speed=50.0)]) as sims,
        running_gateway([ReplicaConfig(url=sims.urls[0], kind="vllm")]) as gw,
        pytest.raises(openai.NotFoundError) as caught,
    ):
        gw.openai().chat.completions.create(
            model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    body = caught.value.body
    assert isinstance(body, dict), body
    assert body["type"] == "not_found_error", body


def _subclasses(cls: type[GatewayError]) -> list[type[GatewayError]]:
    return [cls, *(c for sub in cls.__subclasses__() for c in _subclasses(sub))]


def test_every_gateway_error_type_is_an_openai_type() -> None:
    tree = {c for c in _subclasses(GatewayError) if c.__module__ == errors.__name__}
    assert len(tree) >= 20, "the whole error tree"
    wrong = sorted(f"{c.__name__}: {c.type}" for c in tree if c.type not in OPENAI_ERROR_TYPES)
    assert not wrong, wrong
