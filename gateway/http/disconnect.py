"""`ClientDisconnected`: what the lean server's `send()` raises once the client is gone.

ASGI 2.4 says such a send raises an `OSError`. Kept out of the compiled
request-path modules (`setup.py`): mypyc cannot compile a subclass of a
builtin exception other than `Exception`.
"""

from __future__ import annotations


class ClientDisconnected(OSError):
    """`send()` on a connection the client closed (ASGI 2.4: a subclass of OSError)."""
