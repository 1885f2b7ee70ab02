"""The stages' one calling convention: synchronous, with an explicit slow path.

A stage step (`Ingress.process`, `PolicyStage.apply`) and a token count
(`TokenCounter.count_now`) finish inline for most requests, with no coroutine
and no task: a coroutine per request would cost every request. When one must
wait (a large body parsed in a worker thread, an engine `/tokenize` round
trip), it says so by its type: it returns a `Later` wrapping what to await.

    Step       None (done) or Later[None]
    Soon[T]    T (the value now) or Later[T]

The caller awaits a `Later` (it is awaitable) and takes anything else as the
result: `value = await soon if isinstance(soon, Later) else soon`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from typing import Any, Generic, TypeAlias, TypeVar, final

T = TypeVar("T")


@final
class Later(Generic[T]):
    """A result not ready yet: await it (once)."""

    __slots__ = ("_pending",)

    def __init__(self, pending: Awaitable[T]) -> None:
        self._pending = pending

    def __await__(self) -> Generator[Any, None, T]:
        return self._pending.__await__()


#: A stage step: done (None) or still to await.
Step: TypeAlias = "Later[None] | None"
#: A value now, or one still to await.
Soon: TypeAlias = "T | Later[T]"
