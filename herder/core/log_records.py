"""Log records as one JSON object a line (`--log-format json`), for a log shipper.

Each line has `ts`, `level`, `logger`, `message`, and `event` where the line is one of
the dispatcher's events that log alerts watch (`dispatch_cycle`, `dispatch_scheduled`,
`spawn_ok`, `spawn_oom`, `spawn_ram_contention`, `dispatch_failed`, ...) or of herder's own
(`server_listening`, `host_down`, `host_back`): the log call passes it and its fields with
`extra={"event": ..., ...}`. Those fields are ids, labels and counts, never secrets; the
message is the same text the plain format prints."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}
"""A record's own attributes; anything else on it came from `extra`."""


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event": getattr(record, "event", None),
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in line:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
