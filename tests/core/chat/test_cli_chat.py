"""``chalie chat`` as a real process against a real daemon: a pipe, a terminal (pty), Ctrl-C."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from chalie.wire.events import PermissionRequest
from tests.core.chat.bridge import collect
from tests.core.chat.daemon import Daemon, clock_script
from tools.processes import reap, signal_state
from tools.waiting import wait_until

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow

ASKING = clock_script("clock\x1b[2J\nFAKE LINE")


def chalie(
    home: Path, *args: str, stdin: str = "", timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chalie", "--home", str(home), "chat", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_piped_message_prints_only_the_answer(d: Daemon) -> None:
    d.script({"steps": [{"text": "It is 9 pm in Tokyo.", "chunk": 4}]})
    done = chalie(d.home, "--channel", "chat-openai", stdin="what time is it in Tokyo\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "It is 9 pm in Tokyo.\n"


def test_a_piped_turn_waits_for_an_answer_given_elsewhere_and_tooltips_are_one_escaped_line(
    d: Daemon,
) -> None:
    d.script(ASKING)
    seen: list[Any] = []
    sub = d.rt.events.subscribe(
        None, lambda e: seen.append(e) if isinstance(e, PermissionRequest) else None
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "chalie", "--home", str(d.home), "chat", "--channel", "chat-openai"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write("what time is it in Tokyo\n")
        proc.stdin.close()
        wait_until(lambda: seen, 30, "a permission request")
        with ChatClient.local(d.home) as other:
            other.send(p.Answer(request_id=seen[0].request_id, answer="allow_once"))
            assert collect(other, lambda f: f["type"] == "answered", timeout=20)[-1]["found"]
        proc.wait(30)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        sub.close()
        if proc.poll() is None:
            proc.kill()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == 0, err
    assert out == "It is evening in Tokyo.\n"
    lines = err.splitlines()
    assert any("· clock: clock\\x1b[2J\\nFAKE LINE" in line for line in lines), err
    assert not any(line.startswith("FAKE LINE") for line in lines)


def test_no_daemon_is_a_clean_message() -> None:
    home = Path(tempfile.mkdtemp(prefix="chn-", dir="/tmp"))
    home.chmod(0o700)
    done = chalie(home, stdin="hello\n")
    assert done.returncode == 1
    assert "no daemon running" in done.stderr and "Traceback" not in done.stderr


def test_an_unreachable_model_is_a_clean_message(d: Daemon) -> None:
    done = chalie(d.home, "--channel", "refused", stdin="hello?\n")
    assert done.returncode == 1
    assert "model could not answer" in done.stderr.lower() and "Traceback" not in done.stderr


def test_an_unknown_channel_is_refused_cleanly(d: Daemon) -> None:
    done = chalie(d.home, "--channel", "nowhere", stdin="hello\n")
    assert done.returncode == 1 and "unknown-channel" in done.stderr


class Terminal:
    """``chalie chat`` on a pseudo-terminal."""

    def __init__(self, home: Path, *args: str) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chalie", "--home", str(home), "chat", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            close_fds=True,
        )
        os.close(slave)
        self.seen = ""

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def expect(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} not shown; the screen so far:\n{self.seen}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536).decode(errors="replace")
                except OSError:
                    break
        assert text in self.seen, self.seen
        at = self.seen.index(text) + len(text)
        shown, self.seen = self.seen[:at], self.seen[at:]
        return shown

    def interrupt(self) -> None:
        # Said before sending: an ignored or blocked Ctrl-C is inherited from whoever started us.
        assert signal_state(self.proc.pid, signal.SIGINT) == "caught"
        self.proc.send_signal(signal.SIGINT)

    def close(self) -> int:
        try:
            return self.proc.wait(20)
        finally:
            reap(self.proc)
            os.close(self.master)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        reap(self.proc)  # killed and waited for: no live Popen left for the collector


def test_a_terminal_conversation_with_a_prompt_history_and_new(d: Daemon) -> None:
    d.script(ASKING)
    t = Terminal(d.home, "--channel", "chat-openai")
    try:
        t.expect("you> ")
        t.type("what time is it in Tokyo")
        # The cursor waits after the prompt: what is typed (the pty's echo) is on its line.
        assert t.expect("what time is it in Tokyo").replace("\r", "") == (
            "what time is it in Tokyo"
        )
        t.expect("allow [o]nce, [a]lways, or [d]eny?")
        t.type("o")
        t.expect("It is evening in Tokyo.")
        t.expect("you> ")
        d.script({"steps": [{"text": "Still evening."}]})
        t.type("and now?")
        t.expect("Still evening.")
        t.expect("you> ")
        t.type("/history")
        shown = t.expect("chalie> Still evening.")
        assert (
            "you> what time is it in Tokyo" in shown and "chalie> It is evening in Tokyo." in shown
        )
        t.expect("you> ")  # the prompt comes back after the history
        t.type("/new")
        t.expect("a new conversation starts")
        t.type("/quit")
        assert t.close() == 0
    finally:
        if t.proc.poll() is None:
            t.proc.kill()


def test_a_prompt_answered_elsewhere_goes_away(d: Daemon) -> None:
    d.script(ASKING)
    seen: list[Any] = []
    sub = d.rt.events.subscribe(
        None, lambda e: seen.append(e) if isinstance(e, PermissionRequest) else None
    )
    t = Terminal(d.home, "--channel", "chat-openai")
    try:
        t.expect("you> ")
        t.type("what time is it in Tokyo")
        t.expect("allow [o]nce, [a]lways, or [d]eny?")
        with ChatClient.local(d.home) as other:
            other.send(p.Answer(request_id=seen[-1].request_id, answer="allow_once"))
            collect(other, lambda f: f["type"] == "answered", timeout=20)
        t.expect("answered elsewhere: allow_once")
        t.expect("It is evening in Tokyo.")
        t.type("/quit")
        assert t.close() == 0
    finally:
        sub.close()
        if t.proc.poll() is None:
            t.proc.kill()


SENDING = {
    "steps": [
        {"tool_calls": [{"name": "find_tools", "arguments": {"query": ["send an email"]}}]},
        {
            "tool_calls": [
                {
                    "name": "email",
                    "arguments": {
                        "action": "send",
                        "to": ["ann@example.com"],
                        "subject": "Dinner",
                        "body": "At eight?",
                        "act_summary": "mailing Ann",
                    },
                }
            ]
        },
        {"text": "I did not send it.", "chunk": 6},
    ]
}


def test_a_send_beyond_chalie_is_prompted_with_its_reach_first_and_only_its_given_params(
    d: Daemon,
) -> None:
    # Issue 34: the prompt showed all 25 email parameters, nulls included, and no reach.
    d.script(SENDING)
    with Terminal(d.home, "--channel", "chat-openai") as t:
        t.expect("you> ")
        t.type("tell Ann dinner is at eight")
        shown = t.expect("allow [o]nce, [a]lways, or [d]eny?")
        lines = [line.strip() for line in shown.replace("\r", "").splitlines()]
        at = next(i for i, line in enumerate(lines) if line.startswith("? email wants"))
        assert lines[at + 1] == (
            "This reaches beyond Chalie: sends mail to ann@example.com; subject 'Dinner'; "
            "body 'At eight?'"
        )
        assert json.loads(lines[at + 2]) == {
            "action": "send",
            "body": "At eight?",
            "subject": "Dinner",
            "to": ["ann@example.com"],
        }
        t.type("d")
        t.expect("I did not send it.")
        t.type("/quit")
        assert t.close() == 0


def test_ctrl_c_cancels_the_turn_and_a_second_exits(d: Daemon) -> None:
    d.script({"steps": [{"text": "late", "delay": 60}]})
    t = Terminal(d.home, "--channel", "chat-openai")
    try:
        t.expect("you> ")
        t.type("take your time")
        wait_until(lambda: d.server.requests)  # the model is thinking: the turn is under way
        t.interrupt()
        t.expect("cancelling the turn")
        t.expect("turn ended: cancelled")
        t.expect("you> ")
        d.script({"steps": [{"text": "late", "delay": 60}]})
        t.type("again please")
        wait_until(lambda: d.server.requests)
        t.interrupt()
        t.expect("cancelling the turn")
        t.interrupt()
        t.expect("bye")
        assert t.close() == 130
    finally:
        if t.proc.poll() is None:
            t.proc.kill()


def test_an_empty_answer_is_nudged_once_then_piped_chat_and_ask_exit_1(d: Daemon) -> None:
    d.script({"on_user": {"text": ""}})
    done = chalie(d.home, "--channel", "chat-openai", stdin="hello\n")
    assert done.returncode == 1, done.stdout
    assert "empty-answer" in done.stderr and "The model gave no answer." in done.stderr
    assert len(d.server.requests) == 2  # the answer, one nudge, and no more
    nudge = d.server.requests[1]["body"]["messages"][-1]
    assert nudge["role"] == "user" and "Answer the user in words" in nudge["content"]
    d.script({"on_user": {"text": " "}})
    asked = subprocess.run(
        [
            sys.executable,
            "-m",
            "chalie",
            "--home",
            str(d.home),
            "ask",
            "--channel",
            "bg-openai",
            "hi",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert asked.returncode == 1 and "empty-answer" in asked.stderr


def test_a_daemon_that_stops_mid_turn_is_a_clean_message() -> None:
    d = Daemon()
    stopped = False
    try:
        d.script({"steps": [{"text": "late", "delay": 60}]})
        t = Terminal(d.home, "--channel", "chat-openai")
        try:
            t.expect("you> ")
            t.type("take your time")
            wait_until(lambda: d.server.requests)
            d.close()
            stopped = True
            t.expect("the daemon stopped")
            assert t.close() == 1
        finally:
            if t.proc.poll() is None:
                t.proc.kill()
    finally:
        if not stopped:
            d.close()


PICTURE = {
    "steps": [
        {"tool_calls": [{"name": "find_tools", "arguments": {"query": ["_mcp_cap_picture"]}}]},
        {"tool_calls": [{"name": "_mcp_cap_picture", "arguments": {"act_summary": "a picture"}}]},
        {"text": "Here is the picture.", "chunk": 6},
    ]
}


def test_an_image_a_tool_sends_is_offered_and_saved_to_a_file_whose_path_is_said(
    tmp_path: Path,
) -> None:
    """Issue 34: a terminal cannot show an image; it could only be described."""
    import base64

    from tests.core.chat.daemon import wait_indexed
    from tools.daemon_thread import DaemonThread
    from tools.fake_llm import FakeModelServer, load_script
    from tools.fixture_mcp.rig import capable_config
    from tools.fixture_mcp.server import PNG

    model = FakeModelServer(load_script(json.dumps(PICTURE))).start()
    home = Path(tempfile.mkdtemp(prefix="chi-", dir="/tmp"))
    running: DaemonThread | None = None
    try:
        running = DaemonThread(capable_config(model, home, fixture="server"))
        wait_indexed(running.rt, "_mcp_cap_picture")
        with Terminal(home, "--channel", "chat-openai") as t:
            t.expect("you> ")
            t.type("show me the picture")
            t.expect("allow [o]nce, [a]lways, or [d]eny?")
            t.type("o")
            t.expect("_mcp_cap_picture sent image (image/png, 40 bytes): /save [DIR]")
            t.expect("Here is the picture.")
            t.expect("you> ")
            t.type(f"/save {tmp_path}")
            shown = t.expect("you> ")
            (saved,) = [line for line in shown.splitlines() if line.startswith("saved ")]
            path = Path(saved.removeprefix("saved ").strip())
            assert path.parent == tmp_path and path.suffix == ".png"
            assert path.read_bytes() == base64.b64decode(PNG)
            assert path.stat().st_mode & 0o777 == 0o600
            t.type("/save")
            t.expect("nothing to save")
            t.type("/quit")
            assert t.close() == 0
    finally:
        if running is not None:
            running.stop()
        model.stop()
