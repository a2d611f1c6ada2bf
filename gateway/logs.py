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

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "ClientErrorFilter",
    "JsonFormatter",
    "Throttle",
    "setup_logging",
]

LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Throttle:
    """At most one log line a second for each key (a bounded set: route and code, never
    a lock name); says how many it held back."""

    __slots__ = ("_seen", "interval")

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def passes(self, key: tuple[str, str], now: float | None = None) -> int | None:
        """None: hold this line back; else log it, with the count held back before it."""
        now = time.monotonic() if now is None else now
        last, held = self._seen.get(key, (float("-inf"), 0))
        if now - last < self.interval:
            self._seen[key] = (last, held + 1)
            return None
        if len(self._seen) > 1000:
            self._seen.clear()
        self._seen[key] = (now, 0)
        return held


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


class ClientErrorFilter(logging.Filter):
    """Keeps requests that aiohttp's HTTP parser refused (4xx) out of the log above DEBUG.

    aiohttp answers a malformed request itself (a header above 8190 bytes, a bad
    request line or Content-Length: 400) and logs each at ERROR with a traceback:
    a client's mistake, not the gateway's, and one a client could repeat to fill
    the log. At ``log_level = "debug"`` it stays, as one DEBUG line.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError) or not 400 <= (exc.code or 0) < 500:
            return True
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.msg, record.args = f"{record.getMessage()}: {' '.join(str(exc).split())}", ()
        record.exc_info = record.exc_text = None
        return True


_CLIENT_ERRORS: Final = ClientErrorFilter()


def setup_logging(level: str, fmt: str) -> None:
    """Log records at ``level`` and above to stderr as ``fmt`` (replaces earlier set-up)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    server_log = logging.getLogger("aiohttp.server")
    server_log.removeFilter(_CLIENT_ERRORS)
    server_log.addFilter(_CLIENT_ERRORS)
