"""`limits.max_messages` and `limits.max_content_parts`: checked at parse time,
refused with 400 `array_above_max_length` naming the array."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.config.decode import ConfigError
from gateway.config.schema import LimitsConfig, parse_config
from gateway.errors import BadRequest
from gateway.ingress.protocol import parse_request

LIMITS = LimitsConfig(max_messages=5, max_content_parts=6)


def _chat(messages: list[dict[str, Any]]) -> bytes:
    return json.dumps({"model": "m", "messages": messages}).encode()


def _parts(n: int) -> list[dict[str, str]]:
    return [{"type": "text", "text": "hi"}] * n


def test_messages_up_to_the_limit_pass_and_one_more_is_refused() -> None:
    five = [{"role": "user", "content": "hi"}] * 5
    assert len(parse_request("chat", _chat(five), LIMITS).body["messages"]) == 5
    with pytest.raises(BadRequest) as exc:
        parse_request("chat", _chat([*five, {"role": "user", "content": "hi"}]), LIMITS)
    assert exc.value.status == 400
    assert exc.value.code == "array_above_max_length"
    assert exc.value.param == "messages"
    assert "6 messages, over the limit of 5" in exc.value.message


def test_content_parts_count_across_messages_and_name_the_message_over() -> None:
    ok = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": _parts(3)},
        {"role": "user", "content": _parts(3)},
    ]
    assert parse_request("chat", _chat(ok), LIMITS).body["messages"] == ok
    over = [*ok[:2], {"role": "assistant", "content": "ok"}, {"role": "user", "content": _parts(4)}]
    with pytest.raises(BadRequest) as exc:
        parse_request("chat", _chat(over), LIMITS)
    assert exc.value.code == "array_above_max_length"
    assert exc.value.param == "messages[3].content"
    assert "7 parts, over the limit of 6" in exc.value.message


def test_defaults_fit_a_200k_token_agent() -> None:
    limits = LimitsConfig()
    assert (limits.max_messages, limits.max_content_parts) == (10_000, 50_000)
    history = [{"role": "user", "content": _parts(4)}] * 2_500  # 10k parts in 2,500 turns
    assert len(parse_request("chat", _chat(history)).body["messages"]) == 2_500


@pytest.mark.parametrize("key", ["max_messages", "max_content_parts", "max_bytes_per_token"])
def test_limits_must_be_positive_and_errors_name_the_key(key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config({"limits": {key: 0}})
    assert f"limits.{key}" in "\n".join(exc.value.problems)
    assert getattr(parse_config({"limits": {key: 7}}).limits, key) == 7
