"""The ASGI app call of one exchange (`gateway.http.exchange`), in the
exchange's task: what happens when the app fails, returns early or is
cancelled before its response is complete."""

from __future__ import annotations

import asyncio
import logging

from gateway.http.asgi import ASGIApp
from gateway.http.exchange import Exchange
from gateway.http.responses import error_response

log = logging.getLogger("gateway.http.server")


async def run_app(exchange: Exchange, app: ASGIApp) -> None:
    """Call the app with the exchange's `receive` and `send` (the exchange's
    task, `HttpConnection`); an app that fails or is cancelled before its
    response is complete still leaves the connection answered or closed."""
    try:
        await app(exchange.scope, exchange.receive, exchange.send)
    except asyncio.CancelledError:
        if not exchange.complete:
            _cancelled(exchange)
        raise
    except Exception as exc:
        if exchange.disconnected:
            log.debug("ASGI app error after the client disconnected: %r", exc)
        else:
            log.error(
                "Exception in ASGI application (%s %s)",
                exchange.scope["method"],
                exchange.scope["path"],
                exc_info=exc,
            )
        _abandon(exchange)
    else:
        if not exchange.complete:
            if not exchange.disconnected:
                log.error(
                    "ASGI app returned without completing the response (%s %s)",
                    exchange.scope["method"],
                    exchange.scope["path"],
                )
            _abandon(exchange)
    finally:
        if exchange.task is not None:
            exchange.conn.state.tasks.discard(exchange.task)
            exchange.task = None
        # The disconnect extension is a bound method of this exchange, held by its
        # scope: without this, exchange → scope → extension → exchange is a cycle
        # (with the task, its context and the scope hanging off it) that only the
        # cyclic GC frees, ~15 objects per request.
        exchange.scope["extensions"] = {}


def _cancelled(exchange: Exchange) -> None:
    """The app's task was cancelled before its response was complete: unless
    the client is gone, it still gets an answer (a 503 to retry, if nothing
    went out yet) and the log says so."""
    if not exchange.disconnected:
        log.warning(
            "request cancelled before its response was complete (%s %s)%s",
            exchange.scope["method"],
            exchange.scope["path"],
            "" if exchange.head_sent else ": answered 503",
        )
    _abandon(exchange, 503, "The request was cancelled; retry it.", "request_cancelled")


def _abandon(
    exchange: Exchange,
    status: int = 500,
    message: str = "Internal server error",
    code: str = "internal_error",
) -> None:
    """The app ended without a complete response: a 500 if nothing went out, else close."""
    if exchange.complete:
        return
    exchange.complete = True
    exchange.keep_alive = False
    if exchange.body_flush is not None:
        exchange.body_flush.cancel()
        exchange.body_flush = None
    if not exchange.head_sent and not exchange.disconnected:
        exchange.head = None
        state = exchange.conn.state
        exchange.transport.write(
            error_response(state.render_error, status, message, code, state.date_line)
        )
    exchange.conn.response_done(exchange)
