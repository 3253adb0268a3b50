"""How ``pymq-server`` writes its log: readable lines (``log_format: text``, the default) or one JSON
object per line (``log_format: json``) for log collectors.

A JSON line has ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``message``, and
``exc`` when an exception is attached; values passed with ``extra=`` that JSON can carry are kept as
their own keys.  Every line is a complete object — a message with newlines or quotes is escaped by
``json.dumps``, never split — so a collector never sees half a record.  (A few lines of the standard
library; a JSON-logging dependency would not buy more.)
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# attributes every LogRecord has; anything else on a record came from ``extra=``
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out and isinstance(value, (str, int, float, bool, type(None))):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: str, log_format: str = "text", stream=None) -> None:
    """Send every ``pymq.*`` (and library) record to ``stream`` (stderr) in ``log_format``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


def announce(message: str, log_format: str) -> None:
    """A line for whoever started the broker (``pymq-server listening on ...``): plain text, or a JSON
    record in json mode so that every line on stderr stays parseable."""
    if log_format == "json":
        logging.getLogger("pymq.server").info(message)
    else:
        print(message, file=sys.stderr, flush=True)
