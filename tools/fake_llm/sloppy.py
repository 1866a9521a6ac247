"""Scripts of a sloppy small model: each way a 1-8B model was seen to get tool calling wrong.

Each :class:`Sloppy` is a conversation: the user's prompt, a script for the
scripted model that reacts the way such a model does (it copies example
values it is shown, calls what a hint names, repeats a call while tools are
offered, recites a hint it cannot act on), the channel kind it runs on, and
what the answer holds when the turn went right (the right tool's result, or
a plain answer where no tool fits). Tests run each through a real daemon;
``tools/bench/bench_models.py`` runs them all for the figure.

Channel kinds: ``finding`` offers find_tools and no pins; ``direct`` pins the
clock and the calculator and offers no find_tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final, Literal

Kind = Literal["finding", "direct"]

ANSWER: Final[dict[str, Any]] = {"text": "Here it is: {last_result}"}
# What a model that has the result but keeps calling does, unless told to answer.
STOP_CASES: Final = [
    {"tools": False, "then": ANSWER},
    {"result_has": "do not call a tool again", "then": ANSWER},
]
# A model that cannot act on an error recites it to the user.
RECITE: Final[dict[str, Any]] = {"text": "{last_result}"}
ON_ERROR: Final = {"result_has": "status=error", "then": RECITE}
TOKYO: Final = '"zone":"Asia/Tokyo"'


@dataclass(frozen=True)
class Sloppy:
    name: str
    pattern: str
    prompt: str
    kind: Kind
    script: dict[str, Any]
    expect: str  # the answer holds this when the turn went right
    wire: str = "openai"
    tags: tuple[str, ...] = field(default=())


def call(name: str, arguments: Any = None, *, raw: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if raw is not None:
        out["raw"] = raw
    else:
        out["arguments"] = arguments if arguments is not None else {}
    return out


def step(*calls: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"tool_calls": list(calls), **extra}


def written(name: str, arguments: dict[str, Any], form: str) -> dict[str, Any]:
    """A step whose call is written into the content, in one of the forms seen."""
    body = json.dumps({"name": name, "arguments": arguments})
    text = {
        "bare": body,
        "fence": f"```json\n{body}\n```",
        "tags": f"<tool_call>\n{body}\n</tool_call>",
        "doubled": body.replace("{", "{{").replace("}", "}}"),
        "prose": f"Let me work that out.\n```json\n{body}\n```",
    }[form]
    return {"text": text, "chunk": 7}


def find(*entries: str, summary: str = "finding tools") -> dict[str, Any]:
    return call("find_tools", {"query": list(entries), "act_summary": summary})


def calc(expression: str, summary: str | None = "working it out") -> dict[str, Any]:
    args: dict[str, Any] = {"expression": expression}
    if summary is not None:
        args["act_summary"] = summary
    return call("calculator", args)


def clock(zone: str = "Asia/Tokyo", summary: str | None = "reading the clock") -> dict[str, Any]:
    args: dict[str, Any] = {"zone": zone}
    if summary is not None:
        args["act_summary"] = summary
    return call("clock", args)


def result(value: str) -> str:
    return f'"result":"{value}"'


def _then_answer(*first: dict[str, Any]) -> dict[str, Any]:
    """The given steps, then: answer with the result (reciting an error instead)."""
    return {"steps": list(first), "on_tool": {"cases": [ON_ERROR], **ANSWER}, "on_user": ANSWER}


def _repeat_until_told(first: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """One call, then the same call again for as long as tools are offered and no note says stop."""
    return {
        "steps": [first],
        "on_tool": {"cases": [*STOP_CASES, ON_ERROR], **again},
        "on_user": ANSWER,
    }


def library() -> list[Sloppy]:
    """Every conversation: the patterns of issue 24, a few in two wires, and clean ones."""
    out: list[Sloppy] = []

    def add(*args: Any, **kw: Any) -> None:
        out.append(Sloppy(*args, **kw))

    # 1. Calls written as text, in each form, on both channel kinds.
    for form in ("bare", "fence", "tags", "doubled", "prose"):
        add(
            f"text-{form}-direct",
            "text-call",
            "what is 17 times 3",
            "direct",
            _then_answer(written("calculator", {"expression": "17*3"}, form)),
            result("51"),
        )
    add(
        "text-tags-finding",
        "text-call",
        "what time is it in Tokyo",
        "finding",
        _then_answer(
            written("find_tools", {"query": ["what time is it"]}, "tags"),
            written("clock", {"zone": "Asia/Tokyo"}, "bare"),
        ),
        TOKYO,
    )
    add(
        "text-fence-ollama",
        "text-call",
        "what is 2 to the power of 10",
        "direct",
        _then_answer(written("calculator", {"expression": "2**10"}, "fence")),
        result("1024"),
        wire="ollama",
    )
    # 2. act_summary missing, empty, or its description copied.
    add(
        "summary-missing",
        "act-summary",
        "1234 times 5678",
        "direct",
        _then_answer(step(calc("1234*5678", None))),
        result("7006652"),
    )
    add(
        "summary-copied",
        "act-summary",
        "split 187 euros between 4 people",
        "direct",
        _then_answer(
            step(calc("187/4", "A short tooltip shown to the user while this call runs."))
        ),
        result("46.75"),
    )
    add(
        "summary-missing-finding",
        "act-summary",
        "what time is it in Tokyo",
        "finding",
        _then_answer(step(find("clock", summary="")), step(clock(summary=None))),
        TOKYO,
    )
    # 3. Empty answers after a good call.
    add(
        "empty-after-result",
        "empty-answer",
        "what is 99 times 99",
        "direct",
        {"steps": [step(calc("99*99")), {"text": ""}], "on_user": ANSWER, "on_tool": ANSWER},
        result("9801"),
    )
    add(
        "empty-after-find",
        "empty-answer",
        "what time is it in Tokyo",
        "finding",
        {
            "steps": [step(find("clock")), {"text": "  "}, step(clock())],
            "on_tool": ANSWER,
            "on_user": ANSWER,
        },
        TOKYO,
    )
    # 4. Example values copied from the descriptions.
    copying = {
        "cases": [{"described": "17.5*3", "then": step(calc("(17.5*3)/4 + sqrt(2)"))}],
        **step(calc("17.5*240/100")),
    }
    add(
        "copied-expression",
        "copied-example",
        "what is 17.5 percent of 240",
        "direct",
        _then_answer(copying),
        result("42"),
    )
    zone_copy = {
        "cases": [{"described": "Europe/Malta", "then": step(clock("Europe/Malta"))}],
        **step(clock()),
    }
    add(
        "copied-zone",
        "copied-example",
        "what time is it in Tokyo",
        "direct",
        _then_answer(zone_copy),
        TOKYO,
    )
    find_copy = {
        "cases": [
            {
                "described": "convert a time between time zones",
                "then": step(find("convert a time between time zones")),
            },
            {"described": "'clock'", "then": step(clock())},  # named in find_tools' description
        ],
        **step(find("the time in a city")),
    }
    add(
        "copied-find-example",
        "copied-example",
        "what time is it in Tokyo",
        "finding",
        {
            "steps": [find_copy],
            "on_tool": {
                "cases": [
                    {"offered": "clock", "then": step(clock())},
                    {"result_has": "status=success", "then": ANSWER},
                    ON_ERROR,
                ],
                **ANSWER,
            },
        },
        TOKYO,
    )
    # 5. Invented tool names.
    for invented, args, expr, value in (
        ("multiply", {"a": 17, "b": 3}, "17*3", "51"),
        ("calculate", {"expression": "0.15*240"}, "0.15*240", "36"),
        ("calculate_percentage", {"percent": 15, "of": 240}, "0.15*240", "36"),
        ("math", {"expression": "sqrt(2)*pi"}, "sqrt(2)*pi", "4.442882938158366"),
    ):
        for kind in ("direct", "finding"):
            add(
                f"invented-{invented}-{kind}",
                "invented-name",
                f"please {invented.replace('_', ' ')}",
                kind,
                _then_answer(
                    step(call(invented, args)), step(call("$suggested", {"expression": expr}))
                ),
                result(value),
            )
    add(
        "called-without-find",
        "invented-name",
        "what time is it in Tokyo",
        "finding",
        _then_answer(step(clock()), step(call("$suggested", {"zone": "Asia/Tokyo"}))),
        TOKYO,
    )
    add(
        "invented-after-find",
        "invented-name",
        "what is sqrt(2) times pi",
        "finding",
        _then_answer(
            step(find("math")),
            step(call("math", {"expression": "sqrt(2)*pi"})),
            step(call("$suggested", {"expression": "sqrt(2)*pi"})),
        ),
        result("4.442882938158366"),
    )
    add(
        "invented-sentence",
        "invented-name",
        "what is 15% of 240",
        "finding",
        _then_answer(
            step(call("what_is_15_percent_of_240", {})),
            step(call("$suggested", {"expression": "0.15*240"})),
        ),
        result("36"),
    )
    add(
        "invented-as-text",
        "invented-name",
        "multiply 17 by 3",
        "direct",
        _then_answer(
            written("multiply", {"a": 17, "b": 3}, "bare"),
            step(call("$suggested", {"expression": "17*3"})),
        ),
        result("51"),
    )
    # 6. find_tools' arguments as a bare array, a single string, a JSON string, an alias.
    add(
        "bare-array",
        "bare-array",
        "what time is it in Tokyo",
        "finding",
        _then_answer(step(call("find_tools", raw='["clock"]')), step(clock())),
        TOKYO,
    )
    add(
        "bare-array-as-text",
        "bare-array",
        "what time is it in Tokyo",
        "finding",
        _then_answer({"text": '{"name": "find_tools", "arguments": ["clock"]}'}, step(clock())),
        TOKYO,
    )
    add(
        "single-string-query",
        "healing",
        "what time is it in Tokyo",
        "finding",
        _then_answer(
            step(call("find_tools", {"query": "clock", "act_summary": "x"})), step(clock())
        ),
        TOKYO,
    )
    add(
        "json-string-query",
        "healing",
        "what time is it in Tokyo",
        "finding",
        _then_answer(
            step(call("find_tools", {"query": '["clock"]', "act_summary": "x"})), step(clock())
        ),
        TOKYO,
    )
    add(
        "alias-expr",
        "healing",
        "2 to the 64",
        "direct",
        _then_answer(step(call("calculator", {"expr": "2**64", "act_summary": "x"}))),
        result("18446744073709551616"),
    )
    add(
        "alias-timezone",
        "healing",
        "what time is it in Tokyo",
        "direct",
        _then_answer(step(call("clock", {"timezone": "Asia/Tokyo"}))),
        TOKYO,
    )
    # 0. A result, then the same call again.
    for kind, first in (("direct", None), ("finding", find("clock"))):
        script = _repeat_until_told(step(clock()), step(clock()))
        if first is not None:
            script["steps"] = [step(first), step(clock())]
        add(
            f"repeat-after-result-{kind}", "repeat", "what time is it in Tokyo", kind, script, TOKYO
        )
    add(
        "repeat-calculator",
        "repeat",
        "sqrt(2)*pi please",
        "direct",
        _repeat_until_told(step(calc("sqrt(2)*pi")), step(calc("sqrt(2)*pi", "again"))),
        result("4.442882938158366"),
    )
    # 7 and 8. not_found, and "hello".
    greet = {"text": "Hello! How can I help?"}
    add(
        "hello-find-tools",
        "hello",
        "hello",
        "finding",
        {
            "steps": [step(find("hello"))],
            "on_tool": {
                "cases": [{"result_has": "answer the user from what you know", "then": greet}],
                **step(find("hello", summary="searching again")),
            },
        },
        "Hello! How can I help?",
    )
    add(
        "not-found-then-invented",
        "not-found",
        "convert 100 dollars to euros",
        "finding",
        {
            "steps": [step(find("currency exchange"))],
            "on_tool": {
                "cases": [
                    {
                        "result_has": "without a tool",
                        "then": {"text": "I cannot convert currencies."},
                    },
                    {"result_has": "unknown-tool", "then": RECITE},
                ],
                **step(call("currency_exchange", {"amount": 100})),
            },
        },
        "I cannot convert currencies.",
    )
    # A hint meant for the model, told to the user as the answer.
    add(
        "hint-recited",
        "hint-recited",
        "what is the weather in Valletta",
        "direct",
        {
            "steps": [step(call("weather", {"city": "Valletta"})), step(call("$suggested"))],
            "on_user": {"text": "I cannot check the weather here."},
        },
        "I cannot check the weather here.",
    )
    # Clean conversations: the calls a good model makes.
    add(
        "clean-clock",
        "clean",
        "what time is it in Tokyo",
        "finding",
        _then_answer(step(find("clock")), step(clock())),
        TOKYO,
    )
    add(
        "clean-calculator",
        "clean",
        "what is 17 times 3",
        "direct",
        _then_answer(step(calc("17*3"))),
        result("51"),
    )
    add("clean-no-tool", "clean", "say hi", "finding", {"steps": [greet]}, "Hello! How can I help?")
    add(
        "clean-ollama",
        "clean",
        "what time is it in Tokyo",
        "direct",
        _then_answer(step(clock())),
        TOKYO,
        wire="ollama",
    )
    return out
