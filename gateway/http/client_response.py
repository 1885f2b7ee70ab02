"""A response of the client (`gateway.http.client.Pool.request`): its head,
then its body read as it arrives, then the connection given back."""

from __future__ import annotations

from gateway.http.client_conn import Conn


class Response:
    """A response whose head has arrived; read with `read_chunk`, then `release`."""

    __slots__ = ("_conn", "headers", "status")

    def __init__(self, conn: Conn) -> None:
        self.status = conn.status
        self.headers = conn.headers
        self._conn: Conn | None = conn

    def header(self, name: bytes) -> str | None:
        """The first value of header `name` (lowercase), decoded as latin-1."""
        for key, value in self.headers:
            if key.lower() == name:
                return value.decode("latin-1")
        return None

    def complete_body(self) -> bytes | None:
        """The rest of the body when all of it has arrived (then reading is over),
        else None and nothing is consumed."""
        c = self._conn
        if c is None or not c.body_done or c.error is not None:
            return None
        return self._take(c) if c.buf else b""

    async def read_chunk(self) -> bytes:
        """The next bytes as they arrive; b"" at end of body (or after release)."""
        c = self._conn
        if c is None:
            return b""
        if not c.buf:
            if c.body_done:
                return b""
            if c.error is None:
                waiter = c.waiter = c.loop.create_future()
                try:
                    await waiter
                finally:
                    c.waiter = None
            if not c.buf:
                if c.error is not None:
                    raise c.error
                return b""
        return self._take(c)

    @staticmethod
    def _take(c: Conn) -> bytes:
        buf = c.buf
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        c.buffered = 0
        if c.paused:
            c.paused = False
            if not c.dead and c.transport is not None:
                c.transport.resume_reading()
        return data

    def release(self, reuse: bool = True) -> None:
        """Back to the pool if `reuse` and the exchange ended cleanly; else
        close the connection at once (how an engine learns to abort)."""
        c, self._conn = self._conn, None
        if c is not None:
            c.pool.release(c, reuse)
