"""Task policies through a real gateway (loopback) with the official `openai` SDK,
in front of a simulated vLLM replica."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.config.schema import ApiKeyConfig, AuthConfig, TenantConfig
from gateway.policy.stage import tenant_salt
from gateway.sim.cluster import SimCluster
from gateway.sim.tokens import render_chat, tokenize
from tests.gwharness import RunningGateway, running_gateway

MAX_MODEL_LEN = 2048
SECRET = "isolation-secret-for-tests"

POLICIES = {
    "chat.yaml": """
name: chat
match: {tasks: [talk], models: [chat-alias]}
model: sim-model
limits: {max_input_tokens: 400, max_output_tokens: 64, default_output_tokens: 24, on_excess: clamp}
priority: interactive
isolation: tenant
""",
    "extract.yaml": """
name: extract
limits: {max_output_tokens: 16, default_output_tokens: 8, on_excess: reject}
""",
    "agent.yaml": """
name: agent
limits: {max_output_tokens: 4096, default_output_tokens: 8}
session: {max_requests: 1000, max_total_tokens: 100000, idle_ttl_s: 600}
tokens: engine
""",
    "default.yaml": """
name: default
limits: {default_output_tokens: 16}
""",
}
KEYS = {
    "alice": "sk-alice-0123456789",
    "bob": "sk-bob-0123456789",
    "carol": "sk-carol-0123456789",
    "dave": "sk-dave-0123456789",
}
DAVE_TOKENS_PER_MIN = 100


def write_policies(directory: Path, files: dict[str, str]) -> None:
    for old in directory.glob("*.yaml"):
        old.unlink()
    for name, text in files.items():
        (directory / name).write_text(text)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster.start(1, speed=50, max_model_len=MAX_MODEL_LEN, output_len_max=32) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("policies")
    write_policies(d, POLICIES)
    return d


@pytest.fixture(scope="module")
def gw(sim: SimCluster, policy_dir: Path) -> Iterator[RunningGateway]:
    auth = AuthConfig(
        enabled=True,
        keys=(
            ApiKeyConfig(tenant="alice", key=KEYS["alice"]),
            ApiKeyConfig(tenant="bob", sha256=hashlib.sha256(KEYS["bob"].encode()).hexdigest()),
            ApiKeyConfig(tenant="carol", key=KEYS["carol"]),
            ApiKeyConfig(tenant="dave", key=KEYS["dave"]),
        ),
        tenants={
            "alice": TenantConfig(),
            "bob": TenantConfig(allowed_tasks=("chat",), default_task="chat"),
            "carol": TenantConfig(requests_per_min=2),
            "dave": TenantConfig(tokens_per_min=DAVE_TOKENS_PER_MIN),
        },
        isolation_secret=SECRET,
    )
    with running_gateway(sim.urls, policies=str(policy_dir), auth=auth) as running:
        yield running


_CLIENTS: dict[tuple[str, str], openai.OpenAI] = {}


def client(gw: RunningGateway, tenant: str = "alice") -> openai.OpenAI:
    key = (gw.url, tenant)
    if key not in _CLIENTS:
        _CLIENTS[key] = gw.openai(api_key=KEYS[tenant])
    return _CLIENTS[key]


@pytest.fixture(scope="module", autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    for c in _CLIENTS.values():
        c.close()
    _CLIENTS.clear()


def last_upstream(sim: SimCluster) -> dict[str, Any]:
    records = sim.stats(0)["requests"]
    assert records, "the replica saw no request"
    return dict(records[-1])


def upstream_count(sim: SimCluster) -> int:
    return len(sim.stats(0)["requests"])


MSG = [{"role": "user", "content": "Say something short about the sea."}]


def test_default_output_injected_upstream(gw: RunningGateway, sim: SimCluster) -> None:
    raw = client(gw).chat.completions.with_raw_response.create(
        model="sim-model", messages=MSG, extra_headers={"X-Task": "chat"}
    )
    assert raw.headers["x-gateway-task"] == "chat"
    assert raw.headers["x-gateway-output-limit"] == "24"
    body = last_upstream(sim)["body"]
    assert body["max_tokens"] == 24
    assert raw.parse().usage is not None and raw.parse().usage.completion_tokens <= 24


def test_output_clamped_and_reported(gw: RunningGateway, sim: SimCluster) -> None:
    raw = client(gw).chat.completions.with_raw_response.create(
        model="sim-model", messages=MSG, max_completion_tokens=500, extra_headers={"X-Task": "talk"}
    )
    assert raw.headers["x-gateway-output-limit"] == "64"
    assert raw.headers["x-gateway-output-clamped-from"] == "500"
    body = last_upstream(sim)["body"]
    assert body["max_tokens"] == 64 and body["max_completion_tokens"] == 64


def test_output_over_limit_rejected_per_policy(gw: RunningGateway, sim: SimCluster) -> None:
    before = upstream_count(sim)
    with pytest.raises(openai.BadRequestError) as exc:
        client(gw).chat.completions.create(
            model="sim-model", messages=MSG, max_tokens=100, extra_headers={"X-Task": "extract"}
        )
    assert exc.value.code == "output_limit_exceeded"
    assert exc.value.param == "max_tokens"
    assert upstream_count(sim) == before


def test_input_over_task_limit_is_context_length_exceeded(
    gw: RunningGateway, sim: SimCluster
) -> None:
    before = upstream_count(sim)
    long = [{"role": "user", "content": "word " * 1000}]
    with pytest.raises(openai.BadRequestError) as exc:
        client(gw).chat.completions.create(
            model="sim-model", messages=long, extra_headers={"X-Task": "chat"}
        )
    assert exc.value.code == "context_length_exceeded"
    assert exc.value.param == "messages"
    assert "400-token input limit" in exc.value.message
    assert exc.value.response.headers["x-gateway-reject-reason"] == "context_length_exceeded"
    assert upstream_count(sim) == before


def test_input_plus_output_over_max_model_len(gw: RunningGateway, sim: SimCluster) -> None:
    before = upstream_count(sim)
    with pytest.raises(openai.BadRequestError) as exc:
        client(gw).chat.completions.create(
            model="sim-model", messages=MSG, max_tokens=2040, extra_headers={"X-Task": "agent"}
        )
    assert exc.value.code == "context_length_exceeded"
    assert exc.value.param == "max_tokens"
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in exc.value.message
    assert upstream_count(sim) == before


def token_counts(gw: RunningGateway, source: str) -> float:
    prefix = f'gateway_token_counts_total{{source="{source}"}} '
    lines = [ln for ln in gw.metrics_text().splitlines() if ln.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_estimate_over_the_window_is_counted_exactly_before_a_refusal(
    gw: RunningGateway, sim: SimCluster
) -> None:
    # Task `default` estimates. The estimate puts this over the window (its template charge
    # alone is 40 tokens); the replica's own count fits it: served, at the replica's count.
    prompt = len(tokenize(render_chat(MSG, add_generation_prompt=True)))
    output = MAX_MODEL_LEN - prompt - 2
    raw = client(gw).chat.completions.with_raw_response.create(
        model="sim-model", messages=MSG, max_tokens=output
    )
    assert raw.headers["x-gateway-input-tokens"] == str(prompt)
    assert last_upstream(sim)["prompt_tokens"] == prompt
    # Over by the replica's count too: refused, saying the count is the engine's.
    before = upstream_count(sim)
    with pytest.raises(openai.BadRequestError) as exc:
        client(gw).chat.completions.create(
            model="sim-model", messages=MSG, max_tokens=MAX_MODEL_LEN - prompt + 1
        )
    assert exc.value.code == "context_length_exceeded"
    assert f"({prompt} in the messages, counted by the engine," in exc.value.message
    assert upstream_count(sim) == before


def test_estimate_far_over_the_window_is_refused_without_a_count(gw: RunningGateway) -> None:
    engine_counts = token_counts(gw, "engine")
    long = [{"role": "user", "content": "word " * (4 * MAX_MODEL_LEN)}]  # >3x by the estimate
    with pytest.raises(openai.BadRequestError) as exc:
        client(gw).chat.completions.create(model="sim-model", messages=long, max_tokens=4)
    assert exc.value.code == "context_length_exceeded"
    assert "input tokens (estimated)." in exc.value.message
    assert token_counts(gw, "engine") == engine_counts


def test_token_budget_counts_an_estimated_prompt_exactly_before_refusing(
    gw: RunningGateway, sim: SimCluster
) -> None:
    # Dave's tokens per minute fit this request by the replica's count, not by the estimate
    # (its template charge alone is 40 tokens): counted exactly, then served.
    prompt = len(tokenize(render_chat(MSG, add_generation_prompt=True)))
    output = DAVE_TOKENS_PER_MIN - prompt - 2
    dave = client(gw, "dave")
    raw = dave.chat.completions.with_raw_response.create(
        model="sim-model", messages=MSG, max_tokens=output
    )
    assert raw.headers["x-gateway-input-tokens"] == str(prompt)
    # The window now holds what that request used: the next one cannot fit even at the
    # estimate's margin, so it is refused without a count, saying it was estimated.
    with pytest.raises(openai.RateLimitError) as exc:
        dave.chat.completions.create(model="sim-model", messages=MSG, max_tokens=output)
    assert "(its prompt estimated)." in exc.value.message


def test_engine_token_count_matches_replica(gw: RunningGateway, sim: SimCluster) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Count me exactly."},
    ]
    raw = client(gw).chat.completions.with_raw_response.create(
        model="sim-model", messages=messages, extra_headers={"X-Task": "agent"}
    )
    expected = len(tokenize(render_chat(messages)))
    assert raw.headers["x-gateway-input-tokens"] == str(expected)
    assert last_upstream(sim)["prompt_tokens"] == expected


def test_unknown_task_lists_known_tasks(gw: RunningGateway) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client(gw).chat.completions.create(
            model="sim-model", messages=MSG, extra_headers={"X-Task": "poetry"}
        )
    assert exc.value.code == "unknown_task"
    for task in ("agent", "chat", "default", "extract", "talk"):
        assert task in exc.value.message


def test_model_alias_rewritten_upstream(gw: RunningGateway, sim: SimCluster) -> None:
    raw = client(gw).chat.completions.with_raw_response.create(model="chat-alias", messages=MSG)
    assert raw.headers["x-gateway-task"] == "chat"
    assert last_upstream(sim)["body"]["model"] == "sim-model"


def test_isolation_salt_replaces_client_salt(gw: RunningGateway, sim: SimCluster) -> None:
    client(gw, "alice").chat.completions.create(
        model="chat-alias", messages=MSG, extra_body={"cache_salt": "copied-from-someone"}
    )
    alice_salt = last_upstream(sim)["body"]["cache_salt"]
    client(gw, "bob").chat.completions.create(model="chat-alias", messages=MSG)
    bob_salt = last_upstream(sim)["body"]["cache_salt"]
    assert alice_salt == tenant_salt(SECRET, "alice")
    assert bob_salt == tenant_salt(SECRET, "bob")
    assert alice_salt != bob_salt


def test_missing_and_invalid_keys_are_401(gw: RunningGateway) -> None:
    with gw.openai(api_key="sk-not-a-key") as bad, pytest.raises(openai.AuthenticationError) as exc:
        bad.chat.completions.create(model="sim-model", messages=MSG)
    assert exc.value.code == "invalid_api_key"
    r = httpx.post(
        gw.base_url + "/chat/completions", json={"model": "sim-model", "messages": MSG}, timeout=10
    )
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "missing_api_key"


def test_task_not_allowed_is_403_and_tenant_default_task_applies(gw: RunningGateway) -> None:
    raw = client(gw, "bob").chat.completions.with_raw_response.create(
        model="sim-model", messages=MSG
    )
    assert raw.headers["x-gateway-task"] == "chat"
    with pytest.raises(openai.PermissionDeniedError) as exc:
        client(gw, "bob").chat.completions.create(
            model="sim-model", messages=MSG, extra_headers={"X-Task": "agent"}
        )
    assert exc.value.code == "task_not_allowed"


def test_tenant_requests_per_minute(gw: RunningGateway) -> None:
    c = client(gw, "carol")
    outcomes: list[str] = []
    for _ in range(3):  # a sliding window: no boundary to straddle
        try:
            c.chat.completions.create(model="sim-model", messages=MSG)
            outcomes.append("ok")
        except openai.RateLimitError as exc:
            outcomes.append("429")
            assert exc.code == "rate_limit_exceeded"
            assert exc.response.headers["x-gateway-reject-reason"] == "tenant_requests_per_min"
            # the first request drops out of the 60 s window (kept in 1/50 slots)
            assert 55 <= float(exc.response.headers["retry-after"]) <= 62
    assert outcomes == ["ok", "ok", "429"]


def test_reload_success_and_refusal(gw: RunningGateway, policy_dir: Path) -> None:
    c = client(gw)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(
            model="sim-model", messages=MSG, extra_headers={"X-Task": "fresh"}
        )
    write_policies(
        policy_dir, {**POLICIES, "fresh.yaml": "name: fresh\nlimits: {default_output_tokens: 5}\n"}
    )
    try:
        r = httpx.post(gw.admin_url + "/admin/policies/reload", timeout=10)
        assert r.status_code == 200 and "fresh" in r.json()["policies"]
        raw = c.chat.completions.with_raw_response.create(
            model="sim-model", messages=MSG, extra_headers={"X-Task": "fresh"}
        )
        assert raw.headers["x-gateway-output-limit"] == "5"
        write_policies(
            policy_dir, {**POLICIES, "broken.yaml": "name: broken\nlimits: {max_output: 3}\n"}
        )
        r = httpx.post(gw.admin_url + "/admin/policies/reload", timeout=10)
        assert r.status_code == 400
        assert r.json()["status"] == "refused"
        assert any("broken.yaml.limits.max_output: unknown key" in e for e in r.json()["errors"])
        # The previous set (with `fresh`) keeps serving.
        raw = c.chat.completions.with_raw_response.create(
            model="sim-model", messages=MSG, extra_headers={"X-Task": "fresh"}
        )
        assert raw.headers["x-gateway-output-limit"] == "5"
    finally:
        write_policies(policy_dir, POLICIES)
        httpx.post(gw.admin_url + "/admin/policies/reload", timeout=10)
