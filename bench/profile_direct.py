"""The gateway's per-request body work called directly, without a profiler
(`bench/profile_request.py`): a cross-check of the profile's phase split.

Each step runs on the same body as the profiled requests, repeatedly, timed
in this thread's CPU time (a descheduled thread costs nothing), median of
the repeats. Steps, in the order the pipeline runs them: the JSON decode
alone, the limits walk alone, `parse_request` (decode + walk + field checks),
the prompt's canonical rendering, the token estimate (cold: no part cache;
warm: every part cached, as for a resent history), the prefix block hashes,
the conversation key, and the splice of an added key into the raw body.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from gateway.forward.rawbody import spliced
from gateway.http.serving import tune_gc
from gateway.ingress import protocol
from gateway.ingress.protocol import parse_request, prompt_parts
from gateway.policy.tokens import LRU, estimate_request
from gateway.scheduling.conversation import opening
from gateway.scheduling.prefix import prefix_blocks

BLOCK_BYTES = 1024  # scheduling.block_bytes default
CACHE_ENTRIES = 65536


def _median_us(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        samples.append(time.thread_time() - t0)
    return statistics.median(samples) * 1e6


def _walk(data: dict[str, Any]) -> None:
    for key, value in data.items():
        protocol._check_json_value(key, value, 2, False)


def direct_timings(body: bytes) -> dict[str, float]:
    """µs per call of each step on `body` (a chat request), with the garbage
    collector tuned as `gateway serve` tunes it."""
    tune_gc()
    repeats = 21 if len(body) > 100_000 else 2001
    req = parse_request("chat", body)
    text = body.decode()
    data = protocol._DECODER.decode(text)

    def render() -> None:
        req.parts = None
        prompt_parts(req)

    cache = LRU(CACHE_ENTRIES)
    estimate_request(req, cache)
    parts = prompt_parts(req)
    final = {**(req.original or {}), "stream_options": {"include_usage": True}}
    steps: dict[str, Callable[[], object]] = {
        "utf-8 decode": body.decode,
        "JSON decode (stdlib, gateway's decoder)": lambda: protocol._DECODER.decode(text),
        "limits walk": lambda: _walk(data),
        "parse_request (all ingress)": lambda: parse_request("chat", body),
        "canonical rendering": render,
        "token estimate, cold (no part cached)": lambda: estimate_request(req),
        "token estimate, parts cached": lambda: estimate_request(req, cache),
        "prefix block hashes": lambda: prefix_blocks(parts, req.model, None, BLOCK_BYTES),
        "conversation key": lambda: opening(req),
        "splice one added top-level key": lambda: spliced(req.raw, req.original, final),
    }
    return {name: _median_us(fn, repeats) for name, fn in steps.items()}
