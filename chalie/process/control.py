"""The control protocol between the ``chalie`` CLI and the daemon, and the CLI's client for it.

One request, one reply: a :class:`~chalie.wire.messages.ControlRequest` frame in,
a :class:`~chalie.wire.messages.ControlReply` frame out, msgpack on ZeroMQ over
``ipc://<home>/control.sock`` (the socket file 0600 in a 0700 directory).
Every request is checked here before anything acts on it: its size, its
encoding, the command name, and the command's arguments against a Struct.
A bad request gets ``ControlReply(ok=False, error=<code>, data={"message":
...})``; nothing here raises on hostile input.

The daemon's commands (their routing table is in ``actors/process/control_commands.py``;
their arguments are the Structs below): ``status``, ``stop``,
``tools.call`` / ``tools.poll`` / ``tools.cancel`` (a call runs in the
daemon; the CLI polls it for its outcome and for permission requests it must
answer, and cancels it on Ctrl-C), ``tools.schema`` (a tool's input schema as
the daemon's catalogue has it: how ``chalie tools call`` reads ``key=value``),
``trail``,
``policy.list`` / ``policy.set`` / ``policy.reset`` / ``policy.pending`` /
``policy.answer``, ``mcp.reload`` (reconcile MCP connections with chalie.db),
``mcp.answer`` (the owner's answer to a server's elicitation).
"""

from __future__ import annotations

import os
import re
import select
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
import zmq

from chalie.process.home import CONTROL_SOCKET_NAME, MAX_IPC_PATH
from chalie.process.home import LOCK_NAME as LOCK_NAME
from chalie.process.home import PID_NAME as PID_NAME
from chalie.wire.frames import SafeDecoder
from chalie.wire.messages import Answer, Channel, ControlReply, ControlRequest, Id, TrailStatus

MAX_REQUEST_BYTES: Final = 256 * 1024
# Containers in a request's arguments nest at most this deep: deeper ones are
# refused before anything (validation, the trail, a reply) walks them recursively.
MAX_ARG_DEPTH: Final = 64
# The data directory's layout is chalie.process.home's; these names are re-exported for clients.
SOCKET_NAME: Final = CONTROL_SOCKET_NAME
_SLICE_MS: Final = 200
# How often wait_gone looks where it cannot be woken by the exit (no pidfd).
_GONE_POLL: Final = 0.01

# Error codes a ControlReply can carry (the ``error`` field).
MALFORMED: Final = "malformed-request"
OVERSIZED: Final = "oversized-request"
UNKNOWN_COMMAND: Final = "unknown-command"
INVALID_ARGS: Final = "invalid-args"
NOT_FOUND: Final = "not-found"
UNAVAILABLE: Final = "unavailable"
INTERNAL: Final = "internal-error"

Short = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
ToolName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^_?[a-z][a-z0-9_]*$")
]


class Args(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of every command's arguments."""


class NoArgs(Args):
    pass


class ToolsCallArgs(Args):
    tool: ToolName
    arguments: dict[str, Any] = {}
    conversation_id: Id | None = None


class ToolsPollArgs(Args):
    call_id: Id
    # Long-poll: the daemon holds the reply up to this long for news.
    wait: Annotated[float, msgspec.Meta(ge=0, le=10)] = 1.0


class ToolsCancelArgs(Args):
    call_id: Id


class ToolsSchemaArgs(Args):
    tool: ToolName


class TrailArgs(Args):
    tool: ToolName | None = None
    status: TrailStatus | None = None
    code: Short | None = None
    conversation: Id | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 20


class PolicySetArgs(Args):
    channel: Channel
    permission: Short
    decision: Literal["allow", "ask", "deny"]


class PolicyResetArgs(Args):
    channel: Channel | None = None
    permission: Short | None = None


# The fields of a form answer (a server's elicitation; checked against its form by the gate).
FormContent = dict[str, str | int | float | bool | list[str] | None]


class PolicyAnswerArgs(Args):
    request_id: Id
    answer: Answer
    content: FormContent | None = None  # a request with a form: its fields


class McpAnswerArgs(Args):
    """The owner's answer to a server's elicitation: the form's fields, or none to decline."""

    request_id: Id
    content: FormContent | None = None


class DiscoveryExamplesArgs(Args):
    """The learned examples: list (one tool's or all), forget a tool's or one, clear all."""

    action: Literal["list", "forget", "clear"]
    tool: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    id: Annotated[int, msgspec.Meta(ge=1)] | None = None


class IndexRebuildArgs(Args):
    """Start a rebuild of the discovery index in the daemon, or (start=False) report on it."""

    start: bool = True
    reuse: bool = False


# The frame's own levels (request, args, arguments) sit above the arguments' limit.
_request_decoder: Final = SafeDecoder[ControlRequest](ControlRequest, max_depth=MAX_ARG_DEPTH + 8)
_reply_decoder: Final = msgspec.msgpack.Decoder(ControlReply)
_encoder: Final = msgspec.msgpack.Encoder()
_WHITESPACE: Final = re.compile(r"\s+")


def failure(code: str, message: str, **extra: Any) -> ControlReply:
    """A structured error reply: a stable code plus a one-line message."""
    return ControlReply(
        ok=False, error=code, data={"message": _WHITESPACE.sub(" ", message)[:500], **extra}
    )


def success(data: Any = None) -> ControlReply:
    return ControlReply(ok=True, data=data)


def parse_request(
    frame: bytes, commands: Mapping[str, type[Args]]
) -> tuple[str, Args] | ControlReply:
    """The command and its arguments checked against ``commands`` (name -> argument
    type: the routing table's), or the error reply to send back."""
    if len(frame) > MAX_REQUEST_BYTES:
        return failure(OVERSIZED, f"request of {len(frame)} bytes exceeds {MAX_REQUEST_BYTES}")
    try:
        request = _request_decoder.decode(frame)
    except msgspec.DecodeError as exc:
        return failure(MALFORMED, f"not a control request: {exc}")
    except RecursionError:
        return failure(MALFORMED, "the request is nested too deeply")
    if not _nesting_within(request.args, MAX_ARG_DEPTH):
        return failure(MALFORMED, f"the arguments nest deeper than {MAX_ARG_DEPTH} levels")
    spec = commands.get(request.command)
    if spec is None:
        return failure(
            UNKNOWN_COMMAND,
            f"unknown command {request.command[:64]!r}",
            valid_values=sorted(commands),
        )
    try:
        args = msgspec.convert(request.args, spec, strict=True)
    except msgspec.ValidationError as exc:
        return failure(INVALID_ARGS, f"{request.command}: {exc}")
    return request.command, args


def _nesting_within(value: Any, limit: int) -> bool:
    """Whether containers in ``value`` nest at most ``limit`` deep (checked without recursion)."""
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return False
        todo.extend((child, depth + 1) for child in children)
    return True


def encode_reply(reply: ControlReply) -> bytes:
    """The reply frame; a reply whose data cannot be encoded becomes an internal-error reply."""
    try:
        return _encoder.encode(reply)
    except (TypeError, msgspec.EncodeError) as exc:
        return _encoder.encode(failure(INTERNAL, f"reply could not be encoded: {exc}"))


def encode_request(command: str, args: dict[str, Any] | None = None) -> bytes:
    return _encoder.encode(ControlRequest(command=command, args=args or {}))


def decode_reply(frame: bytes) -> ControlReply:
    return _reply_decoder.decode(frame)


# -- paths in the data directory ----------------------------------------------


def socket_path(home: Path) -> Path:
    return home / SOCKET_NAME


def endpoint(home: Path) -> str:
    path = socket_path(home)
    # ipc paths are capped at 107 bytes by the kernel's sockaddr_un.
    if len(os.fsencode(path)) > MAX_IPC_PATH:
        raise ValueError(f"data directory path too long for an ipc socket: {path}")
    return f"ipc://{path}"


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (exited, not yet reaped by its parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, someone else's
    try:
        line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc here: kill(0) is all we know
    return line.rsplit(")", 1)[-1].split()[0] != "Z"


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait at most ``timeout`` seconds for ``pid`` to exit; whether it has (a zombie has).

    Woken by the exit itself: a Linux pidfd becomes readable when its process ends. Where
    there is none (another system, an old kernel), :func:`process_alive` is asked every
    ``_GONE_POLL`` seconds instead.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(max(0, int(timeout * 1000)))) or not process_alive(pid)
        finally:
            os.close(fd)
    deadline = time.monotonic() + timeout
    while process_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_GONE_POLL)
    return True


def lock_holder(home: Path) -> int | bool | None:
    """Who holds the data directory's lock (read from /proc/locks, which changes nothing):
    its pid; False when nobody does; True when held by a pid this namespace cannot name;
    None where that cannot be told."""
    try:
        st = os.stat(home / LOCK_NAME)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE <pid> <maj:min:inode> 0 EOF"; a blocked waiter has "->".
        if len(parts) >= 6 and parts[1] == "FLOCK" and "->" not in parts and parts[5] == inode:
            try:
                pid = int(parts[4])
            except ValueError:
                return True
            return pid if pid > 0 else True
    return False


def lock_held(home: Path) -> bool | None:
    """Whether a process holds the data directory's lock; None where that cannot be told."""
    holder = lock_holder(home)
    return holder if holder is None else holder is not False


def named_pid(home: Path) -> int | None:
    """The pid file's process if it is alive, else None: a first look, the lock not asked."""
    try:
        pid = int((home / PID_NAME).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and process_alive(pid) else None


def read_pid(home: Path) -> int | None:
    """The daemon's pid: the pid file's process if it is alive and the lock is held, else None.

    A pid file left by a killed daemon may name an unrelated live process
    (pids are reused); the lock, which the kernel drops with its holder, says
    whether a daemon really runs.
    """
    pid = named_pid(home)
    if pid is None or lock_held(home) is False:
        return None
    return pid


# -- the client ---------------------------------------------------------------


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


class DaemonNotRunning(RuntimeError):
    """No daemon answers on this data directory."""

    def __init__(self, home: Path, why: str = "") -> None:
        self.home = home
        self.why = why
        if why:
            super().__init__(f"no answer from the daemon on {home}: {why}")
        else:
            super().__init__(f"no daemon running on {home} (start it with `chalie run`)")


class ControlClient:
    """Sends one request at a time to the daemon on ``home``; not shared between threads.

    One REQ socket is kept while requests succeed. A request that fails or
    times out closes it, because a REQ socket left waiting for a reply is
    stuck in its send/receive state machine; the next request opens another.
    """

    def __init__(self, home: Path, *, timeout: float = 10.0) -> None:
        self.home = home
        self.timeout = timeout
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock: zmq.Socket[bytes] | None = None

    def check(self) -> None:
        """Raise DaemonNotRunning now when there is plainly no daemon: no pid file naming a
        live process, or no socket file. Whether that process holds the data directory's
        lock (a killed daemon's pid file can name another, live process) is asked only while
        the request waits for its answer: the kernel's lock table, /proc/locks, takes an RCU
        grace period to read (5-20 ms, most of a command's own work)."""
        if named_pid(self.home) is None or not _is_socket(socket_path(self.home)):
            raise DaemonNotRunning(self.home)

    def _socket(self) -> zmq.Socket[bytes]:
        if self._sock is None:
            sock = self._ctx.socket(zmq.REQ)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint(self.home))
            self._sock = sock
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def call(
        self, command: str, args: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> ControlReply:
        self.check()
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        sock = self._socket()
        try:
            sock.send(encode_request(command, args), zmq.NOBLOCK)
            # Wait in slices, so a daemon that dies mid-request is noticed at once.
            while not sock.poll(_SLICE_MS, zmq.POLLIN):
                if read_pid(self.home) is None:  # it stopped, or its pid file was stale
                    raise DaemonNotRunning(self.home)
                if time.monotonic() >= deadline:
                    raise DaemonNotRunning(self.home, f"no answer within {wait:g} s")
            frame = sock.recv()
        except zmq.Again:
            self.close()
            raise DaemonNotRunning(self.home, f"no answer within {wait:g} s") from None
        except BaseException:
            self.close()
            raise
        try:
            return decode_reply(frame)
        except msgspec.DecodeError as exc:
            return failure(MALFORMED, f"daemon sent an unreadable reply: {exc}")


def request(
    home: Path, command: str, args: dict[str, Any] | None = None, *, timeout: float = 10.0
) -> ControlReply:
    """One request on a client of its own, closed afterwards."""
    with ControlClient(home, timeout=timeout) as client:
        return client.call(command, args)
