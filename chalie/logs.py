"""Structured logging: one JSON object a line (ts, level, logger, msg, extras), secrets redacted.

The daemon calls :func:`configure` once at start. Extra fields come from
``log.info("...", extra={...})``. A field whose name looks like a secret
(token, password, authorization, ...) is written as ``"[redacted]"``, at any
depth, and a bearer token inside a message text is masked too, so a careless
log call cannot leak a credential into the log file.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
from collections.abc import Mapping
from typing import Any, Final, TextIO

REDACTED: Final = "[redacted]"
_SECRET_KEY: Final = re.compile(
    r"(token|secret|passw(or)?d|passwd|authori[sz]ation|api[_-]?key|cookie|credential|private[_-]?key)",
    re.IGNORECASE,
)
_SECRET_TEXT: Final = re.compile(
    r"(?i)\b(bearer|token|password|api[_-]?key|secret)(\s*[:=]?\s+|\s*[:=]\s*)(\S+)"
)
# Everything a bare LogRecord carries; any other attribute came from ``extra``.
_RECORD_FIELDS: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
_MAX_DEPTH: Final = 6


def redact(key: str, value: Any, depth: int = 0) -> Any:
    """The value as it may be logged: secret-named keys masked, recursively."""
    if _SECRET_KEY.search(key):
        return REDACTED
    if depth >= _MAX_DEPTH:
        return repr(value)[:200]
    if isinstance(value, Mapping):
        return {str(k): redact(str(k), v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact("", v, depth + 1) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


def mask_text(text: str) -> str:
    """Mask ``Bearer abc``, ``token=abc`` and the like inside free text."""
    return _SECRET_TEXT.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        ts = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": mask_text(record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key in _RECORD_FIELDS or key.startswith("_") or key in out:
                continue
            out[key] = redact(key, value)
        if record.exc_info:
            out["exc"] = mask_text(self.formatException(record.exc_info))
        # default=repr: a field that is not JSON must never drop the line.
        return json.dumps(out, default=repr, ensure_ascii=False, separators=(",", ":"))


def configure(level: int = logging.INFO, stream: TextIO | None = None) -> logging.Handler:
    """Send every log record to ``stream`` (stderr) as JSON lines; replaces root handlers."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
