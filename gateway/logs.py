"""Log set-up for ``fencegate serve``: ``log_level`` and ``log_format = "text" | "json"``.

JSON lines are one object per line: ``time`` (UTC, ISO 8601 with milliseconds),
``level``, ``logger``, ``message``, and ``exception`` when a traceback is attached.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Final

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "JsonFormatter", "setup_logging"]

LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, object] = {
            "time": f"{seconds}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def setup_logging(level: str, fmt: str) -> None:
    """Log records at ``level`` and above to stderr as ``fmt`` (replaces earlier set-up)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
