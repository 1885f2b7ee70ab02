from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gateway.forward.sse import SSERelay, usage_from_body

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
USAGE_ONLY = (
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def test_complete_events_pass_through_unchanged() -> None:
    relay = SSERelay(drop_usage_only_chunk=False)
    assert relay.feed(CHUNK + CHUNK) == CHUNK + CHUNK
    assert relay.feed(USAGE_ONLY + DONE) == USAGE_ONLY + DONE
    assert relay.usage == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert relay.saw_done


def test_partial_event_waits_for_its_end_only() -> None:
    relay = SSERelay(drop_usage_only_chunk=False)
    assert relay.feed(CHUNK + CHUNK[:10]) == CHUNK
    assert relay.feed(CHUNK[10:]) == CHUNK


def test_injected_usage_chunk_is_dropped_but_read() -> None:
    relay = SSERelay(drop_usage_only_chunk=True)
    out = relay.feed(CHUNK + USAGE_ONLY + DONE)
    assert out == CHUNK + DONE
    assert relay.usage is not None and relay.usage["total_tokens"] == 5


def test_usage_on_a_content_chunk_is_never_dropped() -> None:
    relay = SSERelay(drop_usage_only_chunk=True)
    event = b'data: {"choices":[{"index":0,"delta":{}}],"usage":{"total_tokens":1}}\n\n'
    assert relay.feed(event) == event


def test_error_event_is_recorded() -> None:
    relay = SSERelay(drop_usage_only_chunk=False)
    event = b'data: {"error":{"message":"boom","code":500}}\n\n'
    assert relay.feed(event) == event
    assert relay.error == {"message": "boom", "code": 500}


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
def test_any_split_of_the_stream_yields_the_same_bytes(cuts: list[int]) -> None:
    stream = CHUNK * 3 + USAGE_ONLY + DONE
    relay = SSERelay(drop_usage_only_chunk=False)
    out, pos = b"", 0
    for n in cuts:
        out += relay.feed(stream[pos : pos + n])
        pos += n
    out += relay.feed(stream[pos:]) + relay.flush()
    assert out == stream
    assert relay.usage is not None


def test_usage_from_non_streaming_body() -> None:
    body = json.dumps({"choices": [], "usage": {"prompt_tokens": 1}}).encode()
    assert usage_from_body(body) == {"prompt_tokens": 1}
    assert usage_from_body(b'not json with "usage"') is None


def test_usage_from_body_ignores_nested_and_escaped_mentions() -> None:
    body = json.dumps(
        {
            "choices": [{"message": {"content": 'say "usage": {"x": 1}'}}],
            "usage": {"prompt_tokens": 4, "total_tokens": 9},
            "extra": {"usage": "not this"},
        }
    ).encode()
    assert usage_from_body(body) == {"prompt_tokens": 4, "total_tokens": 9}
    spaced = b'{"usage" :  {"prompt_tokens": 2, "total_tokens": 3}}'
    assert usage_from_body(spaced) == {"prompt_tokens": 2, "total_tokens": 3}


def test_usage_is_counts_checked_at_the_boundary() -> None:
    from gateway.forward.forwarder import _usage
    from gateway.request.context import Usage

    raw = {"prompt_tokens": 3, "completion_tokens": True, "total_tokens": -1}
    assert Usage.of(raw, 2) == Usage(3, None, None, 2)
    details = {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}}
    found = _usage(details, None)
    assert found is not None and (found.prompt_tokens, found.cached_tokens) == (9, 4)
    assert _usage(None, None) is None
