"""The dispatcher's pure steps: check, resolve, pre-validate, name the permission, render.

The DispatcherActor (actors/calls/dispatcher.py) runs them in this order for every
tool call; each step returns either its product or the error
:class:`~chalie.result.ToolResult` that ends the call:

1. :func:`check_call`: hostile input (a non-object, more than
   :data:`MAX_ARGUMENT_BYTES` of JSON, nesting deeper than :data:`MAX_DEPTH`,
   a bad channel, scope, initiator or id) is refused without being looked at
   further.
2. :func:`resolve`: the registry entry for the name, or ``unknown-tool``
   (also for a tool the turn may not call: see :func:`available`; a
   restricted turn reaches only its pins and what find_tools injected).
3. :func:`framework_fields` takes ``act_summary`` and ``async`` out of the
   arguments and heals the rest where one reading exists (:mod:`chalie.calls.healing`;
   :func:`bare_arguments` for arguments sent as a bare value); a missing or
   copied ``act_summary`` is written by the framework, never refused.
4. :func:`prevalidate`: every declared default applied first, then the action
   map (``unknown-action`` with the valid actions, ``missing-params`` naming
   them), then the JSON Schema (``invalid-param`` naming the field, with the
   enum's values), then the ``Params`` Struct; all before the gate. Its
   ``params`` are the arguments with every default applied: the gate derives
   the permission from them and the executor runs exactly them.
5. :func:`permission` derives ``tool`` or ``tool.action`` with the ability's
   ``classify`` from those params (never from a model-supplied field).
6. :func:`carried_rich` checks the rich payload can reach a client, and
   :func:`render_outcome` renders the one envelope.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import jsonschema
import msgspec
from jsonschema.exceptions import ValidationError as SchemaError
from jsonschema.exceptions import best_match

from chalie.ability import Ability, struct_schema
from chalie.calls import healing
from chalie.calls.envelope import TOOL_NAME, render
from chalie.calls.faults import FAULTS
from chalie.calls.invoke import coerce_params
from chalie.calls.registry import Entry
from chalie.calls.trail import redact
from chalie.gate.display import one_line
from chalie.gate.policy import permission_for
from chalie.result import MAX_RICH_BYTES, Scalar, ToolResult
from chalie.wire.mcp_names import server_of
from chalie.wire.messages import (
    CHANNELS,
    INITIATORS,
    TOOL_SCOPES,
    GateDecision,
    ToolCall,
    TurnContext,
)
from chalie.wire.tool_names import FRAMEWORK_FIELDS

log = logging.getLogger("chalie.calls.dispatch")

MAX_ARGUMENT_BYTES: Final = 1 << 20
MAX_DEPTH: Final = 32
MAX_ID: Final = 128
MAX_VALID_VALUES: Final = 50
FALLBACK_TOOL: Final = "tool"
MAX_SUMMARY: Final = 200
# What the trail and the prompt show for a framework-initiated call that says nothing.
FRAMEWORK_SUMMARY: Final = "called directly by the operator or the runtime"

log = logging.getLogger("chalie.calls.dispatch")
_validators: dict[type[Ability], jsonschema.protocols.Validator] = {}
_validators_lock = threading.Lock()
_derived: dict[type[Ability], bool] = {}


class Prevalidated(msgspec.Struct, frozen=True):
    """Parameters that passed every check, every default applied.

    ``params`` is what the gate classifies, the trail records and a worker
    receives; ``value`` is what ``run`` receives, converted from ``params``.
    """

    params: dict[str, Any]
    value: Any
    action: str | None


# -- 1. hostile input ---------------------------------------------------------


_SCALARS: Final = (int, float, bool, type(None))


def _oversized(arguments: Mapping[str, Any]) -> str | None:
    """Why the arguments are too big or too deep, walking no further than the budget."""
    if type(arguments) is dict and len(arguments) <= 64:
        # The common call: a flat object of strings and numbers, measured in one pass.
        size = 2
        for key, item in arguments.items():
            kind = type(item)
            if kind is str:
                size += len(item) + len(key) + 6
            elif kind in _SCALARS:
                size += len(key) + 12
            else:
                break
        else:
            return None if size <= MAX_ARGUMENT_BYTES else _too_large()
    budget = MAX_ARGUMENT_BYTES
    stack: list[tuple[Any, int]] = [(arguments, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"the arguments nest deeper than {MAX_DEPTH} levels"
        # Concrete types first: the ABC checks cost more than the walk itself.
        if isinstance(value, str):
            budget -= len(value) + 2
        elif isinstance(value, int | float | bool) or value is None:
            budget -= 8
        elif isinstance(value, dict | Mapping):
            budget -= 2
            for key, item in value.items():
                budget -= len(key) + 4 if isinstance(key, str) else 16
                stack.append((item, depth + 1))
        elif isinstance(value, list | tuple):
            budget -= 2
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, bytes | bytearray):
            budget -= len(value) * 2
        else:
            budget -= 8
        if budget < 0:
            return _too_large()
    return None


def _too_large() -> str:
    return f"the arguments are larger than {MAX_ARGUMENT_BYTES // 1024} KiB"


def check_call(call: ToolCall) -> ToolResult | None:
    """Refuse a call whose shape is hostile before any other step reads it."""
    ctx = call.context
    if ctx.channel not in CHANNELS:
        return ToolResult.error(
            "invalid-param",
            f"unknown channel {str(ctx.channel)[:40]!r}.",
            hint="the caller must use one of the policy channels.",
            valid_values=CHANNELS,
            meta={"param": "channel"},
        )
    for name, given, allowed in (
        ("scope", ctx.scope, TOOL_SCOPES),
        ("initiator", ctx.initiator, INITIATORS),
    ):
        if given not in allowed:
            return ToolResult.error(
                "invalid-param",
                f"unknown {name} {str(given)[:40]!r}.",
                hint="this is a fault in the caller, not in the tool.",
                valid_values=allowed,
                meta={"param": name},
            )
    for field, value in (
        ("call_id", call.call_id),
        ("turn_id", ctx.turn_id),
        ("conversation_id", ctx.conversation_id),
    ):
        if not isinstance(value, str) or not value or len(value) > MAX_ID:
            return ToolResult.error(
                "invalid-param",
                f"{field} must be a non-empty string of at most {MAX_ID} characters.",
                hint="this is a fault in the caller, not in the tool.",
                meta={"param": field},
            )
    args = call.arguments
    if type(args) is not dict and not isinstance(args, Mapping):
        return ToolResult.error(
            "invalid-param",
            f"the arguments must be a JSON object, not {type(args).__name__}.",
            hint='pass the parameters as an object, e.g. {"name": "value"}.',
        )
    if not all(type(k) is str or isinstance(k, str) for k in args):
        return ToolResult.error(
            "invalid-param",
            "every argument name must be a string.",
            hint="use string keys only.",
        )
    why = _oversized(args) or (_oversized({"_": call.bare}) if call.bare is not None else None)
    if why:
        return ToolResult.error(
            "invalid-param",
            f"{why}; the call was not processed.",
            hint="pass smaller arguments; put large content in a file or split the work.",
        )
    return None


# -- 2. resolution ------------------------------------------------------------


def envelope_name(tool: object) -> str:
    """A name the envelope can carry: the tool's own, or a sanitised stand-in for a hostile one."""
    if isinstance(tool, str) and TOOL_NAME.match(tool):
        return tool
    text = re.sub(r"[^a-z0-9_]+", "_", str(tool).lower())[:64].strip("_")
    return text if TOOL_NAME.match(text) else FALLBACK_TOOL


def available(tool: str, context: TurnContext, turns: Any = None) -> bool:
    """Whether the turn may call the tool.

    An ``unrestricted`` context (the CLI, operator calls) may call any
    registered tool. A ``restricted`` one (the default) may call only its
    channel's pins (``context.injected``) and what find_tools injected into
    this turn; with neither, nothing.
    """
    if context.scope == "unrestricted" or tool in context.injected:
        return True
    injected = getattr(turns, "injected", None)
    return callable(injected) and tool in injected(context.turn_id)


def resolve(
    registry: Any, tool: object, context: TurnContext | None = None, turns: Any = None
) -> Entry | ToolResult:
    """The registry entry for the name, or ``unknown-tool`` (also when the turn lacks it)."""
    entry = registry.get(tool) if isinstance(tool, str) and len(tool) <= 200 else None
    if isinstance(entry, Entry) and context is not None:
        if not available(entry.name, context, turns):
            entry = None
    if not isinstance(entry, Entry):
        shown = str(tool)[:80]
        server = server_of(tool) if isinstance(tool, str) else None
        if server is not None and registry.get(tool) is None:
            return ToolResult.error(
                "mcp-unknown-tool",
                f"no enabled MCP server offers {shown!r} (server {server!r} has no such tool).",
                hint="call find_tools again to find a tool that does this now.",
                meta={"mcp_server": server},
            )
        return unknown_tool(tool, (), can_find=context is None or "find_tools" in context.injected)
    return entry


MAX_SUGGESTED: Final = 3
MAX_SUGGESTION_QUERIES: Final = 4
SUGGESTION_QUERY_CHARS: Final = 200


def suggestion_queries(tool: object, arguments: Mapping[str, Any]) -> list[str]:
    """What to look an unknown tool up by: its name in words, then the call's text values."""
    out: list[str] = []
    name = re.sub(r"[_\-.]+", " ", str(tool)).strip()[:SUGGESTION_QUERY_CHARS]
    if name:
        out.append(name)
    for key, value in arguments.items():
        if key in FRAMEWORK_FIELDS:
            continue
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, str) and item.strip() and len(out) < MAX_SUGGESTION_QUERIES:
                out.append(item.strip()[:SUGGESTION_QUERY_CHARS])
    return list(dict.fromkeys(out))


def unknown_tool(
    tool: object, closest: Sequence[str], *, injected: bool = False, can_find: bool = True
) -> ToolResult:
    """``unknown-tool``; with the closest real tools as its valid values when there are any."""
    shown = str(tool)[:80]
    if not closest:
        where = (
            "describe the action to find_tools in a few words"
            if can_find
            else ("use one of the tools you were given")
        )
        return ToolResult.error(
            "unknown-tool",
            f"no tool named {shown!r} is available.",
            hint=f"{where}, or answer without a tool.",
        )
    names = ", ".join(closest)
    ready = " (now callable)" if injected else ""
    if closest[0] == tool:  # a real tool this turn had not activated: now it has
        message = f"{shown!r} was not active in this turn; it is now callable."
        hint = f"call {closest[0]} again."
    else:
        message = f"no tool named {shown!r}; the closest: {names}{ready}."
        hint = f"call {closest[0]} instead, with its own parameters."
    return ToolResult.error("unknown-tool", message, hint=hint, valid_values=_values(closest))


def closest_tools(
    discovery: Any,
    turns: Any,
    registry: Any,
    call: ToolCall,
) -> ToolResult:
    """The unknown-tool error for ``call`` naming the closest tools the turn can call.

    Runs the discovery cascade over the requested name and the call's text values.
    On a channel that offers find_tools the tools found are injected into the turn,
    as find_tools would have; elsewhere only the channel's own pins are named.
    Blocking (it asks the discovery actor): never on the dispatcher's thread.
    """
    ctx = call.context
    queries = suggestion_queries(call.tool, call.arguments)
    names: list[str] = []
    try:
        found = discovery.find(queries)
        names = list(found.names)
    except Exception as exc:  # discovery is a help here, never a reason to fail the call
        log.info("no suggestions for unknown tool: %s", type(exc).__name__)
    can_find = "find_tools" in ctx.injected
    offered = [n for n in names if can_find or n in ctx.injected][:MAX_SUGGESTED]
    offered = [n for n in offered if isinstance(registry.get(n), Entry)]
    if can_find and offered and turns is not None:
        turns.inject(ctx.turn_id, offered)
    return unknown_tool(call.tool, offered, injected=can_find and bool(offered), can_find=can_find)


# -- 3. framework fields and healing ------------------------------------------------


class Fields(msgspec.Struct, frozen=True):
    """A call's ability params (healed), its act_summary, async, and what healing changed."""

    params: dict[str, Any]
    act_summary: str
    run_async: bool
    healed: tuple[str, ...] = ()


def framework_fields(
    arguments: Mapping[str, Any], context: TurnContext, cls: type[Ability]
) -> Fields:
    """The framework fields taken out, the params healed, the act_summary settled.

    A missing, empty, non-text or copied ``act_summary`` never costs a model a call:
    the framework writes one from the tool's tooltip and the (healed) arguments
    (:func:`chalie.calls.healing.summary_for`), and says so on the trail. A
    framework-initiated call that says nothing gets :data:`FRAMEWORK_SUMMARY`.
    """
    raw = {k: v for k, v in arguments.items() if k not in FRAMEWORK_FIELDS}
    healed = healing.heal(cls, raw)
    run_async = arguments.get("async") is True and cls.backgroundable
    notes = list(healed.notes)
    given = arguments.get("act_summary")
    if context.initiator == "framework" and not (isinstance(given, str) and given.strip()):
        act = FRAMEWORK_SUMMARY
    else:
        act, note = healing.summary_for(cls, given, healed.arguments)
        if note:
            notes.append(note)
    return Fields(healed.arguments, act[:MAX_SUMMARY], run_async, tuple(notes))


def bare_arguments(cls: type[Ability], value: Any) -> Fields | ToolResult:
    """Arguments sent as a bare value: healed into the object when one reading exists."""
    healed = healing.heal_bare(cls, value)
    if healed is None:
        return ToolResult.error(
            "invalid-param",
            f"the arguments must be a JSON object, not a bare {healing.json_type(value)}.",
            hint=f"call {cls.name} as {healing.shape(cls)}",
        )
    summary = healing.written_summary(cls, healed.arguments)
    notes = (*healed.notes, "act_summary missing: written from the tooltip")
    return Fields(healed.arguments, summary, False, notes)


def with_shape(cls: type[Ability], result: ToolResult) -> ToolResult:
    """A pre-validation error whose hint also shows the call's correct shape."""
    if result.code not in ("missing-params", "invalid-param", "unknown-action"):
        return result
    hint = f"{result.hint or ''} Call it as {healing.shape(cls)}".strip()
    return ToolResult.error(
        result.code or "invalid-param",
        result.body if isinstance(result.body, str) else str(result.body),
        hint=hint,
        valid_values=result.valid_values,
        meta=dict(result.meta),
    )


# -- 4. pre-validation -----------------------------------------------------------


def with_defaults(cls: type[Ability], params: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments with every top-level default the schema declares filled in."""
    out = dict(params)
    for name, default in _defaults(cls):
        if name not in out:
            out[name] = _copy_default(default)
    return out


# Per ability class: its parameters mapping (to notice a change) and its top-level defaults.
_DEFAULTS: dict[type[Ability], tuple[Any, tuple[tuple[str, Any], ...]]] = {}


def _defaults(cls: type[Ability]) -> tuple[tuple[str, Any], ...]:
    schema = cls.parameters
    found = _DEFAULTS.get(cls)
    if found is not None and found[0] is schema:
        return found[1]
    pairs = tuple(
        (name, spec["default"])
        for name, spec in schema.get("properties", {}).items()
        if isinstance(spec, Mapping) and "default" in spec
    )
    if len(_DEFAULTS) >= 4096:
        _DEFAULTS.clear()  # classes made at run time (MCP proxies) cannot grow it for good
    _DEFAULTS[cls] = (schema, pairs)
    return pairs


def _copy_default(value: Any) -> Any:
    # A default must not be shared between calls: an ability could mutate it.
    if isinstance(value, dict | list):
        return msgspec.json.decode(msgspec.json.encode(value))
    return value


def validator_for(cls: type[Ability]) -> jsonschema.protocols.Validator:
    """The compiled JSON Schema validator of an ability class, built once."""
    found = _validators.get(cls)
    if found is None:
        with _validators_lock:
            found = _validators.get(cls)
            if found is None:
                found = jsonschema.Draft202012Validator(dict(cls.parameters))
                _validators[cls] = found
    return found


def _values(values: Iterable[Any]) -> list[Scalar]:
    out: list[Scalar] = [v for v in values if v is None or isinstance(v, str | int | float | bool)]
    return out[:MAX_VALID_VALUES]


# The bound a size keyword sets, said with its number (jsonschema says only "is too long").
_BOUNDS: Final = {
    "maxLength": "at most {} characters",
    "minLength": "at least {} characters",
    "maxItems": "at most {} items",
    "minItems": "at least {} items",
    "maxProperties": "at most {} entries",
    "minProperties": "at least {} entries",
}
VALUE_SHOWN: Final = 60  # characters of a rejected value quoted in the error


def _reason(error: SchemaError) -> str:
    """jsonschema's message with the rejected value cut short and the reason kept whole.

    Its messages start with the value's repr, which can be a 100 KB string; cutting the
    message instead would cut off the reason ("... is too long").
    """
    message = str(error.message)
    shown = repr(error.instance)
    if message.startswith(shown) and len(shown) > VALUE_SHOWN:
        message = shown[:VALUE_SHOWN] + "..." + message[len(shown) :]
    bound = _BOUNDS.get(str(error.validator))
    if bound is not None:
        message += f" ({bound.format(error.validator_value)})"
    return message if len(message) <= 300 else message[:300] + "..."


def _schema_error(cls: type[Ability], error: SchemaError) -> ToolResult:
    path = "/".join(str(p) for p in error.absolute_path)
    props = cls.parameters.get("properties", {})
    if error.validator == "required" and not path:
        missing = [m for m in re.findall(r"'([^']+)' is a required property", error.message)]
        names = ", ".join(missing) or "a required parameter"
        return ToolResult.error(
            "missing-params",
            f"{cls.name} needs {names}.",
            hint=f"pass {names} and call again.",
            meta={"param": missing[0] if missing else ""},
        )
    if error.validator == "additionalProperties" and not path:
        instance = error.instance
        extra = sorted(set(instance) - set(props)) if isinstance(instance, Mapping) else []
        name = extra[0] if extra else "?"
        return ToolResult.error(
            "invalid-param",
            f"{cls.name} has no parameter {name[:64]!r}.",
            hint="use only the parameters the tool declares.",
            valid_values=_values(sorted(props)),
            meta={"param": name[:64]},
        )
    field = path or "arguments"
    valid: list[Scalar] | None = None
    if error.validator == "enum" and isinstance(error.validator_value, list):
        valid = _values(error.validator_value)
    elif error.validator == "const":
        valid = _values([error.validator_value])
    else:
        # An enum nested in anyOf/oneOf (msgspec's Optional[Literal]) still lists the choices.
        sub = error.schema if isinstance(error.schema, Mapping) else {}
        for option in [*sub.get("anyOf", ()), *sub.get("oneOf", ())]:
            if isinstance(option, Mapping) and isinstance(option.get("enum"), list):
                valid = _values(option["enum"])
    message = _reason(error)
    if valid is not None and error.validator in ("anyOf", "oneOf"):
        message = f"{str(error.instance)[:80]!r} is not one of the valid values"
    return ToolResult.error(
        "invalid-param",
        f"parameter {field!r} is invalid: {message}",
        hint=f"fix {field} to match the tool's schema and call again.",
        valid_values=valid,
        meta={"param": field[:64]},
    )


def _check_actions(cls: type[Ability], params: Mapping[str, Any]) -> ToolResult | str | None:
    if not cls.actions:
        return None
    key = cls.action_param
    action = params.get(key)
    if action is None:
        default = cls.parameters.get("properties", {}).get(key, {}).get("default")
        if default is None:
            return ToolResult.error(
                "missing-params",
                f"{cls.name} needs {key}.",
                hint=f"pass {key}, one of: {', '.join(cls.actions)}.",
                valid_values=_values(cls.actions),
                meta={"param": key},
            )
        action = default
    if not isinstance(action, str) or action not in cls.actions:
        return ToolResult.error(
            "unknown-action",
            f"{cls.name} has no action {str(action)[:64]!r}.",
            hint=f"use one of the listed values for {key}.",
            valid_values=_values(cls.actions),
            meta={"param": key},
        )
    missing = [p for p in cls.actions[action] if params.get(p) is None]
    if missing:
        names = ", ".join(missing)
        return ToolResult.error(
            "missing-params",
            f"{cls.name} {action} needs {names}.",
            hint=f"pass {names} with {key}={action}.",
            meta={"action": action, "param": missing[0]},
        )
    return action


def _schema_is_the_struct(cls: type[Ability]) -> bool:
    """True when ``parameters`` is exactly the schema derived from ``Params``, so they agree."""
    found = _derived.get(cls)
    if found is None:
        found = cls.Params is not None and dict(cls.parameters) == struct_schema(cls.Params)
        _derived[cls] = found
    return found


def prevalidate(cls: type[Ability], params: dict[str, Any]) -> Prevalidated | ToolResult:
    """Defaults, then the action map, then the JSON Schema, then the Params Struct.

    When the schema was derived from the ``Params`` Struct, the Struct is the
    schema (msgspec's conversion enforces the same types, enums, bounds and
    unknown-field rule, ~10x faster), so it is tried first and the JSON Schema
    is consulted only to explain a failure with the field and its valid values.
    The returned ``params`` carry every default (a Struct's default factories
    too), so the permission is derived from exactly what will run.
    """
    params = with_defaults(cls, params)
    if cls.actions and params.get(cls.action_param) is None:
        implied = cls.implied_action(params)
        if implied is not None:
            params = {**params, cls.action_param: implied}
    action = _check_actions(cls, params)
    if isinstance(action, ToolResult):
        return action
    if _schema_is_the_struct(cls):
        try:
            value = coerce_params(cls, params)
            return Prevalidated(_builtins(value, params), value, action)
        except msgspec.ValidationError:
            pass  # explained below, by the schema when it can name the field
    validator = validator_for(cls)
    if not validator.is_valid(params):
        error = best_match(validator.iter_errors(params))
        if error is not None:
            return _schema_error(cls, error)
    try:
        value = coerce_params(cls, params)
    except msgspec.ValidationError as exc:
        return ToolResult.error(
            "invalid-param",
            f"the parameters are invalid: {str(exc)[:200]}",
            hint="fix the named parameter to match the tool's schema and call again.",
        )
    return Prevalidated(_builtins(value, params), value, action)


def _builtins(value: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The dict form of the run value: a Struct's fields (defaults included), else the dict."""
    if isinstance(value, msgspec.Struct):
        found: dict[str, Any] = msgspec.to_builtins(value)
        return found
    return params


# -- 5. the permission -----------------------------------------------------------


def permission(instance: Ability, params: Mapping[str, Any]) -> str:
    """``tool`` or ``tool.action``, the action from the ability's classify(). Raises on junk."""
    return permission_for(type(instance).name, instance.classify(params))


REACH_MAX: Final = 500


def reach(instance: Ability, params: Mapping[str, Any]) -> str | None:
    """The call's reach beyond Chalie (sensitive when not None), one escaped line, capped.

    An ability whose reach() raises is treated as sensitive (fail closed).
    """
    try:
        found = instance.reach(params)
    except Exception:
        log.exception("reach() of %s failed; the call is treated as sensitive", type(instance).name)
        return "what it reaches could not be determined"
    if found is None:
        return None
    return one_line(str(found), REACH_MAX)


# -- 1 to 5 in order: what the dispatcher sequences before the gate ------------------


class Refused(msgspec.Struct, frozen=True):
    """A call that ends before the gate: its error, and what its trail row shows of it."""

    result: ToolResult
    act_summary: str = ""
    params: dict[str, Any] | None = None
    cls: type[Ability] | None = None
    healed: str = ""
    suggest: bool = False  # the name is unknown: the closest tools may be worth a search


class Prepared(msgspec.Struct, frozen=True):
    """A call ready for the gate: its ability made, its params checked, its permission named."""

    entry: Entry
    instance: Ability
    pre: Prevalidated
    permission: str
    failed_closed: str | None  # classify() raised: the gate fails closed, for this reason
    reach: str | None
    params: dict[str, Any]  # as the call gave them (healed), before defaults
    redacted: dict[str, Any]  # the prevalidated params, sensitive values hidden
    act_summary: str
    healed: str
    run_async: bool  # the call asks to run in the background and its ability may


def prepare(call: ToolCall, registry: Any, services: Any, turns: Any = None) -> Prepared | Refused:
    """Steps 1 to 5 for one call: its checks, its entry, its fields, its ability (made with
    ``services``), its params, its permission and its reach; the first refusal ends it."""
    bad = check_call(call)
    if bad is not None:
        return Refused(bad)
    entry = resolve(registry, call.tool, call.context, turns)
    if isinstance(entry, ToolResult):
        return Refused(entry, suggest=entry.code == "unknown-tool")
    cls = entry.cls
    if call.bare is not None:
        fields = bare_arguments(cls, call.bare)
        if isinstance(fields, ToolResult):
            return Refused(fields, cls=cls)
    else:
        fields = framework_fields(call.arguments, call.context, cls)
    params, act_summary = fields.params, fields.act_summary
    healed = "; ".join(fields.healed)
    try:
        instance = cls(call.context, services)
        instance.call_id = call.call_id
    except Exception as exc:
        log.exception("constructing %s failed", cls.name)
        return Refused(FAULTS.construct_failed(cls.name, exc), act_summary, params, cls, healed)
    pre = prevalidate(cls, params)
    if isinstance(pre, ToolResult):
        if call.context.initiator == "model":
            pre = with_shape(cls, pre)
        return Refused(pre, act_summary, params, cls, healed)
    failed_closed = None
    try:
        named = permission(instance, pre.params)
    except Exception as exc:
        log.exception("classify() of %s failed; the gate fails closed", cls.name)
        named = cls.name
        failed_closed = f"classify raised {type(exc).__name__}"
    return Prepared(
        entry=entry,
        instance=instance,
        pre=pre,
        permission=named,
        failed_closed=failed_closed,
        reach=reach(instance, pre.params),
        params=params,
        redacted=redact(pre.params, cls.sensitive),
        act_summary=act_summary,
        healed=healed,
        run_async=fields.run_async,
    )


def notes(
    instance: Ability, params: Mapping[str, Any], untrusted_read: Sequence[str]
) -> tuple[str, ...]:
    """What a person asked about the call should know besides its parameters, in words:
    the call's own account of itself (:meth:`chalie.ability.Ability.in_words`, e.g. how
    often a reminder fires), and the untrusted sources the conversation had read before
    it (what they said may be why the call is made). Each one escaped line, capped."""
    found: list[str] = []
    try:
        said = instance.in_words(params)
    except Exception:
        log.exception("in_words() of %s failed; the prompt goes without it", type(instance).name)
        said = None
    if said:
        found.append(one_line(str(said), REACH_MAX))
    if untrusted_read:
        names = ", ".join(untrusted_read)
        found.append(
            one_line(
                f"this conversation had read untrusted content (from {names}) before this "
                "call: text others wrote may have asked for it",
                REACH_MAX,
            )
        )
    return tuple(found)


def given(params: Mapping[str, Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters the call gave (its healed ``arguments``), as ``params`` holds them
    (redacted), for the person who is asked: not the defaults the schema filled in (an
    email.send showed all 25, nulls too)."""
    return {k: v for k, v in params.items() if k in arguments and k not in FRAMEWORK_FIELDS}


# -- 6. rendering ----------------------------------------------------------------


def denial(decision: GateDecision) -> ToolResult:
    """The error result for a gate decision that refused the call."""
    return ToolResult.error(
        decision.code or "permission-denied",
        decision.message or "The permission gate refused the call.",
        hint=decision.hint,
    )


def accepted(call_id: str) -> ToolResult:
    """What the turn gets at once for a call sent to the background."""
    return ToolResult.success(
        f"Started in the background as call {call_id}; the result will arrive in this "
        "conversation when it finishes. Do not wait for it or call it again.",
        meta={"call_id": call_id, "background": True},
    )


def render_outcome(tool: str, result: ToolResult, action: str | None = None) -> str:
    """The one envelope the model sees; ``action`` is added to the meta when the ability has one."""
    if action is not None and "action" not in result.meta:
        # The action (a str the ability declared) shown first, as with_meta would put it.
        return render(envelope_name(tool), result, {"action": action, **result.meta})
    return render(envelope_name(tool), result)


def carried_rich(tool: str, result: ToolResult) -> tuple[ToolResult, dict[str, Any] | None]:
    """The result and its rich payload as plain data a client can be sent.

    A payload that is not plain JSON-like data (an object, a socket) or that
    is larger than :data:`MAX_RICH_BYTES` makes the call ``non-canonical-result``:
    it is a fault in the tool, and dropping the payload silently would lose it.
    """
    if result.rich is None:
        return result, None
    try:
        size = len(msgspec.json.encode(result.rich))
    except (TypeError, ValueError, OverflowError):
        size = -1
    if 0 <= size <= MAX_RICH_BYTES:
        return result, dict(result.rich)
    why = "is not plain data" if size < 0 else f"is larger than {MAX_RICH_BYTES >> 20} MiB"
    return ToolResult.error(
        "non-canonical-result",
        f"{tool} returned a rich payload that {why}.",
        hint="This is a fault in the tool; do not retry the same call.",
    ), None
