"""The terminal's approval prompt: what a human sees when the gate asks, and reading the answer.

Every text in it comes from the model or the tool, so each is shown through
:func:`chalie.gate.display.one_line` (one line, control characters escaped,
capped). While it waits for the human, the prompt checks every
``check_every`` seconds whether the request is still pending, so an answer
given elsewhere (``chalie policy answer`` in another terminal) ends it.
"""

from __future__ import annotations

import io
import os
import select
import sys
import time
from collections.abc import Callable
from typing import Any, Final, TextIO

import click

from chalie.gate.display import ACT_SUMMARY_CHARS, NAME_CHARS, one_line, params_line, reach_line
from chalie.wire.messages import ANSWER_LETTERS

ANSWERS: Final = ANSWER_LETTERS
QUESTION: Final = "allow [o]nce, [a]lways, or [d]eny? "
MAX_LINE: Final = 4096


def render(request: dict[str, Any]) -> list[str]:
    """The lines shown above the question, each one line of bounded length."""
    permission = one_line(request.get("permission", "?"), NAME_CHARS)
    channel = one_line(request.get("channel", "?"), NAME_CHARS)
    lines = [f"permission requested: {permission} on {channel}"]
    if request.get("reach"):  # what leaves Chalie, first (email.send: to, subject, body)
        lines.append(f"  {reach_line(str(request['reach']))}")
    if request.get("provenance"):  # a remote MCP tool: which server, which remote tool
        lines.append(f"  ({one_line(request['provenance'], ACT_SUMMARY_CHARS)})")
    if request.get("act_summary"):
        lines.append(f"  {one_line(request['act_summary'], ACT_SUMMARY_CHARS)}")
    lines.append(f"  params {params_line(request.get('params') or {})}")
    return lines


class _Settled:
    """The request was answered elsewhere while the prompt waited."""


_SETTLED: Final = _Settled()


class ApprovalPrompt:
    """Asks the human about each request; None when the request was settled elsewhere."""

    def __init__(
        self,
        still_pending: Callable[[str], bool],
        *,
        stdin: TextIO | None = None,
        check_every: float = 0.5,
    ) -> None:
        self._still_pending = still_pending
        self._stdin = stdin if stdin is not None else sys.stdin
        self._check_every = check_every
        self._buffer = b""

    def ask(self, request: dict[str, Any]) -> str | None:
        for shown in render(request):
            click.echo(shown, err=True)
        fd = self._fileno()
        if fd is None:
            return self._ask_plain()
        request_id = str(request.get("request_id", ""))
        while True:
            click.echo(QUESTION, err=True, nl=False)
            line = self._read_line(fd, request_id)
            if isinstance(line, _Settled):
                click.echo("", err=True)
                return None
            if line is None:
                click.echo("", err=True)
                click.echo("no answer; denying", err=True)  # fail closed: no human, no allow
                return "deny"
            choice = line.strip().lower()
            if choice in ANSWERS:
                return ANSWERS[choice]
            click.echo(f"Error: {one_line(choice, 20)!r} is not one of o, a, d.", err=True)

    def _fileno(self) -> int | None:
        try:
            return self._stdin.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            return None  # an in-memory stdin (tests): no way to wait on it

    def _ask_plain(self) -> str:
        try:
            choice = click.prompt(QUESTION.rstrip(), type=click.Choice(tuple(ANSWERS)), err=True)
        except click.Abort:
            click.echo("no answer; denying", err=True)
            return "deny"
        return ANSWERS[str(choice)]

    def _read_line(self, fd: int, request_id: str) -> str | _Settled | None:
        """A line typed by the human, None at end of input, _SETTLED when answered elsewhere."""
        next_check = time.monotonic() + self._check_every
        while True:
            if b"\n" in self._buffer:
                line, _, self._buffer = self._buffer.partition(b"\n")
                return line.decode("utf-8", "replace")
            if len(self._buffer) > MAX_LINE:
                line, self._buffer = self._buffer, b""
                return line.decode("utf-8", "replace")
            wait = max(0.0, next_check - time.monotonic())
            ready, _, _ = select.select([fd], [], [], wait)
            if ready:
                chunk = os.read(fd, 1024)
                if not chunk:
                    if self._buffer:
                        line, self._buffer = self._buffer, b""
                        return line.decode("utf-8", "replace")
                    return None
                self._buffer += chunk
                continue
            if request_id and not self._still_pending(request_id):
                return _SETTLED
            next_check = time.monotonic() + self._check_every
