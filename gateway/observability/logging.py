"""Log output, set up once by the CLI: `log_format: text` (one line per
record) or `json` (one JSON object per line for every record: `ts`, `level`,
`logger`, `message`, the record's structured fields, `exc` for a traceback).

Structured fields are what a call passes as `extra=` (the access line in
`gateway/pipeline/record.py` passes its fields that way); in text they are
already part of the message. No module logs request bodies, headers or
secrets; the tests check the access line in both formats.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

#: Attributes every `LogRecord` has: anything else came from `extra=`.
_STANDARD = frozenset(
    {
        *logging.LogRecord("", 0, "", 0, "", (), None).__dict__,
        "message",
        "asctime",
        "taskName",
        "color_message",  # uvicorn's copy of the message with terminal colours
    }
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def formatter(log_format: Literal["text", "json"]) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def configure_logging(
    level: str, log_format: Literal["text", "json"], stream: TextIO | None = None
) -> logging.Handler:
    """Send every record to `stream` (stderr) in `log_format`, replacing the
    root logger's handlers; returns the handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
