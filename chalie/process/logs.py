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
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TextIO

REDACTED: Final = "[redacted]"
_SECRET_KEY: Final = re.compile(
    r"(token|secret|passw(or)?d|passwd|authori[sz]ation|api[_-]?key|cookie|credential|private[_-]?key)",
    re.IGNORECASE,
)
# Secrets inside free text, by shape, never by a neighbouring ordinary word: a bearer
# credential ("Bearer <b64token>"), a ``name=value`` / ``name: value`` pair whose name is
# a secret's, and raw credentials by their prefix (Chalie's own tokens, OpenAI-style keys).
_SECRET_TEXT: Final = re.compile(
    r"(?i)\b(bearer)(\s+)([A-Za-z0-9\-._~+/]{8,}=*)"
    r"|\b(token|password|passwd|api[_-]?key|secret)(\s*[:=]\s*)(\S+)"
)
_CREDENTIAL_SHAPE: Final = re.compile(r"\b(?:chalie_|sk-)[A-Za-z0-9_\-]{16,}")
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
    """Mask ``Bearer <token>``, ``token=abc``, a raw ``chalie_…`` token and the like in text.

    Ordinary words stay: "no chat token existed: one was created" is logged as written.
    """

    def masked(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            value = m.group(3)
            if value.isalpha() and len(value) < 20:
                return m.group(0)  # "bearer certificates": a word, not a credential
            return f"{m.group(1)}{m.group(2)}{REDACTED}"
        return f"{m.group(4)}{m.group(5)}{REDACTED}"

    return _CREDENTIAL_SHAPE.sub(REDACTED, _SECRET_TEXT.sub(masked, text))


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


# Third-party loggers that say too much at info.
QUIET_LOGGERS: Final = ("mcp.server.streamable_http_manager",)


def configure(level: int = logging.INFO, stream: TextIO | None = None) -> logging.Handler:
    """Send every log record to ``stream`` (stderr) as JSON lines; replaces root handlers."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # The MCP SDK logs every session id at info; an id is the session's handle (the gate
    # binds it to its token, but it is still not for the log): its warnings only.
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    return handler


class Throttle(logging.Filter):
    """For a logger a remote peer can make talk: one line a record (no traceback) and at
    most ``burst`` records per ``window`` seconds; the rest are dropped and counted, and
    the next record that passes says how many were.

    A stdio MCP server that prints junk on its stdout makes the SDK log an error with a
    traceback per line: without this, a chatty or hostile server fills the daemon's log.
    """

    def __init__(
        self,
        burst: int = 20,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._burst = burst
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._start = clock()
        self._passed = 0
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            now = self._clock()
            if now - self._start >= self._window:
                self._start, self._passed = now, 0
            if self._passed >= self._burst:
                self._dropped += 1
                return False
            self._passed += 1
            dropped, self._dropped = self._dropped, 0
        if record.exc_info or dropped:
            try:
                text = record.getMessage()
            except Exception:  # a bad format in the library's call: never raise into it
                text = str(record.msg)
            if record.exc_info:
                text += f" ({type(record.exc_info[1]).__name__})"
                record.exc_info = None
                record.exc_text = None
            if dropped:
                text += f" ({dropped} similar records dropped)"
            record.msg, record.args = text, None
        return True
