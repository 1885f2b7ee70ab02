"""An open-loop load of streaming chat requests, counting every answer.

Requests start on a schedule of Poisson bursts (independent of how fast
answers come, so hundreds are in flight at the peaks) through one `httpx.AsyncClient`
whose keep-alive expiry equals the gateway's idle timeout: connections are
reused right at the moment the gateway may close them. Every request must
end in an answer: a status with a complete body, for a stream `[DONE]`
(after tokens or an SSE error event). A request whose connection closed
without one is *lost*.

    .venv/bin/python -m tests.hardening.loadgen URL [URL ...] --seconds 6 --idle-s 1 --runs 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx


@dataclass
class Tally:
    statuses: Counter[int] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    peak_in_flight: int = 0
    sse_errors: int = 0

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())


def body(i: int, max_tokens: int) -> dict[str, object]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": f"load {i} " + "word " * 20}],
        "max_tokens": max_tokens,
        "stream": True,
    }


async def one(client: httpx.AsyncClient, url: str, i: int, tally: Tally, max_tokens: int) -> None:
    status, text, t0 = 0, "", time.monotonic()
    try:
        async with client.stream(
            "POST", url + "/v1/chat/completions", json=body(i, max_tokens)
        ) as r:
            status = r.status_code
            async for chunk in r.aiter_text():
                text += chunk
    except httpx.TransportError as exc:  # the connection ended without a complete answer
        where = f"after status {status}, {len(text)} bytes" if status else "before any answer"
        took = time.monotonic() - t0
        tally.lost.append(f"request {i} to {url}: {type(exc).__name__} {where} ({took:.2f} s)")
        return
    if r.status_code == 200 and not text.rstrip().endswith("data: [DONE]"):
        tally.lost.append(f"request {i} to {url}: 200 stream without [DONE]: {text[-200:]!r}")
        return
    if r.status_code == 200 and '"error"' in text:
        tally.sse_errors += 1
    if r.status_code != 200:
        json.loads(text)  # an error answer is a complete JSON body
    tally.statuses[r.status_code] += 1


def schedule(rng: random.Random, rate: float, seconds: float, idle_s: float) -> list[float]:
    """Start times: bursts of Poisson arrivals at `rate` (0.3 s each), one every
    `idle_s` + 0.3 s give or take 0.15 s, so the connections a burst leaves
    idle are picked up again by the next one just around the gateway's idle
    timeout, while that burst's streams keep its event loop busy."""
    times: list[float] = []
    start = 0.0
    while start < seconds and len(times) < 100_000:
        t = start
        while t < start + 0.3:
            t += rng.expovariate(rate)
            times.append(t)
        start += idle_s + 0.3 + rng.uniform(-0.15, 0.15)
    return [t for t in times if t < seconds]


async def run(
    urls: list[str], rate: float, seconds: float, idle_s: float, max_tokens: int, seed: int
) -> Tally:
    """One open-loop run (`schedule`) spread over `urls`."""
    tally = Tally()
    limits = httpx.Limits(
        max_connections=2000, max_keepalive_connections=2000, keepalive_expiry=idle_s
    )
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0)) as client:
        tasks: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        for i, due in enumerate(schedule(random.Random(seed), rate, seconds, idle_s)):
            await asyncio.sleep(max(0.0, start + due - time.monotonic()))
            task = asyncio.create_task(one(client, urls[i % len(urls)], i, tally, max_tokens))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            tally.peak_in_flight = max(tally.peak_in_flight, len(tasks))
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
    return tally


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("urls", nargs="+")
    p.add_argument("--rate", type=float, default=1000.0, help="arrivals per second in a burst")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--idle-s", type=float, default=5.0, help="the gateway's keepalive_timeout_s")
    p.add_argument("--max-tokens", type=int, default=60)
    args = p.parse_args()
    for n in range(args.runs):
        t = asyncio.run(run(args.urls, args.rate, args.seconds, args.idle_s, args.max_tokens, n))
        print(
            json.dumps(
                {
                    "run": n,
                    "answered": t.answered,
                    "statuses": dict(t.statuses),
                    "sse_errors": t.sse_errors,
                    "peak_in_flight": t.peak_in_flight,
                    "lost": len(t.lost),
                    "first_lost": t.lost[:3],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
