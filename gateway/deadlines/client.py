"""The client's deadline headers, parsed at ingress into monotonic instants.

- `X-Request-Deadline`: absolute, Unix seconds (`1767225600.25`) or RFC 3339
  (`2026-01-01T00:00:00Z`, an offset is required).
- `X-Request-Timeout`: relative seconds.
- `X-Stainless-Timeout` (openai-node) / `X-Stainless-Read-Timeout`
  (openai-python): the SDK's own client timeout (see `gateway.deadlines.deadline`
  for what it bounds).

Malformed headers are a 400 naming the header (`param`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Final

from gateway.errors import InvalidDeadlineHeader
from gateway.request.parsed import ClientDeadlines

Clock = Callable[[], float]

DEADLINE_HEADER: Final = "x-request-deadline"
TIMEOUT_HEADER: Final = "x-request-timeout"
CLIENT_TIMEOUT_HEADERS = ("x-stainless-timeout", "x-stainless-read-timeout")


_NO_CLIENT = ClientDeadlines()
_ALL_HEADERS = (DEADLINE_HEADER, TIMEOUT_HEADER, *CLIENT_TIMEOUT_HEADERS)


def parse_headers(
    headers: Mapping[str, str],
    received_at: float,
    wall: Clock = time.time,
    mono: Clock = time.monotonic,
) -> ClientDeadlines:
    """Parse the deadline headers of a request (raises `InvalidDeadlineHeader`)."""
    if not any(name in headers for name in _ALL_HEADERS):
        return _NO_CLIENT  # most requests: nothing to parse
    absolute = None
    raw = headers.get(DEADLINE_HEADER)
    if raw is not None:
        absolute = mono() + (_parse_instant(raw) - wall())
    relative = None
    raw = headers.get(TIMEOUT_HEADER)
    if raw is not None:
        relative = received_at + _parse_seconds(TIMEOUT_HEADER, raw)
    client = None
    for name in CLIENT_TIMEOUT_HEADERS:
        raw = headers.get(name)
        if raw is not None:
            value = _parse_seconds(name, raw)
            client = value if client is None else min(client, value)
    return ClientDeadlines(absolute, relative, client)


def _parse_instant(raw: str) -> float:
    text = raw.strip()
    try:
        value = float(text)
    except ValueError:
        value = _parse_rfc3339(text)
    if not math.isfinite(value) or value < 0:
        raise _bad(DEADLINE_HEADER, raw, "Unix seconds or an RFC 3339 timestamp with an offset")
    return value


def _parse_rfc3339(text: str) -> float:
    try:
        parsed = datetime.fromisoformat(text.upper())  # RFC 3339 allows "t" and "z"
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise _bad(DEADLINE_HEADER, text, "Unix seconds or an RFC 3339 timestamp with an offset")
    return parsed.timestamp()


def _parse_seconds(name: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise _bad(name, raw, "a positive number of seconds")
    return value


def _bad(name: str, raw: str, expected: str) -> InvalidDeadlineHeader:
    shown = raw if len(raw) <= 64 else raw[:64] + "..."
    canonical = "-".join(part.capitalize() for part in name.split("-"))
    return InvalidDeadlineHeader(
        f"Invalid {canonical} header {shown!r}: expected {expected}.", param=name
    )
