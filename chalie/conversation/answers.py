"""Whether a model's final text is an answer a person can use, and the notes that ask for one.

Small local models end a step with text that is not an answer: only markup
(a lone code fence, ``<tools></tools>``, a copy of a result envelope), a recital
of a tool's schema, or a call described instead of made ("you can call the
``clock`` function with zone Asia/Tokyo", "you can use the following Python
code"). Seen with Qwen2.5-Coder-1.5B on llama.cpp (the real-models issue): such
text was accepted as the turn's answer. :func:`unfit` names what is wrong;
the turn then asks once more (:func:`retry_note`) and never ends "final" on it.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Final, Literal

Unfit = Literal["", "markup", "schema", "described-call"]

# Tags and envelope lines that only a template or the runtime writes.
_MARKUP: Final = re.compile(
    r"</?(?:tools?|tool_calls?|tool_response|function_calls?|functions?|functioncall)\b[^>]*>"
    r"|\[end:[\w-]+\]|^\s*\[[\w-]+\(status=",
    re.I | re.M,
)
_FENCE_OR_TAG: Final = re.compile(r"```[\w-]*|<[^>\n]{0,80}>")
_SCHEMA: Final = re.compile(
    r'"(?:properties|input_schema|parameters)"\s*:\s*\{|"type"\s*:\s*"object"'
)
# Code offered instead of a result: a fenced program, or "the following code".
_CODE: Final = re.compile(
    r"```(?:python|py|javascript|js|bash|sh)\b|\b(?:following|this|the below)\s+"
    r"(?:python\s+)?(?:code|function call|tool call|json)\b",
    re.I,
)
# A call written out as an object, whatever its name ("Let's call it find_capital: {"name":
# "find_capital", "arguments": ...}"): the 1.5B model's way of not making a call.
_CALL_SHAPED: Final = re.compile(r'\{\s*"name"\s*:\s*"[^"\n]{1,128}"\s*,\s*"arguments"\s*:')
_VERB: Final = r"(?:call(?:ing)?|use|using|invoke|invoking|run(?:ning)?)"


def _tool_mention(names: Collection[str]) -> re.Pattern[str] | None:
    """A call of one of ``names`` described in words: "call the `clock` function",
    "use clock with ...", "the find_tools tool"."""
    if not names:
        return None
    alt = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(
        rf"{_VERB}\s+(?:the\s+)?[`'\"*]*(?:{alt})[`'\"*]*(?:\s+with\b|\(|\s*$)"
        rf"|{_VERB}\s+(?:the\s+)?[`'\"*]*[A-Za-z_]\w*[`'\"*]*\s+(?:function|tool|action)\b"
        rf"|[`'\"*]+(?:{alt})[`'\"*]+\s+(?:function|tool)\b"
        rf"|\b(?:{alt})\((?:[^()]{{0,200}})\)",
        re.I,
    )


def unfit(text: str, offered: Collection[str] = ()) -> Unfit:
    """Why ``text`` cannot be a turn's answer ('' when it can).

    ``offered``: the tools of the request; a call to one of them described in
    words is not an answer. Plain prose that names a tool in passing ("your
    calendar shows...") is one.
    """
    stripped = text.strip()
    if not stripped:
        return ""  # empty is the turn's own case (the empty-answer nudge)
    if _MARKUP.search(stripped) or not re.search(r"\w", _FENCE_OR_TAG.sub("", stripped)):
        return "markup"
    if _SCHEMA.search(stripped):
        return "schema"
    if _CODE.search(stripped) or _CALL_SHAPED.search(stripped):
        return "described-call"
    meta = {"find_tools", "find_skills"}
    pattern = _tool_mention({*offered, *meta})
    if pattern is not None and pattern.search(stripped):
        return "described-call"
    return ""


RETRY_NOTES: Final[dict[Unfit, str]] = {
    "markup": "That was markup, not an answer. Answer the user in plain words.",
    "schema": "That was a tool's schema, not an answer. Answer the user in plain words.",
    "described-call": (
        "Do not describe a tool call. Make the call now if you need it; "
        "otherwise answer the user in plain words."
    ),
}


def retry_note(reason: Unfit) -> str:
    return RETRY_NOTES.get(reason, "Answer the user in plain words.")


# After a tool succeeded: the model often answers how it would do it, not what it found.
ANSWER_NOTE: Final = (
    "Answer the user now with this result, stating the values it gives, in plain words. "
    "Call another tool only if the request needs one."
)


# How much of an answer is held before it is shown: enough for "To find the time in
# Tokyo, you can call the `clock` function" to be read as a described call.
HOLD_CHARS: Final = 160
_SENTENCE_END: Final = re.compile(r"[.!?:]\s|\n")


class HeldAnswer:
    """Streamed text held until its start reads as an answer (:func:`unfit` says nothing).

    A start that is no answer is held to the end of the step, where the turn refuses
    it: the person never sees it stream. A fit start is shown and the rest streams on.
    """

    def __init__(self, offered: Collection[str]) -> None:
        self._offered = tuple(offered)
        self._held = ""
        self._state: Literal["reading", "open", "shut"] = "reading"

    def feed(self, text: str) -> str:
        """What may be shown now."""
        if self._state == "open":
            return text
        self._held += text
        if self._state == "shut":
            return ""
        if len(self._held) < HOLD_CHARS and not _SENTENCE_END.search(self._held):
            return ""
        if unfit(self._held, self._offered):
            self._state = "shut"
            return ""
        self._state = "open"
        out, self._held = self._held, ""
        return out

    def release(self) -> str:
        """At the step's end: what is still held, unless it is no answer (then nothing)."""
        out, self._held = self._held, ""
        if self._state == "shut" or unfit(out, self._offered):
            return ""
        return out
