"""Closed-loop load generator (aiohttp) and the request bodies it sends.

`run_load` keeps `concurrency` requests in flight until `max_requests` were
issued or `duration_s` elapsed, whichever comes first. Every request shares
one pre-encoded body (bytes), so memory stays bounded at any concurrency.
Streaming responses are counted in SSE events (`\\n\\n` terminators) with a
one-byte carry across reads, without parsing JSON.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

MODEL = "bench-model"
REQUEST_TIMEOUT_S = 60.0


def small_body(stream: bool) -> bytes:
    # Flags first: the zero-delay upstream looks for them in the first/last bytes.
    return json.dumps(
        {
            "stream": stream,
            "max_tokens": 16,
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say hello."}],
        }
    ).encode()


def agent_body(target_bytes: int = 400_000) -> bytes:
    """An agent-shaped request: system prompt, tool schemas, and a long
    history of user / assistant tool calls / tool results, ~`target_bytes`."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "Run a repository operation. " * 8,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "file path"},
                        "query": {"type": "string", "description": "search text"},
                    },
                    "required": ["path"],
                },
            },
        }
        for i in range(12)
    ]
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a coding agent working in a large repository. " * 40}
    ]
    filler = "def handler(request):\n    return process(request.body)  # result line\n" * 40
    i = 0
    while len(json.dumps(messages)) < target_bytes - 4000 and i < 10_000:
        messages.append({"role": "user", "content": f"Step {i}: inspect the next module."})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {
                            "name": "tool_1",
                            "arguments": json.dumps({"path": f"src/m{i}.py"}),
                        },
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": filler})
        i += 1
    return json.dumps(
        {"stream": False, "max_tokens": 16, "model": MODEL, "tools": tools, "messages": messages}
    ).encode()


@dataclass
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    first_event_s: list[float] = field(default_factory=list)
    events: int = 0
    ok: int = 0
    errors: int = 0
    unfinished: int = 0  # still in flight at the hard stop, cancelled
    error_samples: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def note_error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what)


def merge_results(parts: list[LoadResult]) -> LoadResult:
    """Several measuring windows of one target as one: samples joined, counts
    and wall time summed (so rates are over the measured time only)."""
    out = LoadResult()
    for part in parts:
        out.latencies_s += part.latencies_s
        out.first_event_s += part.first_event_s
        out.events += part.events
        out.ok += part.ok
        out.errors += part.errors
        out.unfinished += part.unfinished
        out.error_samples += part.error_samples[: max(0, 5 - len(out.error_samples))]
        out.wall_s += part.wall_s
    return out


async def _one(
    session: aiohttp.ClientSession, url: str, body: bytes, stream: bool, res: LoadResult
) -> None:
    t0 = time.perf_counter()
    first: float | None = None
    events = 0
    try:
        async with session.post(
            url, data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            if stream:
                prev_nl = False
                async for data in resp.content.iter_any():
                    if first is None:
                        first = time.perf_counter() - t0
                    events += data.count(b"\n\n") + (1 if prev_nl and data[:1] == b"\n" else 0)
                    prev_nl = data[-1:] == b"\n" and data[-2:] != b"\n\n"
            else:
                await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        res.note_error(repr(exc)[:200])
        return
    if status != 200:
        res.note_error(f"HTTP {status}")
        return
    res.latencies_s.append(time.perf_counter() - t0)
    if first is not None:
        res.first_event_s.append(first)
    res.events += events
    res.ok += 1


async def run_load(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    stream: bool,
    concurrency: int,
    max_requests: int,
    duration_s: float,
    grace_s: float,
) -> LoadResult:
    """No new request after `duration_s`; requests still in flight `grace_s`
    later are cancelled and counted as `unfinished` (so a proxy that falls
    far behind cannot stretch the run)."""
    res = LoadResult()
    issued = 0
    start = time.perf_counter()
    deadline = start + duration_s

    async def worker() -> None:
        nonlocal issued
        while issued < max_requests and time.perf_counter() < deadline:
            issued += 1
            await _one(session, url, body, stream, res)

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    _, pending = await asyncio.wait(tasks, timeout=duration_s + grace_s)
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    res.wall_s = time.perf_counter() - start
    res.unfinished = issued - res.ok - res.errors
    return res


def make_session(max_connections: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        limit=max_connections, limit_per_host=max_connections, keepalive_timeout=60
    )
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
    )


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]
