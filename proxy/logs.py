"""Logging set-up for every command: `--log-level` and `--log-format text|json`.

Theory of operation: one handler on the root logger, writing to stderr, set up once
by `proxy.cli.main` before a command runs. `text` is for people (`TIME LEVEL logger:
message`); `json` is for log shippers (Fluent Bit, Vector, Promtail...): one JSON
object per line, with `time` (RFC 3339, UTC, milliseconds), `level`, `logger`,
`message`, `exception` when there is one, and every field a caller passed with
`log.info(..., extra={...})`, so structured lines (the access log) keep their fields
as fields instead of text to re-parse. Multi-line tracebacks stay inside one object.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def add_arguments(parser: argparse.ArgumentParser, default_level: str = "info") -> None:
    group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-level",
        default=default_level,
        choices=LEVELS,
        help=f"least severe log lines written to stderr (default: {default_level})",
    )
    group.add_argument(
        "--log-format",
        default="text",
        choices=FORMATS,
        help="text: one readable line per event; json: one JSON object per line, for log shippers (default: text)",
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": _rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, default=repr, ensure_ascii=False)


def _rfc3339(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


_format = "text"


def current_format() -> str:
    """The --log-format in force: the access log writes its fields in the message (text) or as fields (json)."""
    return _format


def configure(level: str = "info", fmt: str = "text", stream=None) -> logging.Handler:
    """Replace the root logger's handlers with one writing `fmt` at `level` to `stream` (stderr)."""
    global _format
    _format = fmt
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health check is noise
    return handler
