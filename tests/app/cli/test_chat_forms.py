"""``chalie chat`` answers a form (a remote server's question) with a JSON object of its
fields, or declines it; anything else asks again (the daemon checks the fields)."""

from __future__ import annotations

import io
from typing import Any

from chalie.chat import protocol as p
from chalie_app.cli.chat import TerminalChat


class Sent:
    """The chat client's side the terminal writes to: what it sent."""

    def __init__(self) -> None:
        self.frames: list[Any] = []

    def send(self, frame: Any) -> None:
        self.frames.append(frame)


FORM_REQUEST = {
    "type": "permission_request",
    "request_id": "r1",
    "tool": "_mcp_cap_ask_name",
    "permission": "_mcp_cap.elicitation",
    "act_summary": "The MCP server cap asks: What is your name?",
    "params": {},
    "form": {"type": "object", "properties": {"name": {"type": "string"}}},
}


def terminal() -> tuple[TerminalChat, Sent, io.StringIO]:
    sent, err = Sent(), io.StringIO()
    chat = TerminalChat(
        sent,  # type: ignore[arg-type]
        channel="chat",
        conversation_id="c",
        out=io.StringIO(),
        err=err,
    )
    return chat, sent, err


def test_a_form_is_answered_with_its_fields() -> None:
    chat, sent, err = terminal()
    chat.prompt = dict(FORM_REQUEST)
    chat.ask()
    assert "fields: name" in err.getvalue() and "[d]eny" in err.getvalue()
    assert chat.answer("o") is True and sent.frames == []  # not an answer to a form
    assert chat.answer("[1, 2]") is True and sent.frames == []
    assert chat.answer('{"name": "Ann"}') is True
    (frame,) = sent.frames
    assert frame == p.Answer(request_id="r1", answer="allow_once", content={"name": "Ann"})
    assert chat.prompt is None


def test_a_form_is_declined_with_d() -> None:
    chat, sent, _ = terminal()
    chat.prompt = dict(FORM_REQUEST)
    assert chat.answer("d") is True
    assert sent.frames == [p.Answer(request_id="r1", answer="deny")]
