"""Hypothesis fuzzing of the lean server over raw sockets.

Request heads and bodies are built from a grammar of valid and broken pieces
(methods, targets, versions, header names and values with CR / LF / NUL and
obs-fold, Content-Length / Transfer-Encoding combinations, chunk sizes and
extensions, pipelined requests, writes split anywhere), followed by a
well-formed `Connection: close` request so that a connection the server
still reads ends at once. For every example: the server never answers 5xx,
everything it sends parses as HTTP/1.1 responses (none cut short), a 4xx is
its last answer and the connection closes, it closes within its timeouts,
and a fresh connection still gets a normal answer. HEAD is left out: the
test's response parser cannot know a response carries no body.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway.http.serving import BackgroundServers, Listener, free_port
from tests.http.lifespan import run_lifespan
from tests.http.test_httpserver import ResponseReader, connect, request

# The server's timeouts, short so that a stalled example ends quickly.
HEAD_TIMEOUT, BODY_TIMEOUT, KEEPALIVE_TIMEOUT = 0.4, 0.25, 0.4
CLOSE_BOUND = 5.0  # generous: every example's connection is closed well within this
SENTINEL = b"GET /sentinel HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await run_lifespan(receive, send)
        return
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return
        size += len(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    body = json.dumps({"path": scope["path"], "size": size}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    p = free_port()
    listener = Listener(
        _app,
        "127.0.0.1",
        p,
        server="lean",
        head_timeout=HEAD_TIMEOUT,
        body_timeout=BODY_TIMEOUT,
        keepalive_timeout=KEEPALIVE_TIMEOUT,
    )
    with BackgroundServers([listener]):
        yield p


# --- the grammar ----------------------------------------------------------------------------------


def _mostly(valid: list[bytes], broken: list[bytes], size: int = 8) -> st.SearchStrategy[bytes]:
    """A valid piece ~92% of the time, else a broken one (listed, or random bytes)."""

    def pick(n: int) -> st.SearchStrategy[bytes]:
        if n < 92:
            return st.sampled_from(valid)
        if n < 97:
            return st.sampled_from(broken)
        return st.binary(max_size=size)

    return st.integers(0, 99).flatmap(pick)


_EOL = _mostly([b"\r\n"], [b"\n", b"\r", b"\r\r\n", b"\n\r"], 2)
_METHOD = _mostly(
    [b"GET", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH"],
    [b"CONNECT", b"PRI", b"get", b"G ET", b"", b"\x00GET", b"GET\t", b"POST\x7f"],
)
_TARGET = _mostly(
    [b"/", b"/v1/x?a=1&b=%20", b"/a%20b/%C3%A9", b"http://h/x?q", b"*", b"/a#frag"],
    [b"h:80", b"/%zz", b"", b"/ /", b"/\x00", b"/\xff", b"/" + b"a" * 70_000],
)
_VERSION = _mostly(
    [b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0"],
    [b"HTTP/2.0", b"HTTP/1.1 ", b"http/1.1", b"HTTP/1", b""],
)
_NAME = _mostly(
    [b"X-A", b"Accept", b"Content-Type", b"Connection", b"Expect", b"Upgrade", b"Host"],
    [
        b"Bad Name",
        b"",
        b"X\x00",
        b"Host ",
        b" Host",
        b"X:Y",
        b"Content-Length",
        b"Transfer-Encoding",
    ],
)
_VALUE = _mostly(
    [b"t", b"application/json", b"keep-alive", b"close", b"100-continue", b"websocket", b""],
    [b"chunked", b"gzip, chunked", b"a\r\nb", b"a\nb", b"a\x00b", b"99999999999999999999"]
    + [b" 5", b"5, 5", b"-1", b"upgrade", b"a" * 70_000],
)
_SEP = _mostly([b": ", b":"], [b" : ", b"", b":\t"])
_FOLD = _mostly([b""], [b"\r\n  folded", b"\r\n\tx", b"\r\n"])
_FRAMING = st.sampled_from(["length"] * 3 + ["chunked", "none", "random", "short"])


@st.composite
def _header(draw: st.DrawFn) -> bytes:
    return draw(_NAME) + draw(_SEP) + draw(_VALUE) + draw(_FOLD)


@st.composite
def _chunked(draw: st.DrawFn) -> bytes:
    out = b""
    for data in draw(st.lists(st.binary(min_size=1, max_size=24), max_size=3)):
        n = b"%x" % len(data)
        size = draw(_mostly([n, n + b";e=1"], [b"zz", b"-1", b"f" * 20, b"", b" 5"]))
        out += size + draw(_EOL) + data + draw(_EOL)
    return out + draw(_mostly([b"0\r\n\r\n", b"0\r\nT: x\r\n\r\n"], [b"", b"0\r\n", b"1\r\n"]))


@st.composite
def _request(draw: st.DrawFn) -> bytes:
    """A request line, headers (Host first, mostly) and a body framed (mostly) right."""
    eol = draw(_EOL)
    headers = draw(st.lists(_header(), max_size=3))
    if draw(st.integers(0, 9)) < 8:
        headers.insert(0, b"Host: t")
    framing = draw(_FRAMING)
    if framing == "chunked":
        headers.append(b"Transfer-Encoding: chunked")
        body = draw(_chunked())
    else:
        body = draw(st.binary(max_size=48))
        if framing == "length":
            headers.append(b"Content-Length: %d" % len(body))
        elif framing == "random":
            headers.append(b"Content-Length: " + draw(_VALUE))
        elif framing == "short":  # the body stalls: the server's body timeout ends it
            headers.append(b"Content-Length: %d" % (len(body) + len(SENTINEL) + 1000))
        elif body:  # none: no framing, so the bytes are the next request's
            body = draw(_METHOD) + body
    line = draw(_METHOD) + b" " + draw(_TARGET) + b" " + draw(_VERSION)
    return line + eol + b"".join(h + eol for h in headers) + eol + body


@st.composite
def _session(draw: st.DrawFn) -> list[bytes]:
    """What the client sends: pipelined requests, the sentinel, cut into 1-3 writes."""
    data = b"".join(draw(st.lists(_request(), min_size=1, max_size=3))) + SENTINEL
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=2)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


# --- the checks -----------------------------------------------------------------------------------


def _exchange(port: int, writes: list[bytes]) -> ResponseReader:
    with connect(port, timeout=CLOSE_BOUND) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = ResponseReader(s)
        for i, chunk in enumerate(writes):
            if i:
                time.sleep(0.005)
            try:
                s.sendall(chunk)
            except OSError:  # the server answered and closed already
                break
        start = time.monotonic()
        assert reader.wait_closed(CLOSE_BOUND), (
            f"not closed in {CLOSE_BOUND}s: {reader.raw[:300]!r}"
        )
        assert time.monotonic() - start < CLOSE_BOUND
    return reader


def _check_responses(reader: ResponseReader) -> None:
    current = reader._current  # noqa: SLF001 - the response being parsed at EOF, if any
    assert current is None or current.done, f"a response was cut short: {reader.raw[-300:]!r}"
    statuses = [r.status for r in reader.responses if r.status != 100]
    assert all(s < 500 for s in statuses), (statuses, reader.raw[:500])
    assert all(200 <= s < 500 for s in statuses), statuses
    errors = [i for i, s in enumerate(statuses) if s >= 400]
    if errors:  # a refusal is the last answer, with `connection: close` (and the socket closed)
        assert errors == [len(statuses) - 1], statuses
        assert reader.responses[-1].header("connection") == "close"


def _alive(port: int) -> None:
    with connect(port) as s:
        s.sendall(request("GET", "/alive"))
        (r,) = ResponseReader(s).read(1)
        assert r.status == 200 and r.json()["path"] == "/alive"


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(writes=_session())
def test_random_requests_never_get_a_5xx_or_a_malformed_answer(
    port: int, writes: list[bytes]
) -> None:
    reader = _exchange(port, writes)
    _check_responses(reader)
    event(
        f"answers: {sorted({r.status for r in reader.responses})}"
    )  # --hypothesis-show-statistics
    _alive(port)


def test_the_grammar_reaches_both_answers_and_refusals(port: int) -> None:
    """The fuzz test is only as good as its inputs: a well-formed pipeline is served whole,
    and a broken piece in the middle is refused after the answers before it."""
    good = request("POST", "/a", b"xyz") + request("GET", "/b")
    reader = _exchange(port, [good + SENTINEL])
    assert [r.status for r in reader.responses] == [200, 200, 200]
    reader = _exchange(port, [good + b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n" + SENTINEL])
    assert [r.status for r in reader.responses] == [200, 200, 400]
    _check_responses(reader)
