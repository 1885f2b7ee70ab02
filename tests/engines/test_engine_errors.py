from __future__ import annotations

import json

from gateway.engines import adapter_for
from gateway.errors import ContextLengthExceeded, error_body


def test_vllm_context_error_becomes_openai_shape() -> None:
    body = json.dumps(
        {
            "error": {
                "message": "This model's maximum context length is 2048 tokens. However, "
                "your prompt contains 3000 input tokens.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        }
    ).encode()
    err = adapter_for("vllm").normalize_error(400, body)
    assert isinstance(err, ContextLengthExceeded)
    out = error_body(err)["error"]
    assert out["code"] == "context_length_exceeded" and err.status == 400
    assert "2048" in out["message"]


def test_vllm_unauthorized_string_error() -> None:
    err = adapter_for("vllm").normalize_error(401, b'{"error": "Unauthorized"}')
    assert (
        err.status == 401 and err.message == "Unauthorized" and err.type == "authentication_error"
    )


def test_llamacpp_context_error_keeps_both_numbers() -> None:
    body = json.dumps(
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 5000,
                "n_ctx": 4096,
            }
        }
    ).encode()
    err = adapter_for("llamacpp").normalize_error(400, body)
    assert isinstance(err, ContextLengthExceeded)
    assert "4096" in err.message and "5000" in err.message


def test_non_json_error_body() -> None:
    err = adapter_for("unknown").normalize_error(502, b"<html>bad gateway</html>")
    assert err.status == 502 and "bad gateway" in err.message
    assert set(error_body(err)["error"]) == {"message", "type", "param", "code"}
