"""Decode-aware routing and implicit sessions, through a real gateway in front
of simulated vLLM replicas (admission off: routing alone decides).

Where each turn went is read from the `x-gateway-replica` response header."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.config.schema import AdmissionConfig
from gateway.sim.cluster import SimCluster
from tests.gwharness import RunningGateway, running_gateway
from tests.scheduling.test_routing import wait_healthy

#: ~9k tokens: the harness's system prompt every session carries
SYSTEM = "You are a coding agent. Follow the repository's conventions exactly. " * 500
SESSIONS = 12
TURNS = 3
OUTPUT = 300  # decode-heavy: long streamed answers


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    with SimCluster.start(3, speed=20, kv_tokens=262144, max_model_len=65536) as c:
        yield c


@pytest.fixture
def gw(cluster: SimCluster) -> Iterator[RunningGateway]:
    cluster.reset()
    with running_gateway(cluster.urls, admission=AdmissionConfig(enabled=False)) as g:
        wait_healthy(g, 3)
        yield g


async def _turn(
    client: openai.AsyncOpenAI, messages: list[ChatCompletionMessageParam], headers: dict[str, str]
) -> tuple[str, str]:
    """One streamed turn: (replica, the answer's text)."""
    async with client.chat.completions.with_streaming_response.create(
        model="sim-model",
        messages=messages,
        max_tokens=OUTPUT,
        stream=True,
        extra_body={"ignore_eos": True},
        extra_headers=headers,
    ) as resp:
        replica = resp.headers["x-gateway-replica"]
        text = [
            chunk.choices[0].delta.content or ""
            async for chunk in await resp.parse()
            if chunk.choices
        ]
    return replica, "".join(text)


async def _fleet(gw: RunningGateway, with_header: bool) -> list[list[str]]:
    """Sessions start one after another (each once the previous one streams),
    then keep taking turns concurrently: the system prompt is cached on the
    first session's replica before the others arrive."""
    client = gw.async_openai(timeout=120.0)
    started = [asyncio.Event() for _ in range(SESSIONS)]

    async def session(i: int) -> list[str]:
        if i:
            await started[i - 1].wait()
        headers = {"x-session-id": f"agent-{i}"} if with_header else {}
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Task {i}: fix failing test number {i * 7}."},
        ]
        placed = []
        for turn in range(TURNS):
            if turn == 0:
                asyncio.get_running_loop().call_later(0.05, started[i].set)
            replica, answer = await _turn(client, messages, headers)
            placed.append(replica)
            messages.append({"role": "assistant", "content": answer})
            messages.append({"role": "user", "content": f"tool output {turn}: ok"})
        return placed

    async with client:
        return list(await asyncio.gather(*(session(i) for i in range(SESSIONS))))


@pytest.mark.parametrize("with_header", [False, True], ids=["implicit-session", "x-session-id"])
def test_shared_system_prompt_sessions_spread_and_each_stays_put(
    gw: RunningGateway, with_header: bool
) -> None:
    placed = asyncio.run(_fleet(gw, with_header))
    homes = Counter(turns[0] for turns in placed)
    assert all(len(set(turns)) == 1 for turns in placed), placed  # a session stays put
    assert len(homes) == 3, homes  # and the sessions use every replica
    assert max(homes.values()) <= 1.5 * SESSIONS / 3, homes


def _chat(gw: RunningGateway, messages: list[ChatCompletionMessageParam], **kw: Any) -> str:
    raw = gw.openai().chat.completions.with_raw_response.create(
        model="sim-model", messages=messages, max_tokens=8, **kw
    )
    raw.parse()
    return str(raw.headers["x-gateway-replica"])


async def _background(gw: RunningGateway, stop: asyncio.Event) -> None:
    """Unrelated streaming chats, one at a time per worker, until `stop`."""
    client = gw.async_openai()

    async def worker(w: int) -> None:
        for n in range(200):
            if stop.is_set():
                return
            stream = await client.chat.completions.create(
                model="sim-model",
                messages=[{"role": "user", "content": f"background {w}.{n} " * 40}],
                max_tokens=60,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            async for _ in stream:
                pass

    async with client:
        await asyncio.gather(*(worker(w) for w in range(4)))


def test_short_chat_without_session_header_keeps_its_replica(gw: RunningGateway) -> None:
    """Prompts shorter than one prefix block: no index, only the conversation's
    implicit session key keeps turns 2 and 3 where turn 1 went."""

    async def run() -> list[list[str]]:
        stop = asyncio.Event()
        background = asyncio.create_task(_background(gw, stop))
        try:
            chats = []
            for c in range(4):
                messages: list[ChatCompletionMessageParam] = [
                    {"role": "user", "content": f"Hi! I am user {c}. What is a monad?"}
                ]
                seen = []
                for turn in range(3):
                    seen.append(await asyncio.to_thread(_chat, gw, messages))
                    messages.append({"role": "assistant", "content": f"answer {turn}"})
                    messages.append({"role": "user", "content": f"and then {turn}?"})
                chats.append(seen)
            return chats
        finally:
            stop.set()
            await background

    chats = asyncio.run(run())
    assert all(len(set(seen)) == 1 for seen in chats), chats
