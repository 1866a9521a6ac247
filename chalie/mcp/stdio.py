"""A stdio MCP transport that never holds more than one bounded message of a server's output.

The SDK's stdio client reads a whole line before it parses it: a server answering with
50 MB makes the daemon hold (and parse) 50 MB, and every answer behind it (the
heartbeat's included) waits. Here the child's stdout is read in chunks and split on
newlines as bytes; a message past ``max_message`` bytes is skipped as it streams by,
never stored: only its first :data:`PREFIX` bytes are kept, to find its JSON-RPC id. An
oversized *answer* (no ``"method"`` before the id) is replaced by a JSON-RPC error for that
id (:data:`TOO_LARGE`), so the call ends at once with ``mcp-result-too-large``; an
oversized request or notification from the server is dropped with a log line.

Lifecycle (the same as the SDK's: our own, because it must never leave a server running):
the child starts in its own session (process group); on exit (a close, a cancel, an
error) stdin is closed, the group gets SIGTERM after :data:`EXIT_GRACE` seconds and
SIGKILL after :data:`KILL_GRACE` more, and the reader drains its stdout meanwhile so a
child blocked writing can exit. Nothing here outlives the ``async with``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final, TextIO

import anyio
import mcp_types
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.shared.message import SessionMessage

from chalie.mcp.results import TOO_LARGE
from chalie.process.logs import Throttle

# What a server writes decides how often this logs: one line each, a bounded number a minute.
log = logging.getLogger("chalie.mcp.stdio")
log.addFilter(Throttle())

PREFIX: Final = 4096  # bytes of an oversized message kept to find its id
EXIT_GRACE: Final = 2.0
KILL_GRACE: Final = 2.0
_POLL: Final = 0.02
_ID: Final = re.compile(rb'"id"\s*:\s*(-?\d{1,20}|"(?:[^"\\]|\\.){0,200}")')
_METHOD: Final = re.compile(rb'"method"\s*:')


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        log.info("an MCP server wrote a line that is not JSON-RPC: %s", str(exc)[:200])
        return exc


def refusal(prefix: bytes, limit: int) -> SessionMessage | None:
    """The JSON-RPC error standing for an oversized answer, or None (no id, not an answer)."""
    found = _ID.search(prefix)
    if found is None:
        return None
    method = _METHOD.search(prefix)
    if method is not None and method.start() < found.start():
        return None  # the server's own request or notification: nobody waits for it
    error = (
        b'{"jsonrpc":"2.0","id":' + found.group(1) + b',"error":{"code":'
        + str(TOO_LARGE).encode()
        + f',"message":"the answer is larger than {limit} bytes; refused"}}}}'.encode()
    )  # fmt: skip
    parsed = _parse(error)
    return parsed if isinstance(parsed, SessionMessage) else None


class _Lines:
    """Splits a byte stream into messages, keeping at most ``limit`` bytes of any one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._skipping: bytearray | None = None  # the prefix of a message being skipped
        self.skipped = 0

    def feed(self, chunk: bytes) -> list[SessionMessage | Exception | None]:
        """Messages completed by ``chunk`` (None: an oversized one with nobody to tell)."""
        out: list[SessionMessage | Exception | None] = []
        start = 0
        while start <= len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if self._skipping is not None:
                if len(self._skipping) < PREFIX:
                    self._skipping += piece[: PREFIX - len(self._skipping)]
            else:
                self._buf += piece
                if len(self._buf) > self.limit:
                    self._skipping = bytearray(self._buf[:PREFIX])
                    self._buf = bytearray()
            if end < 0:
                break
            if self._skipping is not None:
                self.skipped += 1
                out.append(refusal(bytes(self._skipping), self.limit))
                self._skipping = None
            elif self._buf.strip():
                out.append(_parse(bytes(self._buf)))
            self._buf = bytearray()
            start = end + 1
        return out


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


async def _exited(process: Any, within: float) -> bool:
    with anyio.move_on_after(within):
        while process.returncode is None:
            await anyio.sleep(_POLL)
    return process.returncode is not None


async def end_process(process: Any) -> None:
    """Close stdin, then SIGTERM and SIGKILL the child's process group, each after a grace."""
    with contextlib.suppress(Exception):
        await process.stdin.aclose()
    if await _exited(process, EXIT_GRACE):
        _signal_group(process.pid, signal.SIGKILL)  # what it left behind in its group
        return
    _signal_group(process.pid, signal.SIGTERM)
    if not await _exited(process, KILL_GRACE):
        _signal_group(process.pid, signal.SIGKILL)
        if not await _exited(process, KILL_GRACE):
            log.warning("MCP server process %d survived SIGKILL", process.pid)


@asynccontextmanager
async def bounded_stdio_client(
    server: StdioServerParameters, errlog: TextIO, max_message: int
) -> AsyncIterator[tuple[Any, Any]]:
    """The ``(read, write)`` streams of a stdio server whose messages are at most
    ``max_message`` bytes (see the module doc)."""
    process = await anyio.open_process(
        [server.command, *server.args],
        env=get_default_environment() | (server.env or {}),
        stderr=errlog,
        cwd=server.cwd,
        start_new_session=True,
    )
    stdout, stdin = process.stdout, process.stdin
    assert stdout is not None and stdin is not None, "the child is spawned with pipes"
    reader_in, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, writer_out = anyio.create_memory_object_stream[SessionMessage](0)
    lines = _Lines(max_message)

    async def read() -> None:
        delivering = True
        try:
            async for chunk in stdout:
                for message in lines.feed(chunk):
                    if message is None:
                        log.warning(
                            "an MCP server sent a message over %d bytes that answers nothing; "
                            "dropped",
                            max_message,
                        )
                        continue
                    if delivering:
                        try:
                            await reader_in.send(message)
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            delivering = False  # the session is gone: drain, so the child exits
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        finally:
            await reader_in.aclose()

    async def write() -> None:
        try:
            async with writer_out:
                async for message in writer_out:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await stdin.send((text + "\n").encode("utf-8"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await reader_in.aclose()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            tg.start_soon(write)
            try:
                yield read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):
                    write_stream.close()
                    read_stream.close()
                    await end_process(process)
                tg.cancel_scope.cancel()
    finally:
        if process.returncode is None:  # whatever happened above, never left running
            _signal_group(process.pid, signal.SIGKILL)
        with anyio.move_on_after(KILL_GRACE, shield=True), contextlib.suppress(Exception):
            await process.aclose()
