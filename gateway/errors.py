"""One error tree for the gateway, mapped to HTTP in one place.

    GatewayError                      (500 server_error)
     ├── BadRequest                   (400 invalid_request_error)
     │    ├── InvalidJSON
     │    ├── ContextLengthExceeded   (code context_length_exceeded)
     │    ├── InvalidDeadlineHeader   (code invalid_deadline_header)
     │    └── UnknownTask             (code unknown_task)
     ├── Unauthorized                 (401 authentication_error)
     ├── Forbidden                    (403 permission_error)
     ├── NotFound                     (404 not_found_error)
     │    └── HeadersTooLarge         (431 request_headers_too_large)
     ├── PayloadTooLarge              (413)
     ├── RateLimited                  (429 rate_limit_exceeded / session_budget_exceeded)
     ├── Overloaded                   (503 overloaded; queue full, shed early)
     ├── NoHealthyReplica             (503 no_healthy_replica)
     ├── StateUnavailable             (503 state_unavailable; shared state store down,
     │                                 `state.redis.on_failure: closed`)
     ├── ShuttingDown                 (503 shutting_down; SIGTERM: refused or ended
     │                                 after `listen.graceful_timeout_s`)
     ├── DeadlineExceeded             (504 deadline_exceeded)
     ├── UpstreamTimeout              (504 upstream_timeout: first byte / idle gap)
     ├── UpstreamError                (engine error, status kept, normalised body)
     └── UpstreamUnavailable          (502; never reached / connection failure)
          └── UpstreamNeverReached    (connect refused/timeout, 503 before body: retryable)
               └── UpstreamStaleConnection (pooled connection closed before the body was written)

Engine errors are translated at the adapter boundary (`gateway.engines`);
everything else raises one of these. This module is the only place that turns
them into bytes, all in the OpenAI shape `{"error": {"message", "type",
"param", "code"}}` with the headers of `error_headers`:

  error_bytes          status, raw ASGI headers and body (the pipeline's answers)
  error_response       a Starlette `Response` (Starlette handlers, the endpoint)
  sse_error_event      an SSE event, once a stream has started
  render_server_error  the lean HTTP server's own answers (`server_error`):
                       its `render_error`, wired where the listener is built
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

RawHeaders = list[tuple[bytes, bytes]]

#: The error `type`s of the OpenAI API: the only ones a client sees (the `code` says more:
#: `overloaded`, `deadline_exceeded`, `upstream_timeout`, ...). An engine's own type that is
#: not one of these is replaced by the type of its status (gateway/engines/base.py).
OPENAI_ERROR_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "rate_limit_error",
        "server_error",
    }
)


class GatewayError(Exception):
    status = 500
    type = "server_error"
    code: str | None = "internal_error"
    reason = "internal_error"
    #: Overrides the `x-should-retry` header the OpenAI SDKs obey (None: by status).
    should_retry: bool | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if reason is not None:
            self.reason = reason
        self.retry_after = retry_after


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"
    reason = "bad_request"


class UnsupportedTransferCoding(GatewayError):
    """A request body in a transfer coding the server does not implement (`gzip`)."""

    status = 501
    type = "invalid_request_error"
    code = "unsupported_transfer_coding"
    reason = "unsupported_transfer_coding"
    should_retry = False


class InvalidJSON(BadRequest):
    code = "invalid_json"
    reason = "invalid_json"


class InvalidDeadlineHeader(BadRequest):
    code = "invalid_deadline_header"
    reason = "invalid_deadline_header"


class ContextLengthExceeded(BadRequest):
    code = "context_length_exceeded"
    reason = "context_length_exceeded"


class UnknownTask(BadRequest):
    code = "unknown_task"
    reason = "unknown_task"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"
    reason = "unauthorized"


class Forbidden(GatewayError):
    status = 403
    type = "permission_error"
    code = "task_not_allowed"
    reason = "forbidden"


class NotFound(GatewayError):
    status = 404
    type = "not_found_error"
    code = "not_found"
    reason = "not_found"


class HeadersTooLarge(BadRequest):
    """The request line and headers exceed the HTTP server's limit."""

    status = 431
    code = "request_headers_too_large"
    reason = "headers_too_large"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"
    reason = "body_too_large"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"
    reason = "rate_limit"


class Overloaded(GatewayError):
    status = 503
    type = "server_error"
    code = "overloaded"
    reason = "overloaded"


class NoHealthyReplica(Overloaded):
    code = "no_healthy_replica"
    reason = "no_healthy_replica"


class StateUnavailable(GatewayError):
    """The shared state store (Redis) is down and `state.redis.on_failure` is
    `closed`: a request that needs shared state is refused at once rather than
    served with limits this instance alone enforces."""

    status = 503
    type = "server_error"
    code = "state_unavailable"
    reason = "state_unavailable"


class ShuttingDown(GatewayError):
    """The gateway is shutting down (SIGTERM/SIGINT): a new request is refused
    at once; one still running when `listen.graceful_timeout_s` ends is ended
    (an SSE error event once its stream has started). Another instance can
    serve it: the answer carries `Retry-After`."""

    status = 503
    type = "server_error"
    code = "shutting_down"
    reason = "shutting_down"


class DeadlineExceeded(GatewayError):
    status = 504
    type = "server_error"
    code = "deadline_exceeded"
    reason = "deadline_exceeded"


class UpstreamTimeout(GatewayError):
    """The engine did not answer within the first-byte or idle timeout."""

    status = 504
    type = "server_error"
    code = "upstream_timeout"
    reason = "upstream_timeout"


class UpstreamError(GatewayError):
    """An engine answered with an error; status kept, body normalised."""

    type = "server_error"
    code = None
    reason = "upstream_error"


class UpstreamUnavailable(GatewayError):
    status = 502
    type = "server_error"
    code = "upstream_unavailable"
    reason = "upstream_unavailable"


class UpstreamNeverReached(UpstreamUnavailable):
    """The attempt provably never reached an engine: safe to retry elsewhere."""

    code = "upstream_connect_failed"
    reason = "upstream_connect_failed"
    retry_same_replica = False


class UpstreamStaleConnection(UpstreamNeverReached):
    """A pooled keep-alive connection was already closed by the engine: the
    request body could not be written, so the engine never parsed it. The
    same replica may be tried again on a fresh connection."""

    code = "upstream_connection_closed"
    reason = "upstream_connection_closed"
    retry_same_replica = True


def error_body(err: GatewayError) -> dict[str, Any]:
    return {
        "error": {
            "message": err.message,
            "type": err.type,
            "param": err.param,
            "code": err.code,
        }
    }


def error_headers(err: GatewayError, request_id: str | None = None) -> dict[str, str]:
    headers = {"x-gateway-reject-reason": err.reason}
    if err.retry_after is not None:
        headers["retry-after"] = str(max(1, math.ceil(err.retry_after)))
        headers["retry-after-ms"] = str(max(1, int(err.retry_after * 1000)))
    if request_id:
        headers["x-request-id"] = request_id
    if err.should_retry is not None:
        headers["x-should-retry"] = "true" if err.should_retry else "false"
    elif 400 <= err.status < 500 and err.status not in (408, 409, 429):
        headers["x-should-retry"] = "false"
    return headers


def _encode(err: GatewayError) -> bytes:
    return json.dumps(error_body(err)).encode()


def _raw_headers(
    err: GatewayError, request_id: str | None, extra_headers: Mapping[str, str] | None
) -> RawHeaders:
    headers = error_headers(err, request_id)
    if extra_headers:
        headers.update(extra_headers)
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def error_bytes(
    err: GatewayError, request_id: str | None = None, extra_headers: Mapping[str, str] | None = None
) -> tuple[int, RawHeaders, bytes]:
    """Status, raw ASGI response headers (content type and length first, then
    `error_headers`, then `extra_headers`, which win) and the JSON body."""
    body = _encode(err)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += _raw_headers(err, request_id, extra_headers)
    return err.status, headers, body


def error_response(err: GatewayError, request_id: str | None = None) -> Response:
    return Response(
        _encode(err),
        status_code=err.status,
        headers=error_headers(err, request_id),
        media_type="application/json",
    )


def sse_error_event(err: GatewayError) -> bytes:
    """The event sent when an error happens after a stream has started."""
    return b"data: " + _encode(err) + b"\n\n"


_SERVER_ERRORS: dict[int, type[GatewayError]] = {
    400: BadRequest,
    404: NotFound,
    413: PayloadTooLarge,
    431: HeadersTooLarge,
    501: UnsupportedTransferCoding,
    503: Overloaded,
}


def server_error(status: int, message: str, code: str | None = None) -> GatewayError:
    """The error of an answer the HTTP server gives on its own (a malformed
    request, a head over its limit, an app that failed): the class its status
    maps to, with the server's `code` (None: the class's)."""
    cls = _SERVER_ERRORS.get(status) or (BadRequest if status < 500 else GatewayError)
    retry_after = 1.0 if status == 503 else None  # (a cancelled request: retry it)
    return cls(message, code=code, status=status, retry_after=retry_after)


def render_server_error(status: int, message: str, code: str | None) -> tuple[RawHeaders, bytes]:
    """The lean server's `render_error` (`gateway.http.responses.ErrorRenderer`):
    headers without the framing ones, which the server adds, and the body."""
    err = server_error(status, message, code)
    headers = [(b"content-type", b"application/json"), *_raw_headers(err, None, None)]
    return headers, _encode(err)
