"""Delegates: a tool call that runs a whole sub-turn on another channel and answers with sources.

``web_search`` and ``web_browse`` (abilities/) are delegates. One call:

1. The ability asks the :class:`DelegatePort` (``services.delegates``, made by
   the composition root over the conversations port) to run ``task`` as a
   turn of a new conversation on the delegate channel (``web-search``,
   ``web-browse``): that channel's pinned raw tools, no find_tools, its model,
   prompt and guards. The turn goes through the same TurnActor and dispatcher
   as any other; its conversation's origin names the parent call
   (:func:`origin_for`), so every inner call's trail row carries the parent
   call id.
2. The ability waits, looking at its ``cancelled`` event: a cancel of the
   parent turn (which cancels this call) cancels the sub-turn.
3. :func:`answer_with_sources` turns the sub-turn's answer and its calls (each
   one's status and rich payload, read from the sub-turn's events) into the
   body (answer, then sources: title, URL, the passage used) and the rich
   payload (the sources and every inner call's result).

Everything here is pure: the port's implementation lives with the actors, the
abilities' base class in :mod:`chalie.calls.delegate_ability`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import chalie.calls.untrusted as untrusted
from chalie.result import ToolResult
from chalie.wire.messages import TurnContext

ORIGIN_PREFIX: Final = "delegate:"
MAX_SOURCES: Final = 12
MAX_PASSAGE: Final = 400
_URL: Final = re.compile(r"https?://[^\s<>\"')\]]+")
_SENTENCE: Final = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD: Final = re.compile(r"[a-z0-9]{3,}")
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
    """How the sub-turn ended: its reason and text, and each of its calls in the order they
    finished (``tool``, ``status``, ``code``, ``payload``: the call's rich payload)."""

    conversation_id: str
    turn_id: str
    reason: str
    text: str
    results: Sequence[dict[str, Any]] = ()


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


def gather(results: Sequence[dict[str, Any]]) -> dict[str, Source]:
    """Every page the sub-turn read or saw (URL -> Source), from its calls' rich payloads.

    Our web tools put what they read in their payload (chalie.web.results): a page
    as ``{"source": {title, url, text}}``, search hits as ``{"results": [...]}``.
    """
    pages: dict[str, Source] = {}
    for result in results:
        payload = result.get("payload")
        if result.get("status") != "success" or not isinstance(payload, dict):
            continue
        source = payload.get("source")
        if result.get("tool") in _FETCHERS and isinstance(source, dict):
            url = source.get("url")
            if isinstance(url, str) and url:
                title = str(source.get("title") or url)
                pages[url] = Source(title, url, text=str(source.get("text") or ""), read=True)
        hits = payload.get("results")
        if result.get("tool") == "search" and isinstance(hits, list):
            for row in hits:
                if isinstance(row, dict) and isinstance(row.get("url"), str):
                    pages.setdefault(
                        row["url"],
                        Source(
                            str(row.get("title") or row["url"]),
                            row["url"],
                            text=str(row.get("snippet") or ""),
                        ),
                    )
    return pages


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
    pages = gather(run.results)
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
        "results": list(run.results),
    }
    return untrusted.success(
        "\n".join(lines),
        rich=rich,
        meta={
            "delegate": channel,
            "sources": len(sources),
            "calls": len(run.results),
            "delegate_conversation": run.conversation_id,
        },
    )
