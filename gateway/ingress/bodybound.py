"""Huge bodies: refused before parsing when their task's input limit cannot
take them, and their memory given back afterwards.

A token covers at most `limits.max_bytes_per_token` UTF-8 bytes of text, and
JSON spends at least one byte per byte of text except in escapes (`\\uXXXX`:
six bytes for at least one). So a body of `B` bytes with `E` backslashes holds
at least `B - 5 E - S` bytes of text, where `S` bounds what is not prompt
text (the JSON of every message and content part, and the other fields):
when that is over `max_input_tokens × max_bytes_per_token`, the input is over
the limit, whatever the tokenizer. The task is the one the `X-Task` header
names; without the header, the tenant's default task or the default policy,
unless the body may name a model alias whose task's limit could take it (its
name appears in the body, or could be hidden in `\\u` escapes). A policy
without an input limit bounds nothing. The scans run in the worker thread
that parses large bodies, a window at a time.

Parsing a 30 MB body of tiny messages builds ~1 M Python objects (several
hundred MB); glibc keeps most of that heap after it is freed. After large
bodies the process calls `malloc_trim(0)` (glibc only; elsewhere nothing)
for a few seconds, while their requests end.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import re
from collections.abc import Callable, Iterator, Mapping

from gateway.config.schema import GatewayConfig
from gateway.errors import ContextLengthExceeded
from gateway.policies.policyset import Policy, PolicySet

log = logging.getLogger(__name__)

#: What is not prompt text, per message and per content part (`{"role":"user",
#: "content":""},` is 30 bytes), and for the other fields of a body together.
STRUCTURE_BYTES_PER_ITEM = 64
OTHER_FIELDS_BYTES = 1024 * 1024
WINDOW = 1024 * 1024
#: Model names JSON can spell other than plainly only with `\\u` escapes.
_PLAIN_ALIAS = re.compile(r"^[A-Za-z0-9._:@+-]+$")
#: How long after a large body the heap is trimmed, and how often again, for how long.
TRIM_DELAY_S = 1.0
TRIM_FOR_S = 10.0


def _windows(raw: bytes, overlap: int) -> Iterator[tuple[int, int]]:
    """`WINDOW`-byte spans of `raw`, each reaching `overlap` bytes into the next:
    a search per span holds the GIL ~1-4 ms, not ~40-120 ms for 30 MB at once,
    so the event loop runs in between while a worker thread scans."""
    for start in range(0, len(raw), WINDOW):
        yield start, min(len(raw), start + WINDOW + overlap)


def _count(raw: bytes, pattern: bytes) -> int:
    return sum(raw.count(pattern, a, b) for a, b in _windows(raw, len(pattern) - 1))


def _contains(raw: bytes, pattern: bytes) -> bool:
    return any(raw.find(pattern, a, b) >= 0 for a, b in _windows(raw, len(pattern) - 1))


def _bound(cfg: GatewayConfig, policy: Policy) -> int | None:
    """The most body bytes `policy`'s input limit could need (None: no limit)."""
    tokens = policy.limits.max_input_tokens
    if tokens is None:
        return None
    items = cfg.limits.max_messages + cfg.limits.max_content_parts
    structure = STRUCTURE_BYTES_PER_ITEM * items + OTHER_FIELDS_BYTES
    return tokens * cfg.limits.max_bytes_per_token + structure


def _maybe_model(raw: bytes, alias: str) -> bool:
    """Whether the body could name model `alias`: written plainly, or (when
    it holds any `\\u` escape, or the alias has a character JSON may escape
    otherwise) perhaps in escapes."""
    if not _PLAIN_ALIAS.match(alias) or _contains(raw, b"\\u"):
        return True
    return _contains(raw, b'"' + alias.encode() + b'"')


def check_body(
    cfg: GatewayConfig,
    policies: PolicySet,
    headers: Mapping[str, str],
    default_task: str | None,
    raw: bytes,
    endpoint: str,
) -> None:
    """Raise ContextLengthExceeded when `raw` holds more text than the input
    limit of every task it may resolve to can take (the module docstring);
    run in a worker thread: the scans hold the GIL a window at a time."""
    header = (headers.get("x-task") or "").strip()
    if header:
        policy = policies.by_task.get(header)
        if policy is None:  # an unknown task: the policy stage answers
            return
    else:
        policy = (policies.get(default_task) if default_task else None) or policies.default
    bound = _bound(cfg, policy)
    if bound is None or len(raw) <= bound:
        return
    if not header:  # a model alias would select its own policy
        for alias, other in policies.by_alias.items():
            other_bound = _bound(cfg, other)
            if (other_bound is None or other_bound >= len(raw)) and _maybe_model(raw, alias):
                return
    if len(raw) - 5 * _count(raw, b"\\") <= bound:  # text bytes, at least
        return
    param = "messages" if endpoint == "chat" else "prompt"
    raise ContextLengthExceeded(
        f"The request body is {len(raw)} bytes, more than the input limit of task "
        f"'{policy.name}' ({policy.limits.max_input_tokens} tokens, at most "
        f"{cfg.limits.max_bytes_per_token} bytes each) can take. Please reduce the length of "
        f"the {param}.",
        param=param,
    )


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's `malloc_trim(0)`, or None where there is none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class HeapTrimmer:
    """Gives freed heap memory back to the OS after large bodies: `TRIM_DELAY_S`
    after one arrives, then every `TRIM_DELAY_S` while large bodies keep
    arriving and for `TRIM_FOR_S` after the last (their requests may run that
    long), never more often (coalesced)."""

    def __init__(self, delay_s: float = TRIM_DELAY_S, for_s: float = TRIM_FOR_S) -> None:
        self._trim = _malloc_trim()
        self._delay, self._for = delay_s, for_s
        self._last = 0.0
        self._pending: asyncio.TimerHandle | None = None
        self.trims = 0

    @property
    def available(self) -> bool:
        return self._trim is not None

    def soon(self) -> None:
        if self._trim is None:
            return
        loop = asyncio.get_running_loop()
        self._last = loop.time()
        if self._pending is None:
            self._pending = loop.call_later(self._delay, self._run, loop)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        self._pending = None
        if self._trim is not None:
            self._trim()
            self.trims += 1
        if loop.time() - self._last < self._for:
            self._pending = loop.call_later(self._delay, self._run, loop)

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
