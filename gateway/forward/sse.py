"""Server-sent-event relay: forward complete events as they arrive, capture usage.

The relay never re-buffers: each upstream read is forwarded at once, except
for a trailing partial event, which waits for its end (at most one event).
`usage` is read from any event that carries it without changing the bytes,
except that the usage-only chunk the gateway itself asked for (when the
client did not request `stream_options.include_usage`) is dropped, so the
client receives exactly what it asked for.
"""

from __future__ import annotations

import json
from typing import Any

_USAGE = b'"usage"'


class SSERelay:
    __slots__ = ("_buf", "_drop_usage_only", "error", "events_seen", "saw_done", "usage")

    def __init__(self, drop_usage_only_chunk: bool) -> None:
        self._buf = b""
        self._drop_usage_only = drop_usage_only_chunk
        self.usage: dict[str, Any] | None = None
        self.events_seen = 0
        self.saw_done = False
        self.error: dict[str, Any] | None = None

    def feed(self, data: bytes) -> bytes:
        """Bytes to forward now for this upstream read."""
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return b""
        complete, self._buf = buf[: end + 2], buf[end + 2 :]
        self.events_seen += complete.count(b"\n\n")
        if b"[DONE]" in complete:
            self.saw_done = True
        if _USAGE in complete or b'"error"' in complete:
            return self._inspect(complete)
        return complete

    def flush(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest

    def _inspect(self, complete: bytes) -> bytes:
        """Parse only the events that mention usage or an error; keep the rest as is."""
        out: list[bytes] = []
        dropped = False
        for event in complete.split(b"\n\n"):
            if not event:
                continue
            if (_USAGE in event or b'"error"' in event) and not self._observe(event):
                dropped = True
                continue
            out.append(event)
        if not dropped:
            return complete
        return b"".join(e + b"\n\n" for e in out)

    def _observe(self, event: bytes) -> bool:
        """Record usage/errors from one event; False if it must be dropped."""
        payload = _data_payload(event)
        if payload is None:
            return True
        try:
            obj = json.loads(payload)
        except ValueError:
            return True
        if not isinstance(obj, dict):
            return True
        if isinstance(obj.get("error"), dict):
            self.error = obj["error"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            if self._drop_usage_only and obj.get("choices") == []:
                return False
        return True


def _data_payload(event: bytes) -> bytes | None:
    lines = [ln[5:].lstrip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(lines)


_DECODER = json.JSONDecoder()


def usage_from_body(body: bytes) -> dict[str, Any] | None:
    """`usage` of a non-streaming JSON response, without altering it.

    Engines put `usage` near the end; decode just that object instead of the
    whole (possibly large) body. The unescaped `"usage"` cannot occur inside a
    JSON string, so the last match is a key; if it is not the usage object
    (no token counts), parse the whole body instead."""
    pos = body.rfind(_USAGE)
    if pos < 0:
        return None
    try:
        rest = body[pos + len(_USAGE) :].decode("utf-8").lstrip()
        if rest[:1] == ":":
            rest = rest[1:].lstrip()
        value, _ = _DECODER.raw_decode(rest)
    except (ValueError, UnicodeDecodeError):
        value = None
    if isinstance(value, dict) and ("total_tokens" in value or "prompt_tokens" in value):
        return value
    value = _full_parse_usage(body)
    return value if isinstance(value, dict) else None


def _full_parse_usage(body: bytes) -> Any:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj.get("usage") if isinstance(obj, dict) else None
