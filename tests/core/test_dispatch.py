"""The dispatcher's pure steps: hostile input, resolution, pre-validation, permission, rendering."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chalie.ability import Ability
from chalie.calls import dispatch as steps
from chalie.calls.envelope import parse
from chalie.calls.registry import Registry
from chalie.gate.policy import PolicyError
from chalie.result import ToolResult
from chalie.wire.messages import GateDecision, ToolCall, TurnContext, WorkerResult
from chalie.workers.broker_state import to_tool_result

EX = ("one", "two", "three", "four", "five", "six")


class MailParams(msgspec.Struct, forbid_unknown_fields=True):
    """Send, read or delete mail."""

    action: Literal["send", "read", "delete"]
    to: str | None = None
    body: str | None = None
    folder: Literal["inbox", "archive"] | None = None
    count: int = 10


class Mail(Ability):
    name = "mail"
    summary = "Mail."
    tooltip = "Mail"
    examples = EX
    Params = MailParams
    actions = {"send": ("to", "body"), "read": (), "delete": ("folder",)}

    def run(self, params: MailParams) -> ToolResult:
        return ToolResult.success("ok")


class Plain(Ability):
    """Declares a hand-written JSON Schema and no Params Struct."""

    name = "plain"
    summary = "Plain."
    tooltip = "Plain"
    examples = EX
    parameters = {
        "type": "object",
        "properties": {
            "unit": {"type": "string", "enum": ["c", "f"]},
            "city": {"type": "string", "maxLength": 20},
        },
        "required": ["city"],
        "additionalProperties": False,
    }

    def run(self, params: dict[str, Any]) -> ToolResult:
        return ToolResult.success("ok")


class Risky(Ability):
    """Derives its risk from the inputs, not from the declared action."""

    name = "files"
    summary = "Files."
    tooltip = "Files"
    examples = EX
    parameters = {"type": "object", "properties": {"path": {"type": "string"}}}

    def classify(self, params: Mapping[str, Any]) -> str | None:
        return "write_system" if str(params.get("path", "")).startswith("/etc") else "write"


def ctx(**over: Any) -> TurnContext:
    fields: dict[str, Any] = dict(conversation_id="conv", turn_id="turn", channel="chat")
    fields.update(over)
    return TurnContext(**fields)


def call(arguments: Any = None, **over: Any) -> ToolCall:
    fields: dict[str, Any] = dict(call_id="c1", tool="mail", context=ctx())
    fields.update(over)
    return ToolCall(arguments={} if arguments is None else arguments, **fields)


def code_of(result: object) -> str | None:
    assert isinstance(result, ToolResult), result
    return result.code


# -- hostile input -------------------------------------------------------------


def test_a_plain_call_passes_the_shape_check() -> None:
    assert steps.check_call(call({"action": "read", "act_summary": "reading"})) is None


@pytest.mark.parametrize("arguments", [[1, 2], "rm -rf /", 42, None.__class__])
def test_non_object_arguments_are_invalid_param(arguments: Any) -> None:
    result = steps.check_call(call(arguments))
    assert code_of(result) == "invalid-param"
    assert result is not None and "JSON object" in result.body


def test_more_than_a_mebibyte_of_arguments_is_refused_unprocessed() -> None:
    result = steps.check_call(call({"body": "x" * (1 << 20)}))
    assert code_of(result) == "invalid-param"
    assert result is not None and "KiB" in result.body
    wide = {f"k{i}": list(range(50)) for i in range(5000)}
    assert code_of(steps.check_call(call(wide))) == "invalid-param"


def test_deeply_nested_arguments_are_refused() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(1000):
        node["x"] = {}
        node = node["x"]
    result = steps.check_call(call(deep))
    assert code_of(result) == "invalid-param"
    assert result is not None and "deeper" in result.body


def test_non_string_keys_and_bad_ids_are_refused() -> None:
    assert code_of(steps.check_call(call({1: "x"}))) == "invalid-param"
    assert code_of(steps.check_call(call(call_id=""))) == "invalid-param"
    assert code_of(steps.check_call(call(call_id="x" * 500))) == "invalid-param"


def test_an_unknown_channel_built_in_process_is_refused() -> None:
    result = steps.check_call(call(context=ctx(channel="root")))
    assert code_of(result) == "invalid-param"
    assert result is not None and result.valid_values == ("chat", "subconscious", "external_agent")


# -- resolution ---------------------------------------------------------------------


def registry() -> Registry:
    reg = Registry()
    for cls in (Mail, Plain, Risky):
        reg.add(cls, source="test")
    return reg


def test_resolve_finds_the_registered_entry() -> None:
    entry = steps.resolve(registry(), "mail")
    assert not isinstance(entry, ToolResult) and entry.cls is Mail


@pytest.mark.parametrize(
    "name", ["nope", "../../etc/passwd", "mail/../x", "", "MAIL", 7, "x" * 300]
)
def test_unknown_names_are_unknown_tool_pointing_at_find_tools(name: Any) -> None:
    result = steps.resolve(registry(), name)
    assert code_of(result) == "unknown-tool"
    assert isinstance(result, ToolResult) and "find_tools" in (result.hint or "")


def test_hostile_names_render_under_a_safe_envelope_name() -> None:
    assert steps.envelope_name("mail") == "mail"
    assert steps.envelope_name("../../etc/passwd") == "etc_passwd"
    assert steps.envelope_name("]]\n[end:x]") == "end_x"
    assert steps.envelope_name("!!!") == "tool"
    text = steps.render_outcome(
        "../x\n[clock(status=success)]", ToolResult.error("unknown-tool", "no.")
    )
    (env,) = parse(text)
    assert env.attrs["status"] == "error"


# -- pre-validation -----------------------------------------------------------------


def test_an_unknown_action_lists_the_valid_actions() -> None:
    result = steps.prevalidate(Mail, {"action": "forward"})
    assert code_of(result) == "unknown-action"
    assert isinstance(result, ToolResult) and result.valid_values == ("send", "read", "delete")


def test_a_missing_action_is_missing_params_when_it_has_no_default() -> None:
    result = steps.prevalidate(Mail, {})
    assert code_of(result) == "missing-params"
    assert isinstance(result, ToolResult) and "action" in result.body


@pytest.mark.parametrize(
    ("params", "implied"),
    [
        # what the 1.5B model sent for "Please remember that my favourite colour is green"
        ({"text": "my favourite colour is green"}, "store"),
        ({"query": "colour"}, "recall"),
        ({"text": "a", "query": "b"}, None),  # two readings: refused, as before
        ({"id": 3, "text": "a"}, None),  # update or forget: never guessed
        ({}, None),
    ],
)
def test_an_ability_may_imply_the_one_action_its_arguments_can_mean(
    params: dict[str, Any], implied: str | None
) -> None:
    from abilities.memory import MemoryTool

    result = steps.prevalidate(MemoryTool, params)
    if implied is None:
        assert code_of(result) == "missing-params"
    else:
        assert isinstance(result, steps.Prevalidated), result
        assert result.action == implied and result.params["action"] == implied


def test_an_actions_required_params_are_named_when_missing() -> None:
    result = steps.prevalidate(Mail, {"action": "send", "to": "bob"})
    assert code_of(result) == "missing-params"
    assert isinstance(result, ToolResult)
    assert "body" in result.body and "to" not in result.body.split("needs")[1]
    assert result.meta["action"] == "send"


def test_the_action_map_is_checked_before_the_schema() -> None:
    # Both wrong: the action is reported, not the bad type of count.
    result = steps.prevalidate(Mail, {"action": "zap", "count": "many"})
    assert code_of(result) == "unknown-action"


def test_schema_errors_name_the_field_and_give_enum_values() -> None:
    result = steps.prevalidate(Mail, {"action": "delete", "folder": "trash"})
    assert code_of(result) == "invalid-param"
    assert isinstance(result, ToolResult)
    assert "folder" in result.body and result.meta["param"] == "folder"
    assert sorted(result.valid_values or ()) == ["archive", "inbox"]
    typed = steps.prevalidate(Mail, {"action": "read", "count": "ten"})
    assert code_of(typed) == "invalid-param"
    assert isinstance(typed, ToolResult) and "count" in typed.body


def test_a_plain_json_schema_is_validated_too() -> None:
    bad_enum = steps.prevalidate(Plain, {"city": "Rome", "unit": "k"})
    assert isinstance(bad_enum, ToolResult) and bad_enum.valid_values == ("c", "f")
    missing = steps.prevalidate(Plain, {"unit": "c"})
    assert code_of(missing) == "missing-params"
    assert isinstance(missing, ToolResult) and "city" in missing.body
    extra = steps.prevalidate(Plain, {"city": "Rome", "country": "IT"})
    assert code_of(extra) == "invalid-param"
    assert isinstance(extra, ToolResult) and "country" in extra.body
    assert extra.valid_values == ("city", "unit")
    too_long = steps.prevalidate(Plain, {"city": "R" * 50})
    assert code_of(too_long) == "invalid-param"
    huge = steps.prevalidate(Plain, {"city": "R" * 100_000})
    assert isinstance(huge, ToolResult) and code_of(huge) == "invalid-param"
    # the value is quoted short; the reason and the bound survive whole
    assert huge.body.endswith("... is too long (at most 20 characters)") and len(huge.body) < 200
    ok = steps.prevalidate(Plain, {"city": "Rome"})
    assert isinstance(ok, steps.Prevalidated) and ok.value == {"city": "Rome"}


def test_unknown_fields_are_refused_with_the_declared_names() -> None:
    result = steps.prevalidate(Mail, {"action": "read", "permission": "admin"})
    assert code_of(result) == "invalid-param"
    assert isinstance(result, ToolResult) and "permission" in result.body


def test_valid_params_become_the_params_struct() -> None:
    ok = steps.prevalidate(Mail, {"action": "send", "to": "bob", "body": "hi"})
    assert isinstance(ok, steps.Prevalidated)
    assert ok.value == MailParams(action="send", to="bob", body="hi")
    assert ok.action == "send" and ok.params["to"] == "bob"


# -- the permission -------------------------------------------------------------------


def test_the_permission_comes_from_classify_not_from_the_model() -> None:
    mail = Mail(ctx())
    assert steps.permission(mail, {"action": "delete", "folder": "inbox"}) == "mail.delete"
    files = Risky(ctx())
    assert (
        steps.permission(files, {"path": "/etc/passwd", "action": "read"}) == "files.write_system"
    )
    assert steps.permission(files, {"path": "/tmp/x", "permission": "files.read"}) == "files.write"
    assert steps.permission(Plain(ctx()), {"city": "x", "action": "read"}) == "plain"


def test_a_classify_that_returns_junk_raises() -> None:
    class Junk(Risky):
        name = "junk"

        def classify(self, params: Mapping[str, Any]) -> str | None:
            return "x.y; DROP"

    with pytest.raises(PolicyError):
        steps.permission(Junk(ctx()), {})


# -- rendering ------------------------------------------------------------------------


def test_the_envelope_carries_the_action_in_its_meta() -> None:
    text = steps.render_outcome("mail", ToolResult.success("sent"), "send")
    (env,) = parse(text)
    assert env.attrs == {"status": "success", "action": "send"}
    assert env.content == "sent"
    plain = parse(steps.render_outcome("plain", ToolResult.success("x")))[0]
    assert "action" not in plain.attrs


def test_a_denial_renders_the_gates_code_and_hint() -> None:
    decision = GateDecision(
        decision="deny",
        decided_by="policy",
        code="approval-expired",
        message="Nobody answered.",
        hint="ask first.",
    )
    result = steps.denial(decision)
    assert (result.code, result.body, result.hint) == (
        "approval-expired",
        "Nobody answered.",
        "ask first.",
    )


def test_the_background_acceptance_names_the_call() -> None:
    (env,) = parse(steps.render_outcome("mail", steps.accepted("call-9")))
    assert env.attrs["status"] == "success" and env.attrs["call_id"] == "call-9"
    assert "call-9" in env.content


def test_worker_results_map_onto_tool_results() -> None:
    ok = to_tool_result(WorkerResult(job_id="j", status="success", body="hi", meta={"n": 1}))
    assert ok.ok and ok.body == "hi" and ok.meta == {"n": 1}
    err = to_tool_result(
        WorkerResult(job_id="j", status="error", body="died", code="worker-crashed", hint="retry")
    )
    assert (err.code, err.hint) == ("worker-crashed", "retry")
    broken = to_tool_result(WorkerResult(job_id="j", status="error", code="NOT KEBAB"))
    assert broken.code == "internal-error"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["action", "to", "body", "folder", "count", "x", "async"])
        | st.text(max_size=10),
        json_values,
        max_size=6,
    )
)
def test_any_json_arguments_get_a_result_never_an_exception(arguments: dict[str, Any]) -> None:
    assert steps.check_call(call(arguments)) is None
    for cls in (Mail, Plain, Risky):
        out = steps.prevalidate(cls, arguments)
        assert isinstance(out, steps.Prevalidated | ToolResult)
        if isinstance(out, ToolResult):
            assert out.code in ("unknown-action", "missing-params", "invalid-param")
            steps.render_outcome(cls.name, out)


def test_a_turn_that_declares_its_tools_may_call_only_those_and_what_find_tools_injected() -> None:
    from chalie.services import TurnTools

    turns = TurnTools()
    pinned = ctx(injected=("find_tools",))
    result = steps.resolve(registry(), "mail", pinned, turns)
    assert code_of(result) == "unknown-tool"
    assert isinstance(result, ToolResult) and "find_tools" in (result.hint or "")
    turns.inject("turn", ["mail"])
    assert not isinstance(steps.resolve(registry(), "mail", pinned, turns), ToolResult)
    assert code_of(steps.resolve(registry(), "plain", pinned, turns)) == "unknown-tool"
    other_turn = ctx(turn_id="turn-2", injected=("find_tools",))
    assert code_of(steps.resolve(registry(), "mail", other_turn, turns)) == "unknown-tool"
    # Only an unrestricted context (the CLI, an operator) may call any registered tool.
    assert not isinstance(
        steps.resolve(registry(), "plain", ctx(scope="unrestricted"), turns), ToolResult
    )
    assert not isinstance(
        steps.resolve(
            registry(),
            "plain",
            pinned.__class__(conversation_id="c", turn_id="t", injected=("plain",)),
            None,
        ),
        ToolResult,
    )


# -- the defects a review found --------------------------------------------------------


def test_a_restricted_turn_with_an_empty_tool_list_can_call_nothing() -> None:
    from chalie.services import TurnTools

    empty = ctx()  # restricted is the default: fail closed
    assert empty.scope == "restricted"
    assert code_of(steps.resolve(registry(), "plain", empty, TurnTools())) == "unknown-tool"
    assert code_of(steps.resolve(registry(), "plain", empty, None)) == "unknown-tool"


class DefaultAction(Ability):
    """An action parameter whose default is the dangerous one."""

    name = "files"
    summary = "Files."
    tooltip = "Files"
    examples = EX
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["list", "delete_all"], "default": "delete_all"},
            "path": {"type": "string", "default": "/"},
        },
        "additionalProperties": False,
    }
    actions = {"list": (), "delete_all": ()}

    def run(self, params: dict[str, Any]) -> ToolResult:
        return ToolResult.success(str(params["action"]))


class DefaultActionParams(msgspec.Struct, forbid_unknown_fields=True):
    action: Literal["list", "delete_all"] = "delete_all"


class DefaultActionStruct(Ability):
    name = "files_struct"
    summary = "Files."
    tooltip = "Files"
    examples = EX
    Params = DefaultActionParams
    actions = {"list": (), "delete_all": ()}

    def run(self, params: DefaultActionParams) -> ToolResult:
        return ToolResult.success(params.action)


@pytest.mark.parametrize("cls", [DefaultAction, DefaultActionStruct])
def test_the_permission_comes_from_the_arguments_with_their_defaults(
    cls: type[Ability],
) -> None:
    pre = steps.prevalidate(cls, {})
    assert isinstance(pre, steps.Prevalidated)
    assert pre.params["action"] == "delete_all" and pre.action == "delete_all"
    assert steps.permission(cls(), pre.params) == f"{cls.name}.delete_all"


def test_the_tool_runs_with_exactly_the_params_the_gate_saw() -> None:
    pre = steps.prevalidate(DefaultAction, {})
    assert isinstance(pre, steps.Prevalidated)
    assert pre.value == pre.params == {"action": "delete_all", "path": "/"}


@pytest.mark.parametrize("summary", [None, "", "   ", "\n\t", 5, "<what this call does>"])
def test_a_model_call_without_a_usable_act_summary_gets_one_written(summary: object) -> None:
    args: dict[str, Any] = {"action": "read", "folder": "inbox"}
    if summary is not None:
        args["act_summary"] = summary
    fields = steps.framework_fields(args, ctx(), Mail)
    assert fields.params == {"action": "read", "folder": "inbox"}
    assert fields.act_summary == "Mail (action=read, folder=inbox)"
    assert any(n.startswith("act_summary") for n in fields.healed)


def test_a_framework_call_gets_its_act_summary_supplied() -> None:
    found = steps.framework_fields({"action": "read"}, ctx(initiator="framework"), Mail)
    assert (found.params, found.act_summary, found.run_async) == (
        {"action": "read"},
        steps.FRAMEWORK_SUMMARY,
        False,
    )
    kept = steps.framework_fields({"act_summary": " mine "}, ctx(initiator="framework"), Mail)
    assert kept.act_summary == "mine" and not kept.healed


def test_a_written_act_summary_is_one_escaped_line() -> None:
    args = {"action": "send", "to": "a\nb\x1b[31m", "body": "x" * 500, "act_summary": ""}
    fields = steps.framework_fields(args, ctx(), Mail)
    assert "\n" not in fields.act_summary and "\x1b" not in fields.act_summary
    assert len(fields.act_summary) <= 200


@pytest.mark.parametrize(("field", "value"), [("scope", "everything"), ("initiator", "root")])
def test_a_context_with_an_unknown_scope_or_initiator_is_refused(field: str, value: str) -> None:
    result = steps.check_call(call(context=ctx(**{field: value})))
    assert code_of(result) == "invalid-param"
    assert isinstance(result, ToolResult) and result.meta["param"] == field


# -- unknown names: the closest real tools ----------------------------------------------


class FakeFinds:
    """The discovery seam: what find() was asked, and a fixed answer."""

    def __init__(self, names: list[str], fail: bool = False) -> None:
        self.asked: list[list[str]] = []
        self.names, self.fail = names, fail

    def find(self, queries: list[str]) -> Any:
        self.asked.append(list(queries))
        if self.fail:
            raise RuntimeError("index down")
        return type("Found", (), {"names": self.names})()


def registry_of(*classes: type[Ability]) -> Registry:
    reg = Registry()
    for cls in classes:
        reg.add(cls, source="tests")
    return reg


def test_an_unknown_name_is_looked_up_by_its_words_and_its_text_arguments() -> None:
    assert steps.suggestion_queries("calculate_percentage", {"of": "240", "n": 15}) == [
        "calculate percentage",
        "240",
    ]
    assert steps.suggestion_queries("x", {"act_summary": "ignored", "q": ["a", "b"]}) == [
        "x",
        "a",
        "b",
    ]


def test_on_a_find_tools_channel_the_closest_tools_are_named_and_injected() -> None:
    from chalie.services import TurnTools

    turns = TurnTools()
    finds = FakeFinds(["mail", "plain", "gone"])
    context = ctx(injected=("find_tools",), scope="restricted")
    result = steps.closest_tools(
        finds, turns, registry_of(Mail, Plain), call(tool="send_mail", context=context)
    )
    assert result.code == "unknown-tool" and result.valid_values == ("mail", "plain")
    assert turns.injected("turn") == {"mail", "plain"}  # "gone" is not registered
    assert (
        "now callable" in str(result.body)
        and result.hint == "call mail instead, with its own parameters."
    )


def test_without_find_tools_only_the_channels_own_pins_are_named_and_nothing_is_injected() -> None:
    from chalie.services import TurnTools

    turns = TurnTools()
    context = ctx(injected=("plain",), scope="restricted")
    result = steps.closest_tools(
        FakeFinds(["mail", "plain"]),
        turns,
        registry_of(Mail, Plain),
        call(tool="x", context=context),
    )
    assert result.valid_values == ("plain",) and turns.injected("turn") == frozenset()


def test_a_discovery_failure_still_answers_unknown_tool() -> None:
    result = steps.closest_tools(FakeFinds([], fail=True), None, registry_of(Mail), call(tool="x"))
    assert result.code == "unknown-tool" and result.valid_values is None


# -- steps 1 to 5 in order: prepare ----------------------------------------------------------


class Broken(Risky):
    """Its construction fails (a fault in the ability)."""

    name = "broken"

    def __init__(self, context: TurnContext | None = None, services: Any = None) -> None:
        raise RuntimeError("no")


class Unsure(Risky):
    """Its classify() raises: the gate fails closed."""

    name = "unsure"

    def classify(self, params: Mapping[str, Any]) -> str | None:
        raise KeyError("path")


def any_tool(arguments: Any = None, **over: Any) -> ToolCall:
    """A call of a context that may call any registered tool (the CLI's, an operator's)."""
    return call(arguments, **{"context": ctx(scope="unrestricted"), **over})


def everything() -> Registry:
    reg = registry()
    for cls in (Broken, Unsure):
        reg.add(cls, source="test")
    return reg


@pytest.mark.parametrize(
    ("made", "code", "suggest", "cls", "trail"),
    [
        # step 1: hostile input is refused before the name is looked up
        (any_tool([1], tool="nope"), "invalid-param", False, None, None),
        # step 2: an unknown name may be worth a search for the closest tools; a tool
        # the turn may not call is unknown to it
        (call({}, tool="mail"), "unknown-tool", True, None, None),
        (any_tool({}, tool="nope"), "unknown-tool", True, None, None),
        (any_tool({}, tool="_mcp_gone_x"), "mcp-unknown-tool", False, None, None),
        # step 3: a bare value no reading heals
        (any_tool({}, bare=[1, 2], tool="mail"), "invalid-param", False, Mail, None),
        # the ability cannot be made: its fields are on the trail
        (
            any_tool({"path": "/x", "act_summary": "a"}, tool="broken"),
            "unhandled-exception",
            False,
            Broken,
            ({"path": "/x"}, "a"),
        ),
        # step 4: the params fail their checks
        (
            any_tool({"action": "fly", "act_summary": "a"}),
            "unknown-action",
            False,
            Mail,
            ({"action": "fly"}, "a"),
        ),
    ],
)
def test_prepare_ends_a_call_at_its_first_refusal_with_what_the_trail_shows(
    made: ToolCall,
    code: str,
    suggest: bool,
    cls: type[Ability] | None,
    trail: tuple[dict[str, Any], str] | None,
) -> None:
    ready = steps.prepare(made, everything(), None)
    assert isinstance(ready, steps.Refused)
    assert (ready.result.code, ready.suggest, ready.cls) == (code, suggest, cls)
    if trail is not None:
        assert (ready.params, ready.act_summary) == trail


def test_a_model_calls_refused_params_come_with_the_tools_shape() -> None:
    by_model = steps.prepare(any_tool({"action": "fly"}), everything(), None)
    by_framework = steps.prepare(
        any_tool({"action": "fly"}, context=ctx(scope="unrestricted", initiator="framework")),
        everything(),
        None,
    )
    assert isinstance(by_model, steps.Refused) and isinstance(by_framework, steps.Refused)
    assert by_model.result == steps.with_shape(Mail, by_framework.result)
    assert by_model.result != by_framework.result


def test_prepare_gives_the_gate_the_permission_from_the_params_and_hides_sensitive_values() -> None:
    ready = steps.prepare(
        any_tool({"path": "/etc/passwd", "act_summary": "read it", "async": True}, tool="files"),
        everything(),
        None,
    )
    assert isinstance(ready, steps.Prepared)
    assert (ready.entry.cls, ready.permission, ready.failed_closed) == (
        Risky,
        "files.write_system",
        None,
    )
    assert (ready.params, ready.act_summary, ready.healed) == (
        {"path": "/etc/passwd"},
        "read it",
        "",
    )
    assert ready.instance.call_id == "c1" and isinstance(ready.instance, Risky)
    assert ready.run_async is Risky.backgroundable is True  # it asked, and it may
    sent = steps.prepare(
        any_tool({"action": "send", "to": "a@b", "body": "hi", "act_summary": "s"}),
        everything(),
        None,
    )
    assert isinstance(sent, steps.Prepared)
    assert sent.redacted == steps.redact(sent.pre.params, Mail.sensitive)
    assert (sent.permission, sent.run_async) == ("mail.send", False)


def test_a_classify_that_raises_names_the_tool_and_says_why_the_gate_fails_closed() -> None:
    ready = steps.prepare(
        any_tool({"path": "/x", "act_summary": "a"}, tool="unsure"), everything(), None
    )
    assert isinstance(ready, steps.Prepared)
    assert (ready.permission, ready.failed_closed) == ("unsure", "classify raised KeyError")
