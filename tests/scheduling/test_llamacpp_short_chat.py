"""A short chat without a session header on two real llama.cpp replicas
(llama-server b11434, CPU): turns 2 and 3 reuse the slot cache of turn 1.

The prompts stay below one prefix block (1 KB), so the prefix index never
sees them: only the conversation's implicit session key keeps the turns on
one replica, and slot pinning (slot count from `/props`) on one slot. Starts
its own two servers with the helpers of `tests/engine`; skipped with
GATEWAY_SKIP_ENGINE_TESTS=1 like the engine tests.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.config.schema import AdmissionConfig, ReplicaConfig
from tests.engine.llamaserver import load_engines, start_servers
from tests.gwharness import RunningGateway, running_gateway

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SKIP_ENV = "GATEWAY_SKIP_ENGINE_TESTS"


@pytest.fixture(scope="module")
def llama_urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    if os.environ.get(SKIP_ENV, "") not in ("", "0") and not os.environ.get("CI"):
        pytest.skip(f"real-engine test skipped ({SKIP_ENV}=1)")
    engines = load_engines()
    binary, model = engines.ensure_llama_server(), engines.ensure_model()
    servers = start_servers(binary, model, tmp_path_factory.mktemp("llama"), 2)
    try:
        yield [s.url for s in servers]
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def gw(llama_urls: list[str]) -> Iterator[RunningGateway]:
    replicas = [ReplicaConfig(url=u, kind="llamacpp") for u in llama_urls]
    admission = AdmissionConfig(poll_interval_s=0.2, stale_after_s=2.0)
    with running_gateway(replicas, admission=admission) as g:
        end = time.monotonic() + 30
        while time.monotonic() < end and not all(
            r["healthy"] and (r["live"] or {}).get("max_in_flight") for r in g.replicas()
        ):
            time.sleep(0.1)
        yield g


def _turn(
    gw: RunningGateway, client: openai.OpenAI, messages: list[ChatCompletionMessageParam]
) -> dict[str, Any]:
    raw = client.chat.completions.with_raw_response.create(
        model="smollm2", messages=messages, max_tokens=8, temperature=0
    )
    body = raw.parse()
    assert body.usage is not None and body.usage.prompt_tokens_details is not None
    name = raw.headers["x-gateway-replica"]
    url = {r["name"]: r["url"] for r in gw.replicas()}[name]
    slots = httpx.get(f"{url}/slots", timeout=10).json()
    latest = max((s for s in slots if "id_task" in s), key=lambda s: s["id_task"])
    return {
        "replica": name,
        "slot": latest["id"],
        "prompt": body.usage.prompt_tokens,
        "cached": body.usage.prompt_tokens_details.cached_tokens or 0,
        "answer": body.choices[0].message.content or "",
    }


def test_short_chat_reuses_the_slot_cache_without_a_session_header(gw: RunningGateway) -> None:
    """Two chats, one after the other, each with an unrelated one-off chat
    between its turns (background for the replica and slot choice)."""
    seen: dict[int, list[dict[str, Any]]] = {}
    with gw.openai() as client:
        for c in range(2):
            messages: list[ChatCompletionMessageParam] = [
                {"role": "user", "content": f"Hello, I am visitor {c}. Name three rivers."}
            ]
            seen[c] = []
            for turn in range(3):
                result = _turn(gw, client, messages)
                seen[c].append(result)
                messages.append({"role": "assistant", "content": result["answer"]})
                messages.append({"role": "user", "content": f"And {turn + 4} mountains?"})
                _turn(gw, client, [{"role": "user", "content": f"Say hi number {turn}{c}."}])
    report = json.dumps(seen, indent=1)
    for turns in seen.values():
        assert len({t["replica"] for t in turns}) == 1, report
        assert len({t["slot"] for t in turns}) == 1, report
        assert all(t["prompt"] < 256 for t in turns), report  # below one 1 KB prefix block
        cached = [t["cached"] for t in turns]
        assert 0 < cached[1] < cached[2], report  # the slot's cache is reused, and grows
