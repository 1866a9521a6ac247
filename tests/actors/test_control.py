"""The control protocol and endpoint: real ZeroMQ sockets over ipc, hostile clients included."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from actors.loop import EventLoopThread
from actors.process.control_commands import ControlCommands
from actors.process.control_server import ControlEndpoint
from chalie.process import control, daemon
from chalie.process.routing import Route, Router
from chalie.wire.messages import ControlReply, ControlRequest, ToolCall, TurnContext, encode
from tools.waiting import wait_until

COMMANDS: dict[str, type[control.Args]] = {
    route.name: route.args for route in ControlCommands(Any, Any).routes()
}


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    # ipc paths are capped at 107 bytes; pytest's tmp paths can be long.
    short = Path("/tmp") / f"chc-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    short.mkdir(mode=0o700)
    yield short
    for p in short.iterdir():
        p.unlink()
    short.rmdir()


class Served:
    """A live endpoint whose handler records what it ran."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.loop = EventLoopThread()
        self.loop.start()
        self.release = threading.Event()
        self.ran: list[tuple[str, control.Args]] = []
        self.endpoint = ControlEndpoint(home, self.loop, self.router())
        self.endpoint.start()
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(daemon.instance_lock(home))  # this process acts as the daemon
        (home / control.PID_NAME).write_text(str(os.getpid()))

    def router(self) -> Router:
        def route(name: str, args: type[control.Args]) -> Route[Any]:
            return Route(name, args, lambda a: self.handle(name, a))

        return Router([route(name, args) for name, args in COMMANDS.items()])

    def handle(self, command: str, args: control.Args) -> ControlReply:
        self.ran.append((command, args))
        if command == "policy.pending":
            self.release.wait(10)  # a handler held up, as by a human's approval
            return control.success("released")
        if command == "policy.list":
            raise ValueError("boom inside a handler")
        return control.success({"command": command})

    def close(self) -> None:
        self.release.set()
        self.endpoint.stop()
        self.loop.stop()
        self._lock.close()


@pytest.fixture
def served(home: Path) -> Iterator[Served]:
    s = Served(home)
    yield s
    s.close()


def raw(
    home: Path, frames: list[bytes], kind: int = zmq.DEALER, timeout: float = 3.0
) -> list[bytes]:
    ctx = zmq.Context.instance()
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
    sock.connect(control.endpoint(home))
    try:
        sock.send_multipart(frames)
        return sock.recv_multipart()
    finally:
        sock.close()


def reply_of(frames: list[bytes]) -> ControlReply:
    return control.decode_reply(frames[-1])


# -- the protocol, pure -------------------------------------------------------------


def test_parse_request_accepts_a_known_command_with_checked_args() -> None:
    frame = control.encode_request("trail", {"tool": "clock", "limit": 5})
    command, args = control.parse_request(frame, COMMANDS)  # type: ignore[misc]
    assert command == "trail"
    assert isinstance(args, control.TrailArgs)
    assert (args.tool, args.limit) == ("clock", 5)


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"", control.MALFORMED),
        (b"\xc1\xff garbage", control.MALFORMED),
        (msgspec.msgpack.encode({"kind": "control_request"}), control.MALFORMED),
        (msgspec.msgpack.encode([1, 2, 3]), control.MALFORMED),
        (
            encode(
                ToolCall(
                    call_id="c", tool="x", context=TurnContext(conversation_id="a", turn_id="b")
                )
            ),
            control.MALFORMED,
        ),
        (control.encode_request("rm -rf /"), control.UNKNOWN_COMMAND),
        (control.encode_request("trail", {"limit": "ten"}), control.INVALID_ARGS),
        (control.encode_request("trail", {"limit": 0}), control.INVALID_ARGS),
        (control.encode_request("trail", {"sneaky": 1}), control.INVALID_ARGS),
        (
            control.encode_request(
                "policy.set", {"channel": "chat", "permission": "x", "decision": "internal"}
            ),
            control.INVALID_ARGS,
        ),
        (
            control.encode_request(
                "policy.set", {"channel": "root", "permission": "x", "decision": "allow"}
            ),
            control.INVALID_ARGS,
        ),
        (control.encode_request("tools.call", {"tool": "../etc/passwd"}), control.INVALID_ARGS),
        (b"\x00" * (control.MAX_REQUEST_BYTES + 1), control.OVERSIZED),
    ],
)
def test_parse_request_turns_bad_frames_into_structured_errors(frame: bytes, code: str) -> None:
    reply = control.parse_request(frame, COMMANDS)
    assert isinstance(reply, ControlReply)
    assert reply.ok is False
    assert reply.error == code
    assert isinstance(reply.data["message"], str) and reply.data["message"]


def test_unknown_command_reply_lists_the_valid_commands() -> None:
    reply = control.parse_request(control.encode_request("statsu"), COMMANDS)
    assert isinstance(reply, ControlReply)
    assert "status" in reply.data["valid_values"]


def test_a_reply_that_cannot_be_encoded_becomes_an_internal_error() -> None:
    frame = control.encode_reply(control.success({"x": object()}))
    reply = control.decode_reply(frame)
    assert (reply.ok, reply.error) == (False, control.INTERNAL)


def test_client_says_no_daemon_when_there_is_no_pid_file(home: Path) -> None:
    with pytest.raises(control.DaemonNotRunning) as info:
        control.request(home, "status")
    assert str(info.value) == f"no daemon running on {home} (start it with `chalie run`)"


def test_client_treats_a_dead_pid_as_no_daemon(home: Path) -> None:
    (home / control.PID_NAME).write_text("999999999")
    (home / control.SOCKET_NAME).write_text("")
    with pytest.raises(control.DaemonNotRunning):
        control.request(home, "status")


def unserved_socket(path: Path) -> socket.socket:
    """A socket file nobody serves (a killed daemon leaves one): a connect is refused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


def test_client_gives_up_on_a_silent_socket(home: Path) -> None:
    (home / control.PID_NAME).write_text(str(os.getpid()))  # alive, but nobody listens
    with (
        unserved_socket(home / control.SOCKET_NAME),
        daemon.instance_lock(home),
        pytest.raises(control.DaemonNotRunning) as info,
    ):
        control.request(home, "status", timeout=0.3)
    assert "no answer" in info.value.why


def test_a_live_pid_beside_a_file_that_is_no_socket_is_no_daemon_at_once(home: Path) -> None:
    (home / control.PID_NAME).write_text(str(os.getpid()))
    (home / control.SOCKET_NAME).write_text("")
    with daemon.instance_lock(home), pytest.raises(control.DaemonNotRunning) as info:
        control.request(home, "status", timeout=30)
    assert info.value.why == ""  # refused before any request was sent: nothing waited


# -- the endpoint, live -------------------------------------------------------------


def test_endpoint_answers_a_client_request(served: Served) -> None:
    reply = control.request(served.home, "status")
    assert reply.ok and reply.data == {"command": "status"}


def test_socket_file_is_private_to_the_owner(served: Served) -> None:
    mode = stat.S_IMODE(os.stat(control.socket_path(served.home)).st_mode)
    assert mode == 0o600


@pytest.mark.parametrize(
    "frames",
    [
        [b"garbage"],
        [b"\x93\x01\x02\x03"],
        [b""],
        [b"a", b"b", b"c"],
        [msgspec.msgpack.encode(ControlRequest(command="nope"))],
        [b"\xff" * (control.MAX_REQUEST_BYTES + 10)],
        # args.arguments nested 200,000 levels deep, inside the size limit
        [
            control.encode_request("tools.call", {"arguments": None})[:-1]
            + b"\x91" * 200_000
            + b"\xc0"
        ],
    ],
)
def test_endpoint_answers_garbage_with_an_error_and_keeps_serving(
    served: Served, frames: list[bytes]
) -> None:
    reply = reply_of(raw(served.home, frames))
    assert reply.ok is False
    assert reply.error in {control.MALFORMED, control.OVERSIZED, control.UNKNOWN_COMMAND}
    assert control.request(served.home, "status").ok
    assert served.ran == [("status", control.NoArgs())]


def test_endpoint_survives_garbage_from_a_req_client(served: Served) -> None:
    reply = reply_of(raw(served.home, [b"\x00\x01not msgpack"], kind=zmq.REQ))
    assert (reply.ok, reply.error) == (False, control.MALFORMED)
    assert control.request(served.home, "status").ok


def test_a_handler_that_raises_gives_internal_error_and_the_endpoint_lives(served: Served) -> None:
    with control.ControlClient(served.home) as client:
        reply = client.call("policy.list")
        assert (reply.ok, reply.error) == (False, control.INTERNAL)
        assert "boom inside a handler" in reply.data["message"]
        assert client.call("status").ok


def test_a_held_up_command_does_not_stall_status_from_another_client(served: Served) -> None:
    held: list[ControlReply] = []
    with (
        control.ControlClient(served.home) as client,
        control.ControlClient(served.home) as other,  # another terminal
    ):
        t = threading.Thread(target=lambda: held.append(other.call("policy.pending", timeout=10)))
        t.start()
        wait_until(lambda: any(c == "policy.pending" for c, _ in served.ran), 5)
        assert client.call("status", timeout=2).ok  # answered while policy.pending is held
        assert held == []
        served.release.set()
        t.join(5)
    assert held and held[0].data == "released"


def test_a_client_that_leaves_before_its_reply_does_not_break_the_endpoint(served: Served) -> None:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(control.endpoint(served.home))
    sock.send(control.encode_request("policy.pending"))
    wait_until(lambda: any(c == "policy.pending" for c, _ in served.ran), 5)
    sock.close()
    served.release.set()
    # served counts a request once its reply was sent (or found nobody to take it).
    wait_until(lambda: served.endpoint.served >= 1, 5, what="the held request answered")
    assert control.request(served.home, "status").ok


def test_stopping_the_endpoint_removes_the_socket_file(home: Path) -> None:
    s = Served(home)
    assert control.socket_path(home).exists()
    s.close()
    assert not control.socket_path(home).exists()


def test_on_exit_fires_when_serving_ends_without_stop_and_not_on_stop(home: Path) -> None:
    s = Served(home)
    exits: list[BaseException | None] = []
    s.endpoint.on_exit(exits.append)
    task = s.endpoint._task
    assert task is not None
    s.loop.call_soon(task.cancel)  # the serving task dies underneath the endpoint
    wait_until(lambda: exits, 5, what="on_exit called")
    assert exits == [None]
    s.close()
    assert exits == [None]

    again = Served(home)
    later: list[BaseException | None] = []
    again.endpoint.on_exit(later.append)
    # stop() returns once the task ended on the loop, and its done callbacks
    # (on_exit's among them) run before the awaiting stop() resumes.
    again.close()
    assert later == []


def status_when_up(client: control.ControlClient) -> ControlReply:
    deadline = time.monotonic() + 10
    while True:
        try:
            return client.call("status", timeout=1)
        except control.DaemonNotRunning:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def test_the_control_child_is_restarted_when_its_endpoint_dies(home: Path) -> None:
    from actors.process.control import ControlActor
    from actors.process.supervisor import Supervisor
    from chalie.calls.registry import Registry
    from chalie.process.config import Config
    from chalie.process.supervision import ChildSpec
    from chalie.services import Services
    from chalie.wire.bus import EventBus
    from chalie_app.root import Runtime

    loop = EventLoopThread()
    loop.start()
    rt = Runtime(Config.load(home), Registry(), EventBus(), loop, Services(), home / "chalie.db")
    rt.supervisor = Supervisor.start(
        [
            ChildSpec(
                "control",
                lambda: ControlActor.start(
                    rt, home=home, loop=loop, events=rt.events, dispatch=rt.dispatch
                ),
            )
        ]
    )
    (home / control.PID_NAME).write_text(str(os.getpid()))
    held = contextlib.ExitStack()
    held.enter_context(daemon.instance_lock(home))
    client = held.enter_context(control.ControlClient(home, timeout=5))
    try:
        assert status_when_up(client).ok
        first = rt.supervisor.proxy().child("control").get()

        async def kill_serving_task() -> int:
            # The endpoint's serving task dies underneath it, as on a fault in the loop.
            tasks = [t for t in asyncio.all_tasks() if t.get_name() == "control-endpoint"]
            for task in tasks:
                task.cancel()
            return len(tasks)

        assert loop.submit(kill_serving_task()).result(5) == 1

        def restarted() -> bool:
            current = rt.supervisor.proxy().child("control").get()
            return current is not None and current is not first and current.is_alive()

        wait_until(restarted, 10, what="the control child restarted")
        reply = status_when_up(client)
        assert reply.ok
        control_child = next(c for c in reply.data["actors"] if c["id"] == "control")
        assert control_child["restarts"] == 1
        assert "control endpoint stopped serving" in control_child["last_error"]
    finally:
        rt.supervisor.stop()
        loop.stop()
        held.close()


def test_stopping_an_old_endpoint_leaves_a_newer_endpoints_socket_alone(home: Path) -> None:
    old = Served(home)
    newer_loop = EventLoopThread()
    newer_loop.start()
    newer = ControlEndpoint(home, newer_loop, old.router())
    newer.start()  # binds a fresh socket file over the old one, as a restart does
    try:
        old.close()
        assert control.socket_path(home).exists()
        with daemon.instance_lock(home):  # the newer endpoint's daemon holds the lock
            assert control.request(home, "status").ok
    finally:
        newer.stop()
        newer_loop.stop()
    assert not control.socket_path(home).exists()


def test_a_client_reuses_its_socket_and_recovers_after_a_timeout(served: Served) -> None:
    with control.ControlClient(served.home) as client:
        assert client.call("status").ok
        kept = client._sock
        assert client.call("status").ok and client._sock is kept
        with pytest.raises(control.DaemonNotRunning, match="no answer"):
            client.call("policy.pending", timeout=0.3)  # held by the handler: times out
        assert client._sock is None
        served.release.set()
        assert client.call("status").ok  # a fresh socket; the stale reply is never read


def test_a_stale_pid_file_naming_an_unrelated_live_process_is_no_daemon(tmp_path: Path) -> None:
    import fcntl
    import subprocess
    import sys

    from click.testing import CliRunner

    from chalie_app.cli import cli

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    # The pid of a live process that is not a daemon, and a socket file nobody serves.
    (home / control.PID_NAME).write_text(f"{os.getpid()}\n")
    leftover = unserved_socket(home / control.SOCKET_NAME)
    (home / control.LOCK_NAME).write_text("")
    assert control.read_pid(home) is None
    began = time.monotonic()
    result = CliRunner().invoke(cli, ["--home", str(home), "status"])
    assert result.exit_code == 1 and "no daemon running" in result.stderr
    result = CliRunner().invoke(cli, ["--home", str(home), "stop"])
    assert result.exit_code == 0 and "no daemon running" in result.stdout
    assert time.monotonic() - began < 5
    leftover.close()
    # Held by a live process, the lock makes the same pid file a daemon's.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(home / control.LOCK_NAME)!r}, os.O_RDWR)\n"
            f"fcntl.flock(fd, {fcntl.LOCK_EX})\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert control.lock_held(home) is True
        assert control.read_pid(home) == os.getpid()
    finally:
        holder.kill()
        holder.wait(10)
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.stdout.close()
    assert control.lock_held(home) is False


@pytest.mark.parametrize("depth", [200_000, 5_000, control.MAX_ARG_DEPTH + 1])
def test_deeply_nested_arguments_are_a_malformed_request_not_a_crash(depth: int) -> None:
    key = msgspec.msgpack.encode
    nested = b"\x91" * depth + b"\xc0"  # [[[...[nil]...]]]
    frame = (
        b"\x82"
        + key("command")
        + key("tools.call")
        + key("args")
        + b"\x82"
        + key("tool")
        + key("echo")
        + key("arguments")
        + b"\x81"
        + key("x")
        + nested
    )
    assert len(frame) <= control.MAX_REQUEST_BYTES
    reply = control.parse_request(frame, COMMANDS)
    assert isinstance(reply, ControlReply) and reply.error == control.MALFORMED
    assert "nest" in reply.data["message"]


def test_arguments_at_the_depth_limit_are_accepted() -> None:
    args: object = 1
    for _ in range(control.MAX_ARG_DEPTH - 2):  # the arguments dict and its value add two
        args = [args]
    frame = control.encode_request("tools.call", {"tool": "echo", "arguments": {"x": args}})
    parsed = control.parse_request(frame, COMMANDS)
    assert not isinstance(parsed, ControlReply), parsed


def test_the_live_endpoint_answers_a_deeply_nested_request(served: Served) -> None:
    key = msgspec.msgpack.encode
    frame = (
        b"\x82"
        + key("command")
        + key("status")
        + key("args")
        + b"\x81"
        + key("x")
        + b"\x91" * 100_000
        + b"\xc0"
    )
    reply = reply_of(raw(served.home, [b"", frame], zmq.DEALER))
    assert reply.error == control.MALFORMED
    assert control.request(served.home, "status").ok


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no-pidfd"])
def test_wait_gone_sees_an_exit_a_zombie_and_a_live_process(
    pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    if not pidfd:

        def unavailable(_pid: int) -> int:
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", unavailable)
    child = subprocess.Popen(
        [sys.executable, "-S", "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        assert control.wait_gone(child.pid, 0.05) is False  # it runs on: the wait times out
        assert child.stdin is not None
        threading.Thread(target=child.stdin.close).start()  # it exits while we wait
        assert control.wait_gone(child.pid, 30) is True
        assert control.wait_gone(child.pid, 0) is True  # not reaped yet: a zombie is gone
        assert child.poll() is not None
    finally:
        child.kill()
        child.wait(10)
    assert control.wait_gone(child.pid, 30) is True  # reaped: no such process
