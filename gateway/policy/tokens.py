"""Token counting for policies: `estimate`, `engine`, `tokenizer`.

`estimate_text` is deliberately conservative. The text is cut like a BPE
pre-tokenizer would (letter runs split at case changes, digits, symbols,
whitespace) and each piece is charged at least what common BPE vocabularies
spend on it: a Latin letter run ceil(len / 4) tokens plus one per non-ASCII
letter, other scripts one token per character, every digit and symbol one
token, whitespace runs ceil(len / 4) (a single space before a word is free).
The chat template costs `MESSAGE_OVERHEAD` per message plus `BASE_OVERHEAD`
(plus `TOOLS_OVERHEAD` when tools are sent). Measured margins against real
tokenizers are in docs/policies.md (bench/estimator_margin.py).

`EngineCounter` asks the first replica whose engine counts tokens
(`EngineAdapter.count_tokens`: the routes and payloads are the adapter's).
Results are cached by prompt hash (bounded LRU); on any failure or timeout
the estimate is used instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import xxhash

from gateway.config.schema import TokensConfig
from gateway.errors import GatewayError
from gateway.forward.upstream import UpstreamClient
from gateway.ingress.protocol import prompt_parts
from gateway.policy.estimate import (
    BASE_OVERHEAD,
    MESSAGE_OVERHEAD,
    TOOLS_OVERHEAD,
    estimate_text,
    estimate_text_in_slices,
)
from gateway.replicas.registry import Replica
from gateway.request.later import Later, Soon
from gateway.request.parsed import ParsedRequest

log = logging.getLogger("gateway.policy.tokens")

_HASHED_PART_MIN_CHARS = 48  # shorter parts (role markers, short turns) are their own cache key
#: Bodies this large or larger are counted in a worker thread, first checked
#: against `TokenCounter.floor` (bench/results/loop_stall.md). A 400 KB agent
#: request stays on the loop: its estimate mostly hits the per-part cache, and
#: a thread hand-off cost ~25 % more CPU per agent request (bench/overhead.py).
OFFLOAD_BYTES = 1024 * 1024
#: `estimate_text` charges at most this many characters per token (module docstring).
ESTIMATE_CHARS_PER_TOKEN = 4


def estimate_request(req: ParsedRequest, cache: LRU | None = None) -> int:
    """Conservative prompt tokens after the chat template would apply.

    With `cache`, the estimate of each part (a message, the tools) is
    remembered by its hash (a short part: by itself): an agent re-sending its
    whole history only pays for the new turns."""
    parts = prompt_parts(req)
    if cache is None:
        total = sum(estimate_text(part) for part in parts)
    else:
        total = _cached_estimate(parts, cache)
    return max(1, total + template_overhead(req))


def _cached_estimate(parts: list[str], cache: LRU) -> int:
    # The LRU's dict is used directly: an agent request has ~750 parts.
    data = cache._data
    digest = xxhash.xxh3_128_intdigest
    total = 0
    for part in parts:
        # A short part is its own key; a long one its 128-bit hash (an int: never equal to a str).
        key: str | int = (
            part
            if len(part) < _HASHED_PART_MIN_CHARS
            else digest(part.encode("utf-8", "surrogatepass"))
        )
        cost = data.get(key)
        if cost is None:
            cost = estimate_text(part)
            cache.put(key, cost)
        else:
            data.move_to_end(key)
        total += cost
    return total


def estimate_off_loop(
    req: ParsedRequest, cached: Mapping[str | int, int] | None
) -> tuple[int, list[tuple[str | int, int]]]:
    """`estimate_request` for a worker thread: long parts are estimated in
    slices (the GIL goes back to the loop between them), and the cache is only
    read (a single C call, safe beside the loop's writes); the estimates it
    missed are returned for the loop to store."""
    total = 0
    missed: list[tuple[str | int, int]] = []
    for part in prompt_parts(req):
        key = _part_key(part)
        cost = cached.get(key) if cached is not None else None
        if cost is None:
            cost = estimate_text_in_slices(part)
            missed.append((key, cost))
        total += cost
    return max(1, total + template_overhead(req)), missed


def _part_key(part: str) -> str | int:
    if len(part) < _HASHED_PART_MIN_CHARS:
        return part
    return xxhash.xxh3_128_intdigest(part.encode("utf-8", "surrogatepass"))


def text_chars(req: ParsedRequest, *, assistant: bool = True) -> int:
    """Characters of the prompt's text (message contents and text parts, a
    completions prompt; one per token id): O(messages), no rendering. Not
    counted: tools, tool calls and non-text parts, and with `assistant=False`
    assistant messages (reasoning templates drop earlier turns' thinking)."""
    body = req.body
    if req.endpoint == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return len(prompt)
        return sum(len(p) if isinstance(p, str) else 1 for p in prompt or ())
    total = 0
    for msg in body.get("messages") or ():
        if not assistant and msg.get("role") == "assistant":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            total += len(content)
            continue
        for part in content or ():
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str):
                total += len(text)
    return total


def template_overhead(req: ParsedRequest) -> int:
    """Tokens the chat template adds around the text (conservative)."""
    if req.endpoint != "chat":
        return 1  # BOS
    overhead = BASE_OVERHEAD + MESSAGE_OVERHEAD * len(req.body.get("messages") or ())
    return overhead + (TOOLS_OVERHEAD if req.body.get("tools") else 0)


@dataclass(frozen=True, slots=True)
class TokenCount:
    tokens: int
    source: str  # estimate | engine | cache | fallback | tokenizer


def described(source: str) -> str:
    """How a count of this `TokenCount.source` was made, as error messages say it."""
    if source in ("engine", "cache"):
        return "counted by the engine"
    if source == "tokenizer":
        return "counted by the tokenizer"
    return "estimated"


class TokenCounter(Protocol):
    async def count(
        self, req: ParsedRequest, replicas: Sequence[Replica], model: str | None = None
    ) -> TokenCount:
        """`model`: the name forwarded (the policy may map an alias), for an
        engine that counts per model."""
        ...

    def floor(self, req: ParsedRequest) -> int:
        """A lower bound of `count`, from the lengths of the prompt's texts
        alone (O(messages)): a prompt over the limits even at this bound is
        refused before it is rendered, hashed or counted."""
        ...

    def count_now(
        self, req: ParsedRequest, replicas: Sequence[Replica], model: str | None = None
    ) -> Soon[TokenCount]:
        """The count, when it needs no round trip (an estimate, a cached count);
        else a `Later` that gets it (`gateway.request.later`: a coroutine per
        request would cost every request, and most need none)."""
        ...


class EstimateCounter:
    def __init__(self, cache: LRU | None = None) -> None:
        self._cache = cache

    async def count(
        self, req: ParsedRequest, replicas: Sequence[Replica], model: str | None = None
    ) -> TokenCount:
        counted = self.count_now(req, replicas, model)
        return await counted if isinstance(counted, Later) else counted

    def count_now(
        self, req: ParsedRequest, replicas: Sequence[Replica], model: str | None = None
    ) -> Soon[TokenCount]:
        if req.size >= OFFLOAD_BYTES:
            return Later(self._count_off_loop(req))
        return TokenCount(estimate_request(req, self._cache), "estimate")

    def floor(self, req: ParsedRequest) -> int:
        """Exact for this counter: every piece costs at least a token per 4 characters."""
        return -(-text_chars(req) // ESTIMATE_CHARS_PER_TOKEN) + template_overhead(req)

    async def _count_off_loop(self, req: ParsedRequest) -> TokenCount:
        cache = self._cache
        cached = cache._data if cache is not None else None
        tokens, missed = await asyncio.to_thread(estimate_off_loop, req, cached)
        if cache is not None:
            for key, cost in missed:
                cache.put(key, cost)
        return TokenCount(tokens, "estimate")


def prompt_key(req: ParsedRequest) -> str:
    body = req.body
    canon = {
        k: body.get(k) for k in ("model", "messages", "prompt", "tools", "chat_template_kwargs")
    }
    data = json.dumps(canon, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return xxhash.xxh3_128_hexdigest(data.encode())


class LRU:
    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[str | int, int] = OrderedDict()

    def get(self, key: str | int) -> int | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: str | int, value: int) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self._size:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


class EngineCounter:
    """Counts with a healthy replica's own tokenizer and chat template. A large
    request's cache key, payload and answer are built and parsed in a worker
    thread, and its fallback estimate too."""

    def __init__(
        self,
        client: UpstreamClient,
        cfg: TokensConfig,
        parts: LRU | None = None,
        bytes_per_token: int = 512,
    ) -> None:
        self._client = client
        self._timeout = cfg.engine_timeout_s
        self.cache = LRU(cfg.cache_entries)
        self._parts = parts
        self._estimate = EstimateCounter(parts)
        self._bytes_per_token = bytes_per_token

    def floor(self, req: ParsedRequest) -> int:
        """No token covers more than `limits.max_bytes_per_token` bytes, so no
        more characters; the chat template is assumed to render the text of
        every message but the assistant's in full (nothing of it is counted)."""
        return -(-text_chars(req, assistant=False) // self._bytes_per_token)

    def count_now(
        self, req: ParsedRequest, replicas: Sequence[Replica], model: str | None = None
    ) -> Soon[TokenCount]:
        if req.size >= OFFLOAD_BYTES:
            return Later(self._count_large(req, replicas, model))
        key = prompt_key(req)
        cached = self.cache.get(key)
        if cached is not None:
            return TokenCount(cached, "cache")
        replica = _tokenizing(replicas)
        if replica is None:
            return TokenCount(estimate_request(req, self._parts), "fallback")
        return Later(self._count_remote(req, key, replica, model))

    async def count(
        self, req: ParsedRequest, replicas: Sequence[Replica], model: str | None = None
    ) -> TokenCount:
        counted = self.count_now(req, replicas, model)
        return await counted if isinstance(counted, Later) else counted

    async def _count_large(
        self, req: ParsedRequest, replicas: Sequence[Replica], model: str | None
    ) -> TokenCount:
        key = await asyncio.to_thread(prompt_key, req)
        cached = self.cache.get(key)
        if cached is not None:
            return TokenCount(cached, "cache")
        replica = _tokenizing(replicas)
        if replica is None:
            return await self._estimate_fallback(req)
        return await self._count_remote(req, key, replica, model)

    async def _estimate_fallback(self, req: ParsedRequest) -> TokenCount:
        counted = await self._estimate.count(req, ())
        return TokenCount(counted.tokens, "fallback")

    async def _count_remote(
        self, req: ParsedRequest, key: str, replica: Replica, model: str | None
    ) -> TokenCount:
        try:
            tokens = await self._ask(replica, req, model)
        except (GatewayError, ValueError, KeyError, TypeError) as exc:
            log.warning("tokenize on %s failed, using the estimate: %s", replica.name, exc)
            return await self._estimate_fallback(req)
        self.cache.put(key, tokens)
        return TokenCount(tokens, "engine")

    async def _ask(self, replica: Replica, req: ParsedRequest, model: str | None) -> int:
        large = req.size >= OFFLOAD_BYTES

        async def post(path: str, payload: dict[str, Any]) -> Any:
            return await self._post(replica, path, payload, large)

        return await replica.engine.count_tokens(post, req.endpoint, req.body, model or req.model)

    async def _post(self, replica: Replica, path: str, payload: dict[str, Any], large: bool) -> Any:
        data = await asyncio.to_thread(_dumps, payload) if large else _dumps(payload)
        resp = await self._client.post_json_small(
            replica.url + path, data, self._timeout, replica.auth_headers()
        )
        if resp.status != 200:
            raise ValueError(f"{path} answered HTTP {resp.status}")
        if len(resp.body) >= OFFLOAD_BYTES:  # a token list: up to 8 MiB (the client's cap)
            return await asyncio.to_thread(json.loads, resp.body)
        return json.loads(resp.body)


def _tokenizing(replicas: Sequence[Replica]) -> Replica | None:
    return next((r for r in replicas if r.engine.counts_tokens), None)


def _dumps(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False).encode()


class LocalTokenizerCounter:
    """`tokens: tokenizer`: a local Hugging Face `tokenizer.json` (optional extra)."""

    def __init__(self, path: str, bytes_per_token: int = 512) -> None:
        self._bytes_per_token = bytes_per_token
        try:
            from tokenizers import Tokenizer  # type: ignore[import-not-found, unused-ignore]
        except ImportError as exc:
            raise ImportError(
                "policy `tokens: tokenizer` needs the optional `tokenizers` package: "
                "pip install 'llm-admission-gateway[tokenizer]' (or use tokens: engine / estimate)"
            ) from exc
        self._tok = Tokenizer.from_file(path)

    async def count(
        self, req: ParsedRequest, replicas: Sequence[Replica], model: str | None = None
    ) -> TokenCount:
        counted = self.count_now(req, replicas, model)
        return await counted if isinstance(counted, Later) else counted

    def floor(self, req: ParsedRequest) -> int:
        return -(-text_chars(req) // self._bytes_per_token) + template_overhead(req)

    def count_now(
        self, req: ParsedRequest, replicas: Sequence[Replica], model: str | None = None
    ) -> Soon[TokenCount]:
        if req.size >= OFFLOAD_BYTES:
            return Later(asyncio.to_thread(self._count, req))
        return self._count(req)

    def _count(self, req: ParsedRequest) -> TokenCount:
        # No chat template here: the text is counted exactly, the template overhead estimated.
        n = sum(len(self._tok.encode(part).ids) for part in prompt_parts(req))
        return TokenCount(n + template_overhead(req), "tokenizer")
