"""Delegates: a tool call that runs a whole sub-turn on another channel and answers with sources.

``web_search`` and ``web_browse`` (abilities/) are delegates. One call:

1. The ability asks the :class:`DelegatePort` (``services.extra["delegates"]``,
   made by the composition root over the conversations) to run ``task`` as a
   turn of a new conversation on the delegate channel (``web-search``,
   ``web-browse``): that channel's pinned raw tools, no find_tools, its model,
   prompt and guards. The turn goes through the same TurnActor and dispatcher
   as any other; its conversation's origin names the parent call
   (:func:`origin_for`), so every inner call's trail row carries the parent
   call id.
2. The ability waits, looking at its ``cancelled`` event: a cancel of the
   parent turn (which cancels this call) cancels the sub-turn.
3. :func:`answer_with_sources` turns the sub-turn's answer and tool results
   into the body (answer, then sources: title, URL, the passage used) and the
   rich payload (the sources and every inner result in full).

Everything here is pure: the port's implementation lives with the actors.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Final, Protocol

import msgspec

from chalie import untrusted
from chalie.ability import Ability
from chalie.envelope import EnvelopeSyntaxError, parse
from chalie.messages import TurnContext
from chalie.providers.types import ChatMessage
from chalie.result import ToolResult

SERVICE_KEY: Final = "delegates"
ORIGIN_PREFIX: Final = "delegate:"
MAX_SOURCES: Final = 12
MAX_PASSAGE: Final = 400
_URL: Final = re.compile(r"https?://[^\s<>\"')\]]+")
_SENTENCE: Final = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD: Final = re.compile(r"[a-z0-9]{3,}")
# The result lines our own web tools write under the warning line (chalie.web.results).
_TITLE: Final = re.compile(r"^Title: (.*)$", re.M)
_URL_LINE: Final = re.compile(r"^URL: (\S+)$", re.M)
_FETCHERS: Final = frozenset({"web_fetch", "read", "browser"})
_OWN_SOURCES: Final = re.compile(r"^\W*sources\W*$", re.I | re.M)


def origin_for(parent_call: str) -> str:
    """The origin a delegate conversation is created with: it names the parent call."""
    return f"{ORIGIN_PREFIX}{parent_call}"[:128]


def parent_of(origin: str) -> str:
    """The parent call id of a delegate conversation's origin ('' for any other origin)."""
    return origin[len(ORIGIN_PREFIX) :] if origin.startswith(ORIGIN_PREFIX) else ""


@dataclass(frozen=True)
class DelegateRun:
    """How the sub-turn ended: its reason and text, and its transcript (for the sources)."""

    conversation_id: str
    turn_id: str
    reason: str
    text: str
    messages: Sequence[ChatMessage] = ()
    tools: Sequence[dict[str, Any]] = ()


class DelegateError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class DelegatePort(Protocol):
    def run(
        self,
        channel: str,
        task: str,
        *,
        parent: TurnContext | None,
        parent_call: str,
        cancelled: threading.Event,
        timeout: float,
    ) -> DelegateRun:
        """Run ``task`` as one turn on ``channel`` and wait for its end (DelegateError)."""
        ...


@dataclass
class Source:
    title: str
    url: str
    passage: str = ""
    text: str = field(default="", repr=False)
    read: bool = False  # fetched and read (not only seen in a search result)

    def as_dict(self) -> dict[str, str]:
        return {"title": self.title, "url": self.url, "passage": self.passage}


def _content(envelope: str) -> tuple[str, dict[str, Any], str] | None:
    """(tool, attributes, content below the warning line) of one stored tool result."""
    try:
        found = parse(envelope)
    except EnvelopeSyntaxError:
        return None
    if len(found) != 1:
        return None
    one = found[0]
    body = one.content
    if body.startswith(untrusted.WARNING_LINE + "\n"):
        body = body[len(untrusted.WARNING_LINE) + 1 :]
    return one.tool, one.attrs, body


def gather(messages: Sequence[ChatMessage]) -> tuple[dict[str, Source], list[dict[str, Any]]]:
    """Every page read (URL -> Source) and every result in full, from the sub-turn's messages."""
    pages: dict[str, Source] = {}
    found: list[dict[str, Any]] = []
    for message in messages:
        if message.role not in ("tool", "background"):
            continue
        parsed = _content(message.text)
        if parsed is None:
            continue
        tool, attrs, body = parsed
        found.append({"tool": tool, "status": attrs.get("status"), "body": body})
        if attrs.get("status") != "success":
            continue
        if tool in _FETCHERS:
            url = _URL_LINE.search(body)
            title = _TITLE.search(body)
            if url is not None:
                text = body.split("\n\n", 1)[1] if "\n\n" in body else body
                title_text = title.group(1) if title else url.group(1)
                pages[url.group(1)] = Source(title_text, url.group(1), text=text, read=True)
        elif tool == "search":
            try:
                rows = json.loads(body)
            except ValueError:
                continue
            for row in rows if isinstance(rows, list) else []:
                if isinstance(row, dict) and isinstance(row.get("url"), str):
                    pages.setdefault(
                        row["url"],
                        Source(
                            str(row.get("title") or row["url"]),
                            row["url"],
                            text=str(row.get("snippet") or ""),
                        ),
                    )
    return pages, found


def best_passage(text: str, answer: str) -> str:
    """The sentence of ``text`` sharing most words with ``answer`` (the passage the answer used)."""
    wanted = set(_WORD.findall(answer.lower()))
    best, score = "", 0
    for sentence in _SENTENCE.split(text):
        sentence = " ".join(sentence.split())
        if len(sentence) < 20:
            continue
        hits = len(wanted.intersection(_WORD.findall(sentence.lower())))
        if hits > score:
            best, score = sentence, hits
    return best[:MAX_PASSAGE]


def _strip_url(url: str) -> str:
    return url.rstrip(".,;:!?")


def sources_of(answer: str, pages: dict[str, Source]) -> list[Source]:
    """The sources of the answer: the URLs it cites, in its order, then the pages it read.

    A cited URL the delegate never read is kept (the model saw it in a result
    the transcript lost, or made it up: the person can check); each source's
    passage is the sentence of the page closest to the answer.
    """
    cited = [_strip_url(u) for u in _URL.findall(answer)]
    read = [u for u, s in pages.items() if s.read]
    out: list[Source] = []
    # A search hit neither read nor cited is not a source.
    for url in dict.fromkeys([*cited, *read]):
        page = pages.get(url)
        source = Source(page.title if page else url, url)
        if page is not None:
            source.passage = best_passage(page.text, answer) or page.text[:MAX_PASSAGE]
        out.append(source)
        if len(out) >= MAX_SOURCES:
            break
    return out


def answer_with_sources(run: DelegateRun, channel: str) -> ToolResult:
    """The delegate call's result: the answer and its sources, marked untrusted (they are
    made of what pages said); the full inner results as the rich payload."""
    if run.reason != "final":
        return ToolResult.error(
            "delegate-failed",
            f"the {channel} delegate stopped without an answer ({run.reason}): {run.text[:300]}",
            hint="Try again with a narrower task, or answer from what you know.",
            meta={"delegate": channel},
        )
    pages, found = gather(run.messages)
    answer = run.text.strip()
    sources = sources_of(answer, pages)
    if sources:
        # The model's own list of sources is replaced by the checked one below.
        answer = _OWN_SOURCES.split(answer, maxsplit=1)[0].rstrip() or answer
    lines = [answer or "(the delegate gave an empty answer)"]
    if sources:
        lines += ["", "Sources:"]
        for n, source in enumerate(sources, 1):
            lines.append(f"{n}. {source.title} - {source.url}")
            if source.passage:
                lines.append(f'    "{source.passage}"')
    rich = {
        "delegate": channel,
        "conversation_id": run.conversation_id,
        "answer": answer,
        "sources": [s.as_dict() for s in sources],
        "results": found,
        "tools": list(run.tools),
    }
    return untrusted.success(
        "\n".join(lines),
        rich=rich,
        meta={
            "delegate": channel,
            "sources": len(sources),
            "calls": len(found),
            "delegate_conversation": run.conversation_id,
        },
    )


class DelegateParams(msgspec.Struct, forbid_unknown_fields=True):
    """The task for the delegate, in plain words."""

    task: Annotated[
        str,
        msgspec.Meta(
            min_length=1, max_length=4000, description="what to find out or do, in plain words"
        ),
    ]


class DelegateAbility(Ability):
    """A tool whose run is one sub-turn on :attr:`channel` (see the module)."""

    abstract = True
    channel: ClassVar[str]
    Params = DelegateParams
    timeout = 600.0

    def run(self, params: DelegateParams) -> ToolResult:
        port = self.services.extra.get(SERVICE_KEY) if self.services is not None else None
        if port is None:
            return ToolResult.error(
                "delegate-failed",
                "delegates run inside the daemon only",
                hint="Ask the daemon (chalie chat or chalie ask), not a bare tool call.",
            )
        try:
            run = port.run(
                self.channel,
                params.task,
                parent=self.context,
                parent_call=self.call_id,
                cancelled=self.cancelled,
                timeout=self.timeout - 5,
            )
        except DelegateError as exc:
            return ToolResult.error(exc.code, exc.message, meta={"delegate": self.channel})
        return answer_with_sources(run, self.channel)
