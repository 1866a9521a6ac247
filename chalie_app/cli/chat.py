"""``chalie chat``: a terminal client of the ZeroMQ chat bridge.

The answer streams to stdout; everything else (a one-line tooltip per tool
call, permission prompts, notices) goes to stderr, so ``echo "..." | chalie
chat`` prints only the answer. Interactive: type a message; ``/new`` starts
a new conversation, ``/history`` shows this one, ``/save [DIR]`` writes the
images, sounds and files a tool sent (a terminal cannot show them) to DIR
(default: the current directory) and says where, ``/quit`` leaves. A
permission request is answered inline (``o``nce, ``a``lways, ``d``eny) or
from any other client; answered elsewhere, the prompt goes away. Ctrl-C
cancels the running turn; a second Ctrl-C (or one while idle) exits.
"""

from __future__ import annotations

import base64
import binascii
import json
import mimetypes
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Final, TextIO

import click
import msgspec
import zmq

from chalie.chat import protocol as p
from chalie.chat.client import ChatClient, ChatUnavailable, Frame
from chalie.gate.display import one_line, params_line, reach_line
from chalie.process import control
from chalie.wire.messages import ANSWER_LETTERS, Answer
from chalie_app.cli.group import Ctx, cli

PING_EVERY: Final = 30.0
HELLO_WAIT: Final = 5.0
ANSWERS: Final[dict[str, Answer]] = ANSWER_LETTERS
HELP: Final = (
    "commands: /new (a new conversation), /history, /save [DIR] (the images a tool sent), /quit"
)
YOU: Final = "you> "


class Media:
    """An image, a sound or a file a tool sent (a rich payload item), waiting for /save."""

    def __init__(self, tool: str, call_id: str, kind: str, mime: str, data: bytes) -> None:
        self.tool, self.call_id, self.kind, self.mime, self.data = tool, call_id, kind, mime, data

    @classmethod
    def of(cls, frame: Frame) -> list[Media]:
        """The savable items of a ``rich_payload`` frame (base64 ``data`` or ``blob``)."""
        payload = frame.get("payload")
        items = payload.get("items") if isinstance(payload, dict) else None
        found = []
        for item in items if isinstance(items, list) else ():
            if not isinstance(item, dict):
                continue
            raw = item.get("data") if item.get("type") in ("image", "audio") else item.get("blob")
            if not isinstance(raw, str):
                continue
            try:
                data = base64.b64decode(raw, validate=True)
            except (binascii.Error, ValueError):
                continue
            mime = str(item.get("mime_type") or "application/octet-stream")
            kind = str(item.get("type") or "file")
            tool, call = str(frame.get("tool", "")), str(frame.get("call_id", ""))
            found.append(cls(tool, call, kind, mime, data))
        return found

    def save(self, folder: Path, n: int) -> Path:
        """Written to a new file in ``folder`` (never over one), readable by its owner only."""
        ext = mimetypes.guess_extension(self.mime.split(";")[0].strip()) or ".bin"
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.tool)[:40]
        stem = f"chalie-{safe or 'tool'}-{self.call_id[-8:] or 'call'}-{n}"
        for i in range(1000):
            path = folder / (f"{stem}{ext}" if i == 0 else f"{stem}-{i}{ext}")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "wb") as out:
                out.write(self.data)
            return path.resolve()
        raise FileExistsError(f"no free file name for {stem}{ext} in {folder}")


class TerminalChat:
    """The client's state: the conversation, the turn it waits for, a pending permission prompt."""

    def __init__(
        self,
        client: ChatClient,
        *,
        channel: str,
        conversation_id: str | None,
        out: TextIO,
        err: TextIO,
        home: Path | None = None,
    ) -> None:
        self.client = client
        self.home = home
        self.channel = channel
        self.conversation_id = conversation_id
        self.out = out
        self.err = err
        self.turn_id: str | None = None  # the turn this client started and waits for
        self.client_msg_id: str | None = None
        self.waiting = False
        self.cancelling = False
        self.cancel_pending = False
        self.prompt: Frame | None = None  # a permission request awaiting this terminal
        self.replaying = False  # between an open and its "opened": history, not news
        self.history: list[str] = []
        self.midline = False
        self.at_prompt = False  # "you> " is shown on stderr, the cursor after it
        self.media: list[Media] = []  # sent by tools, not saved yet
        self.last_ping = time.monotonic()
        self.failed = False

    # -- sending ----------------------------------------------------------------------
    def say(self, text: str) -> None:
        self.client_msg_id = f"cli-{uuid.uuid4().hex}"
        self.client.send(
            p.Send(
                conversation_id=self.conversation_id,
                channel=self.channel,
                text=text,
                client_msg_id=self.client_msg_id,
            )
        )
        self.waiting = True
        self.cancelling = False
        self.turn_id = None

    def cancel(self) -> None:
        # A new conversation's id comes with "accepted": until then the cancel waits.
        if self.conversation_id is not None:
            self.client.send(p.Cancel(conversation_id=self.conversation_id))
        else:
            self.cancel_pending = True
        self.cancelling = True
        self.notice("cancelling the turn (Ctrl-C again to exit)")

    def open_history(self) -> None:
        if self.conversation_id is None:
            self.notice("no conversation yet")
            return
        self.replaying = True
        self.history = []
        self.client.send(p.Open(conversation_id=self.conversation_id, after_seq=0))

    def answer(self, line: str) -> bool:
        """Answer the pending prompt with ``line``; False when it is not an answer."""
        if self.prompt is None:
            return False
        if self.prompt.get("form") is not None:
            return self._fill(line)
        choice = ANSWERS.get(line.strip().lower()[:1])
        if choice is None:
            self.ask()
            return True
        self.client.send(p.Answer(request_id=self.prompt["request_id"], answer=choice))
        self.prompt = None
        return True

    def _fill(self, line: str) -> bool:
        """A form (a server's question): a JSON object of its fields, or ``d`` to decline.
        The daemon checks the fields against the form; a bad answer is rejected and the
        request stays pending."""
        assert self.prompt is not None
        text = line.strip()
        request_id = self.prompt["request_id"]
        if text.lower() in ("d", "deny", "decline"):
            self.client.send(p.Answer(request_id=request_id, answer="deny"))
            self.prompt = None
            return True
        try:
            content = json.loads(text)
        except ValueError:
            content = None
        if not isinstance(content, dict):
            self.ask()
            return True
        self.client.send(p.Answer(request_id=request_id, answer="allow_once", content=content))
        self.prompt = None
        return True

    def daemon_gone(self) -> bool:
        """True (and said) when the daemon's process is gone."""
        if self.home is None or control.read_pid(self.home) is not None:
            return False
        self.notice("the daemon stopped")
        return True

    def ping(self) -> None:
        if time.monotonic() - self.last_ping > PING_EVERY:
            self.client.send(p.Ping())
            self.last_ping = time.monotonic()

    # -- showing ----------------------------------------------------------------------
    def notice(self, text: str) -> None:
        self.end_line()
        print(text, file=self.err, flush=True)

    def you(self) -> None:
        """The input prompt, the cursor left after it (not on the next line)."""
        self.end_line()
        self.err.write(YOU)
        self.err.flush()
        self.at_prompt = True

    def typed(self) -> None:
        """The person pressed Enter: the terminal's echo ended the prompt's line."""
        self.at_prompt = False

    def save(self, where: str) -> None:
        if not self.media:
            self.notice("nothing to save: no tool sent an image, a sound or a file")
            return
        folder = Path(where or ".").expanduser()
        if not folder.is_dir():
            self.notice(f"not a folder: {folder}")
            return
        saved = []
        for n, item in enumerate(self.media, 1):
            try:
                saved.append(item.save(folder, n))
            except OSError as exc:
                self.notice(f"cannot save to {folder}: {exc.strerror or exc}")
                return
        self.media = []
        for path in saved:
            self.notice(f"saved {path}")

    def end_line(self) -> None:
        if self.midline:
            print(file=self.out, flush=True)
            self.midline = False
        if self.at_prompt:  # news while "you> " waits: below it, and the prompt again after
            print(file=self.err, flush=True)
            self.at_prompt = False

    def ask(self) -> None:
        if self.prompt is None:
            return
        req = self.prompt
        form = req.get("form")
        if isinstance(form, dict):
            props = form.get("properties")
            names = (
                ", ".join(one_line(str(k), 40) for k in props) if isinstance(props, dict) else ""
            )
            self.notice(
                f"  ? {one_line(req.get('act_summary', ''))}\n"
                f"    fields: {names}\n"
                '    answer with a JSON object of the fields (e.g. {"name": "..."}), or [d]eny: '
            )
            return
        reach = f"    {reach_line(str(req['reach']))}\n" if req.get("reach") else ""
        notes = "".join(f"    note: {one_line(str(n))}\n" for n in req.get("notes") or ())
        self.notice(
            f"  ? {one_line(req.get('tool', ''), 64)} wants"
            f" {one_line(req.get('permission', ''), 64)}:"
            f" {one_line(req.get('act_summary', ''))}\n"
            f"{reach}"
            f"{notes}"
            f"    {params_line(req.get('params', {}))}\n"
            "    allow [o]nce, [a]lways, or [d]eny? "
        )

    def show(self, frame: Frame) -> None:
        """Render one frame from the daemon."""
        kind = frame.get("type")
        if self.replaying and "seq" in frame:
            self._remember(frame)
            if kind == "permission_request":
                self.prompt = frame
            elif kind == "permission_settled" and self._is_prompt(frame):
                self.prompt = None
            return
        if kind == "opened":
            if self.replaying:
                self.replaying = False
                self.notice("\n".join(self.history) or "(nothing yet)")
                self.ask()
                if self.prompt is None and not self.waiting:
                    self.you()
            return
        if kind == "accepted":
            self.conversation_id = str(frame["conversation_id"])
            self.turn_id = frame.get("turn_id")
            if self.cancel_pending:
                self.cancel_pending = False
                self.client.send(p.Cancel(conversation_id=self.conversation_id))
            if frame.get("queued"):
                self.notice("  (queued behind the running turn)")
        elif kind == "turn_started":
            # Live events of a known conversation may overtake the "accepted" reply.
            if frame.get("client_msg_id") == self.client_msg_id:
                self.turn_id = frame.get("turn_id")
        elif kind == "text_delta":
            if frame.get("turn_id") == self.turn_id or self.turn_id is None:
                self.out.write(str(frame.get("text", "")))
                self.out.flush()
                self.midline = True
        elif kind == "tool_started":
            tool = one_line(frame.get("tool", ""), 64)
            self.notice(f"  · {tool}: {one_line(frame.get('act_summary', ''))}")
        elif kind == "tool_finished" and frame.get("status") != "success":
            tool = one_line(frame.get("tool", ""), 64)
            self.notice(
                f"  · {tool} {one_line(frame.get('status'), 32)}: {one_line(frame.get('code'), 64)}"
            )
        elif kind == "permission_request":
            self.prompt = frame
            self.ask()
        elif kind == "permission_settled":
            if self._is_prompt(frame):
                self.prompt = None
                self.notice(f"  (answered elsewhere: {one_line(frame.get('answer'), 32)})")
        elif kind == "rich_payload":
            found = Media.of(frame)
            if found:
                self.media.extend(found)
                tool = one_line(frame.get("tool", ""), 64)
                for item in found:
                    self.notice(
                        f"  · {tool} sent {one_line(item.kind, 16)} "
                        f"({one_line(item.mime, 60)}, {len(item.data)} bytes): "
                        "/save [DIR] writes it to a file"
                    )
        elif kind == "agent_exchange":
            self._exchange(frame)
        elif kind == "background_result":
            self.notice(f"  [background] {one_line(frame.get('envelope', ''), 400)}")
        elif kind == "error":
            self.notice(f"error: {one_line(frame.get('message', ''), 400)}")
        elif kind == "rejected":
            self.notice(
                f"refused ({one_line(frame.get('code'), 64)}):"
                f" {one_line(frame.get('message'), 400)}"
            )
            if self.waiting and frame.get("code") != "overloaded":
                self.waiting = False
                self.failed = True
        elif kind == "turn_finished":
            self._finished(frame)

    def _finished(self, frame: Frame) -> None:
        mine = frame.get("turn_id") == self.turn_id
        self.end_line()
        reason = frame.get("reason")
        if reason == "model-error":
            # The turn's line already says "The model could not answer: <why>".
            self.notice(one_line(frame.get("text", "") or "the model could not answer", 400))
        elif reason != "final":
            self.notice(
                f"(turn ended: {one_line(reason, 32)}) {one_line(frame.get('text', ''), 400)}"
            )
        if mine:
            self.waiting = False
            self.cancelling = False
            self.failed = reason not in ("final",)
            self.prompt = None

    def _exchange(self, frame: Frame) -> None:
        """An agent's loop_in_human exchange (live, or kept while no owner was connected);
        one that needs an approval is asked like a permission request of this chat."""
        from chalie.mcp_server.exchange import AgentExchange, summary

        try:
            exchange = msgspec.convert(frame, AgentExchange)
        except msgspec.ValidationError:
            return
        self.notice(f"  [agent] {summary(exchange)}")
        if exchange.phase == "permission" and exchange.request_id and self.prompt is None:
            self.prompt = {
                "type": "permission_request",
                "request_id": exchange.request_id,
                "tool": exchange.tool,
                "permission": exchange.permission,
                "act_summary": exchange.act_summary,
                "form": exchange.form,
            }
            self.ask()

    def _is_prompt(self, frame: Frame) -> bool:
        return self.prompt is not None and frame.get("request_id") == self.prompt.get("request_id")

    def _remember(self, frame: Frame) -> None:
        kind = frame.get("type")
        if kind == "turn_started":
            self.history.append(f"you> {one_line(frame.get('text', ''), 2000)}")
        elif kind == "turn_finished":
            self.history.append(f"chalie> {one_line(frame.get('text', ''), 4000)}")


def _connect(home: Any) -> tuple[ChatClient, list[Frame]]:
    """The session, and the frames that came before its first answer (what an owner gets
    at once: the agents' exchanges kept while nobody was connected)."""
    if control.read_pid(home) is None:
        raise click.ClickException(f"no daemon running on {home} (start it with `chalie run`)")
    try:
        client = ChatClient.local(home)
    except ChatUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    client.send(p.Ping())
    early: list[Frame] = []
    deadline = time.monotonic() + HELLO_WAIT
    while time.monotonic() < deadline:
        frame = client.receive(0.2)
        if frame is not None and frame.get("type") == "pong":
            return client, early
        if frame is not None:
            early.append(frame)
        if control.read_pid(home) is None:
            break
    client.close()
    raise click.ClickException(f"the daemon on {home} does not answer on its chat socket")


def _pipe(chat: TerminalChat, text: str) -> int:
    if not text.strip():
        raise click.ClickException("nothing to send: stdin was empty")
    chat.say(text.strip())
    try:
        while chat.waiting:
            chat.ping()
            frame = chat.client.receive(1.0)
            if frame is None and chat.daemon_gone():
                return 1
            if frame is not None:
                chat.show(frame)
                if frame.get("type") == "permission_request":
                    chat.notice("    (no terminal here: answer from another client)")
    except KeyboardInterrupt:
        chat.cancel()
        return 130
    chat.end_line()
    return 1 if chat.failed else 0


def _interactive(chat: TerminalChat, stdin: TextIO) -> int:
    poller = zmq.Poller()
    poller.register(chat.client.sock, zmq.POLLIN)
    poller.register(stdin, zmq.POLLIN)
    chat.notice(HELP)
    if chat.conversation_id is not None:
        chat.open_history()
    else:
        chat.you()
    while True:
        try:
            ready = dict(poller.poll(1000))
            if not ready and chat.daemon_gone():
                return 1
            chat.ping()
            if chat.client.sock in ready:
                frame = chat.client.receive(0)
                if frame is not None:
                    was_waiting = chat.waiting
                    chat.show(frame)
                    if was_waiting and not chat.waiting:
                        chat.you()
            if stdin.fileno() in ready or stdin in ready:
                line = stdin.readline()
                chat.typed()
                if not line:
                    return 0
                if not _line(chat, line.rstrip("\n")):
                    return 0
                if not (chat.waiting or chat.replaying or chat.prompt or chat.at_prompt):
                    chat.you()  # after a command: the prompt comes back
        except KeyboardInterrupt:
            if chat.waiting and not chat.cancelling:
                chat.cancel()
                continue
            chat.notice("bye")
            return 130  # left by Ctrl-C, as a shell expects


def _line(chat: TerminalChat, line: str) -> bool:
    """Act on one typed line; False to leave."""
    if chat.answer(line):
        return True
    text = line.strip()
    if not text:
        return True
    if text in ("/quit", "/exit"):
        return False
    if text == "/new":
        if chat.conversation_id is not None:
            chat.client.send(p.Close(conversation_id=chat.conversation_id))
        chat.conversation_id = None
        chat.notice("a new conversation starts with your next message")
    elif text == "/history":
        chat.open_history()
    elif text == "/save" or text.startswith("/save "):
        chat.save(text[len("/save") :].strip())
    elif text.startswith("/"):
        chat.notice(HELP)
    elif chat.waiting:
        chat.notice("a turn is running: wait for it, or Ctrl-C to cancel it")
    else:
        chat.say(text)
    return True


@cli.command("chat")
@click.option("--conversation", "conversation_id", help="Resume this conversation.")
@click.option(
    "--channel", default="chat", show_default=True, help="The channel of a new conversation."
)
@click.pass_obj
def chat_command(obj: Ctx, conversation_id: str | None, channel: str) -> None:
    """Talk to Chalie in the terminal (or pipe one message in: `echo hi | chalie chat`)."""
    client, early = _connect(obj.home)
    chat = TerminalChat(
        client,
        channel=channel,
        conversation_id=conversation_id,
        out=sys.stdout,
        err=sys.stderr,
        home=obj.home,
    )
    try:
        if sys.stdin.isatty():
            for frame in early:
                chat.show(frame)
            code = _interactive(chat, sys.stdin)
        else:
            code = _pipe(chat, sys.stdin.read())
    finally:
        client.leave()
    sys.stdout.flush()
    if code:
        sys.exit(code)
