"""The ASGI surface the lean server offers an app, beyond ASGI 3 itself.

Type aliases for the app interface; `DISCONNECT_EXTENSION`, the scope
extension `watch(callback) -> unwatch` that calls `callback()` once when the
client goes away; and `ClientDisconnected`, what `send()` raises once the
client is gone (ASGI 2.4: an `OSError`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

__all__ = [
    "DISCONNECT_EXTENSION",
    "ASGIApp",
    "ClientDisconnected",
    "Message",
    "Receive",
    "Scope",
    "Send",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DISCONNECT_EXTENSION: Final = "gateway.disconnect_watch"


class ClientDisconnected(OSError):
    """`send()` on a connection the client closed (ASGI 2.4: a subclass of OSError)."""
