"""`log_format`: text or one JSON object per line; the access line's fields;
no secret and no body in either format."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import pytest

from gateway.observability.logging import JsonFormatter, configure_logging, formatter
from gateway.sim.cluster import SimCluster
from tests.gwharness import running_gateway

PROMPT = "the vault combination is 31-41-59-26, keep it quiet"
CLIENT_KEY = "sk-client-key-do-not-log-8c1f"
ACCESS_FIELDS = {
    "id", "tenant", "task", "replica", "outcome", "reason", "status", "attempts", "stage",
    "queue_ms", "ttfb_ms", "total_ms", "prompt_tokens", "completion_tokens",
}  # fmt: skip


def test_json_formatter_writes_one_object_per_record() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("test.jsonfmt")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("two\nlines %s", "here", extra={"replica": "r1", "n": 3})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
        log.propagate = True
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == "two\nlines here" and first["level"] == "warning"
    assert first["logger"] == "test.jsonfmt" and first["replica"] == "r1" and first["n"] == 3
    assert first["ts"].endswith("+00:00")
    assert second["message"] == "failed" and "ValueError: boom" in second["exc"]


def test_configure_logging_replaces_the_root_handlers() -> None:
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    stream = io.StringIO()
    try:
        handler = configure_logging("warning", "json", stream)
        assert root.handlers == [handler] and root.level == logging.WARNING
        logging.getLogger("gateway.x").warning("hello")
        logging.getLogger("gateway.x").info("not shown")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)
    assert [json.loads(line)["message"] for line in stream.getvalue().splitlines()] == ["hello"]


@contextmanager
def _captured(fmt: Literal["text", "json"]) -> Iterator[io.StringIO]:
    """Every gateway record, formatted as `gateway serve` would, at DEBUG."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(fmt))
    log = logging.getLogger("gateway")
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_access_line_carries_its_fields_and_never_a_secret_or_the_body(
    fmt: Literal["text", "json"],
) -> None:
    with (
        SimCluster.start(1, speed=50) as sim,
        running_gateway(sim.urls, access_log=True, log_format=fmt) as gw,
        _captured(fmt) as out,
    ):
        client = gw.openai(api_key=CLIENT_KEY)
        resp = client.chat.completions.with_raw_response.create(
            model="sim-model",
            max_tokens=4,
            messages=[{"role": "user", "content": PROMPT}],
            extra_headers={"x-request-id": "req-json-1", "x-session-id": "sess-secret-77"},
        )
        assert resp.http_response.status_code == 200
        # The line is written when the request ends, just after its last byte left.
        deadline = time.monotonic() + 5.0
        while "req-json-1" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    text = out.getvalue()
    assert "req-json-1" in text  # the access line was captured
    for secret in (CLIENT_KEY, PROMPT, "31-41-59-26", "sess-secret-77", "Bearer"):
        assert secret not in text
    access = [line for line in text.splitlines() if "req-json-1" in line]
    assert len(access) == 1
    if fmt == "text":
        assert "id=req-json-1" in access[0] and "outcome=ok" in access[0]
        return
    lines = [json.loads(line) for line in text.splitlines()]  # every line is one object
    (record,) = [r for r in lines if r.get("id") == "req-json-1"]
    assert set(record) >= ACCESS_FIELDS
    assert record["logger"] == "gateway.access" and record["outcome"] == "ok"
    assert record["reason"] is None and record["status"] == 200
    assert record["replica"] == sim.urls[0].split("//", 1)[1]
    assert record["prompt_tokens"] > 0 and record["completion_tokens"] == 4
    assert record["total_ms"] >= record["ttfb_ms"] >= record["queue_ms"] >= 0
