"""The ability contract: five descriptors, declarations, ``run``, and the sealed assembler.

An ability is a class. Its five descriptors are class attributes, so they are
deterministic with no live request attached (the search index reads them
offline). ``run`` returns a :class:`~chalie.result.ToolResult`.

Lifecycle of one call (the dispatcher drives it):

1. ``cls(context)``: a fresh instance bound to the calling turn.
2. ``instance.classify(params)``: the permission qualifier, derived from inputs.
3. ``instance.run(params)``: the work; ``params`` is the ``Params`` Struct if
   the ability declares one, else the validated dict.

The descriptor the model sees is built only by :meth:`Ability.descriptor`,
which subclasses cannot redefine: :class:`AbilityMeta` rejects such a class
with a TypeError when it is created.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any, ClassVar, Final

import msgspec

from chalie.result import ToolResult
from chalie.services import Services
from chalie.wire.messages import ISOLATIONS, Isolation, TurnContext
from chalie.wire.tool_names import ACT_SUMMARY_DESCRIPTION, FRAMEWORK_FIELDS, NAME_MAX, NAME_PATTERN

MIN_EXAMPLES: Final = 6
MAX_EXAMPLES: Final = 8
# Names a subclass may not define: the assembler and everything it relies on.
SEALED: Final = frozenset({"descriptor", "input_schema", "_inject_framework_fields"})


class AbilityDefinitionError(TypeError):
    """An ability class breaks a load-time rule; the message names it and the rule."""


def struct_schema(struct: type[msgspec.Struct]) -> dict[str, Any]:
    """Plain JSON Schema (one top-level object) from a msgspec Struct."""
    raw = msgspec.json.schema(struct)
    defs = raw.pop("$defs", {})
    ref = raw.get("$ref")
    if ref:
        schema = dict(defs.pop(ref.rsplit("/", 1)[-1]))
    else:
        schema = dict(raw)
    if defs:
        schema["$defs"] = defs
    schema.pop("title", None)
    return schema


class AbilityMeta(type):
    """Seals the assembler and validates concrete abilities as they are created."""

    def __new__(mcls, name: str, bases: tuple[type, ...], ns: dict[str, Any], **kw: Any) -> type:
        cls = super().__new__(mcls, name, bases, ns, **kw)
        if any(isinstance(b, AbilityMeta) for b in bases):
            # The whole MRO, not just this class's body: a mixin listed before
            # Ability must not slip its own assembler in.
            for klass in cls.__mro__:
                if klass is object or klass is globals().get("Ability"):
                    continue
                broken = SEALED.intersection(vars(klass))
                if broken:
                    where = "" if klass is cls else f" (through {klass.__qualname__})"
                    raise AbilityDefinitionError(
                        f"ability class {ns.get('__qualname__', name)} redefines the sealed "
                        f"descriptor assembler{where} ({', '.join(sorted(broken))}); "
                        "descriptors are assembled only by Ability.descriptor"
                    )
        if "Params" in ns and ns["Params"] is not None and "parameters" not in ns:
            cls.parameters = struct_schema(ns["Params"])  # type: ignore[attr-defined]
            cls._derived_schema = True  # type: ignore[attr-defined]
        elif "parameters" in ns:
            cls._derived_schema = False  # type: ignore[attr-defined]
        # Inherited parameters keep their origin (a subclass of a Params-derived base).
        generated = bool(getattr(cls, "_derived_schema", False))
        if not ns.get("abstract", False) and any(isinstance(b, AbilityMeta) for b in bases):
            # A schema msgspec wrote from the Params type is valid JSON Schema by
            # construction; only a hand-written one is checked against the meta-schema
            # (the check is most of what importing every ability costs: `tools list`).
            validate_ability(cls, check_schema=not generated)  # type: ignore[arg-type]
        return cls

    def __setattr__(cls, attr: str, value: Any) -> None:
        if attr in SEALED and any(isinstance(b, AbilityMeta) for b in cls.__bases__):
            raise AbilityDefinitionError(
                f"ability class {cls.__qualname__} may not replace the sealed {attr}"
            )
        super().__setattr__(attr, value)


def validate_ability(cls: type[Ability], *, check_schema: bool = True) -> None:
    """Raise AbilityDefinitionError naming the ability and the first rule it breaks.

    ``check_schema``: check ``parameters`` against the JSON Schema meta-schema.
    """
    who = f"ability {getattr(cls, 'name', None)!r} ({cls.__module__}.{cls.__qualname__})"

    def fail(rule: str) -> None:
        raise AbilityDefinitionError(f"{who}: {rule}")

    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        fail("name must be a non-empty string")
    assert isinstance(name, str)
    proxy_name = cls.proxy and name.startswith("_")
    if len(name) > NAME_MAX or not (NAME_PATTERN.match(name) or proxy_name):
        fail(f"name must be lowercase snake case, at most {NAME_MAX} characters")
    if not isinstance(cls.summary, str) or not cls.summary.strip():
        fail("summary must be a non-empty string")
    if not isinstance(cls.tooltip, str) or not cls.tooltip.strip():
        fail("search tooltip must be a non-empty string")
    ex = cls.examples
    if not isinstance(ex, tuple | list) or not all(isinstance(e, str) and e.strip() for e in ex):
        fail("examples must be a sequence of non-empty strings")
    if not cls.proxy and not (MIN_EXAMPLES <= len(ex) <= MAX_EXAMPLES):
        fail(f"needs {MIN_EXAMPLES} to {MAX_EXAMPLES} examples, has {len(ex)}")
    schema = cls.parameters
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        fail("parameters must be a JSON Schema object ({'type': 'object', ...})")
    if check_schema:
        import jsonschema  # here: importing the contract (every CLI command) stays cheap

        try:
            jsonschema.Draft202012Validator.check_schema(dict(schema))
        except jsonschema.SchemaError as exc:
            fail(f"parameters is not a valid JSON Schema: {exc.message}")
    props = schema.get("properties", {})
    clash = [f for f in FRAMEWORK_FIELDS if f in props]
    if clash:
        fail(f"parameters may not declare framework fields {clash}")
    if cls.isolation not in ISOLATIONS:
        fail(f"isolation must be one of {', '.join(repr(i) for i in ISOLATIONS)}")
    if not isinstance(cls.timeout, int | float) or not 0 < cls.timeout <= 86400:
        fail("timeout must be a positive number of seconds")
    if not isinstance(cls.actions, Mapping):
        fail("actions must map action name -> required parameter names")
    for action, required in cls.actions.items():
        missing = [p for p in required if p not in props]
        if missing:
            fail(f"action {action!r} requires parameters the schema lacks: {missing}")
    if cls.actions and cls.action_param not in props:
        fail(f"an action map needs the {cls.action_param!r} parameter in the schema")
    aliases = cls.aliases
    if not isinstance(aliases, Mapping) or not all(
        isinstance(a, str) and isinstance(t, str) for a, t in aliases.items()
    ):
        fail("aliases must map alias -> parameter name")
    bad_alias = [a for a, t in aliases.items() if a in props or t not in props]
    if bad_alias:
        fail(f"aliases must be new names for declared parameters: {bad_alias}")
    stray = sorted(a for a in cls.internal_actions if a not in cls.actions)
    if stray:
        fail(f"internal_actions names actions the action map lacks: {stray}")
    unknown_sensitive = [p for p in cls.sensitive if p not in props]
    if unknown_sensitive:
        fail(f"sensitive names parameters the schema lacks: {unknown_sensitive}")


class Ability(metaclass=AbilityMeta):
    """Base of every ability. Subclass it, set the descriptors, implement ``run``."""

    abstract: ClassVar[bool] = True

    # The five descriptors.
    name: ClassVar[str]
    summary: ClassVar[str]
    examples: ClassVar[tuple[str, ...]] = ()
    tooltip: ClassVar[str]
    parameters: ClassVar[Mapping[str, Any]] = {"type": "object", "properties": {}}
    # Declare parameters once as a Struct and the schema is derived from it.
    Params: ClassVar[type[msgspec.Struct] | None] = None

    # Optional declarations.
    actions: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    action_param: ClassVar[str] = "action"
    discoverable: ClassVar[bool] = True
    isolation: ClassVar[Isolation] = "inline"
    timeout: ClassVar[float] = 60.0
    internal: ClassVar[bool] = False
    # Whether a call may run in the background (the ``async`` field, where the channel
    # offers it). Not for the tools whose result the turn needs now (discovery, memory):
    # offering it there only cost a small model tokens in every request.
    backgroundable: ClassVar[bool] = True
    # Actions that bypass the gate when the ability as a whole does not (its reads).
    internal_actions: ClassVar[frozenset[str]] = frozenset()
    sensitive: ClassVar[frozenset[str]] = frozenset()
    # Framework-made proxies (remote MCP tools) carry no examples of their own.
    proxy: ClassVar[bool] = False
    # Other names a model uses for a parameter (alias -> parameter), read as that
    # parameter when the real name is absent (chalie.calls.healing). Declared here only.
    aliases: ClassVar[Mapping[str, str]] = {}

    def __init__(
        self, context: TurnContext | None = None, services: Services | None = None
    ) -> None:
        self.context = context
        self.services = services
        # The id of the call this instance runs (set by the dispatcher; "" elsewhere).
        self.call_id = ""

    @property
    def cancelled(self) -> threading.Event:
        """Set by the dispatcher when the call is cancelled or times out.

        Python threads cannot be killed, so a long-running run() should check it.
        Made on first use (most calls end before anyone looks), the same event for
        every thread that asks.
        """
        found: threading.Event | None = self.__dict__.get("_cancelled")
        if found is None:
            found = self.__dict__.setdefault("_cancelled", threading.Event())
        return found

    def was_cancelled(self) -> bool:
        """Whether :attr:`cancelled` is set, without making the event nobody has asked for."""
        found: threading.Event | None = self.__dict__.get("_cancelled")
        return found is not None and found.is_set()

    # -- the work ---------------------------------------------------------
    def run(self, params: Any) -> ToolResult:
        raise NotImplementedError(f"{type(self).__name__}.run")

    @classmethod
    def implied_action(cls, params: Mapping[str, Any]) -> str | None:
        """The one action ``params`` can mean when a call names none and the schema has no
        default (None: the call is refused with missing-params). Pre-validation puts it in
        the parameters before anything else reads them, so the gate classifies exactly
        the action that runs. Override only where a single reading exists."""
        return None

    def classify(self, params: Mapping[str, Any]) -> str | None:
        """The action qualifier for the permission (``tool.action``), derived from inputs.

        The default takes the declared action, once pre-validation proved it is
        one of this ability's own actions; override to derive risk otherwise.
        """
        if self.actions:
            action = params.get(self.action_param)
            if isinstance(action, str) and action in self.actions:
                return action
        return None

    def reach(self, params: Mapping[str, Any]) -> str | None:
        """What this call reaches beyond Chalie, as one line for the person asked, or None.

        The one place an ability declares a **sensitive** action: one that runs
        a command, sends mail, deletes, or changes what Chalie connects to. A
        call with a reach is never covered by a tool-level ``allow``, only by a
        setting on its own ``tool.action`` (:func:`chalie.gate.policy.resolve`), and
        its permission prompt shows the line (the exact command line and
        environment names; for mail the recipients, subject and body). The
        default: nothing beyond Chalie.
        """
        return None

    def in_words(self, params: Mapping[str, Any]) -> str | None:
        """What this call will do, in words, where its parameters alone would not say it
        plainly (a reminder's RRULE read as "every day at 09:00"), or None.

        Shown on the call's permission prompt beside the parameters; unlike
        :meth:`reach` it makes nothing sensitive. The default: the parameters say it.
        """
        return None

    # -- the sealed assembler ---------------------------------------------
    @classmethod
    def input_schema(cls, *, allow_async: bool = False) -> dict[str, Any]:
        """The parameters schema with the framework fields injected."""
        schema = copy.deepcopy(dict(cls.parameters))
        schema.setdefault("properties", {})
        schema.pop("description", None)  # the Params docstring: the summary says it already
        cls._inject_framework_fields(schema, allow_async and cls.backgroundable)
        return schema

    @staticmethod
    def _inject_framework_fields(schema: dict[str, Any], allow_async: bool) -> None:
        props = dict(schema["properties"])
        # Short on purpose: every pinned tool repeats these in every request, and a
        # small model copies example values (so placeholders, never examples).
        props["act_summary"] = {"type": "string", "description": ACT_SUMMARY_DESCRIPTION}
        if allow_async:
            props["async"] = {"type": "boolean", "description": "Run in the background."}
        schema["properties"] = props
        required = [r for r in schema.get("required", []) if r != "act_summary"]
        schema["required"] = [*required, "act_summary"]

    @classmethod
    def descriptor(cls, *, allow_async: bool = False) -> dict[str, Any]:
        """The full descriptor the model sees: ``{name, description, input_schema}``.

        Assembled once per class (and ``allow_async``) while its name, summary and
        parameters stay the same objects, then handed out again: every model step
        of every turn asks for the descriptors of its tools. Read it; never
        change it (``input_schema`` gives a copy of one's own).
        """
        key = (cls.name, cls.summary, id(cls.parameters), allow_async)
        memo: dict[Any, dict[str, Any]] | None = cls.__dict__.get("_descriptor_memo")
        if memo is None:
            memo = {}
            cls._descriptor_memo = memo  # this class's own, not a parent's
        found = memo.get(key)
        if found is None:
            memo.clear()  # a declaration changed: the older assemblies are stale
            found = {
                "name": cls.name,
                "description": cls.summary,
                "input_schema": model_schema(cls.input_schema(allow_async=allow_async)),
            }
            memo[key] = found
        return found


# Bounds the model need not read: pre-validation enforces them from ``parameters`` and
# names the bound in its error. Each pinned tool costs its schema in every request.
MODEL_DROPPED: Final = frozenset({"minLength", "maxLength", "minItems", "maxItems"})


def model_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as the model reads it: size bounds left out, ``X | None`` shown as ``X``.

    An optional parameter that may be null is one the model can leave out; its
    ``anyOf: [X, {"type": "null"}]`` and ``default: null`` only cost tokens.
    """
    out = {k: v for k, v in schema.items() if k not in MODEL_DROPPED}
    options = out.get("anyOf")
    if isinstance(options, list):
        kept = [o for o in options if o != {"type": "null"}]
        if len(kept) == 1 and len(options) == 2 and isinstance(kept[0], dict):
            del out["anyOf"]
            if out.get("default", 0) is None:
                del out["default"]
            out = {**model_schema(kept[0]), **out}
    props = out.get("properties")
    if isinstance(props, dict):
        out["properties"] = {
            k: model_schema(v) if isinstance(v, dict) else v for k, v in props.items()
        }
    items = out.get("items")
    if isinstance(items, dict):
        out["items"] = model_schema(items)
    return out


def descriptor_of(cls: type[Ability], *, allow_async: bool = False) -> dict[str, Any]:
    """``Ability.descriptor`` for ``cls``, called through Ability itself: nothing can shadow it."""
    assemble: Any = vars(Ability)["descriptor"].__func__
    found: dict[str, Any] = assemble(cls, allow_async=allow_async)
    return found


def gate_internal(cls: type[Ability], permission: str) -> bool:
    """Whether a call with ``permission`` (``tool`` or ``tool.action``) bypasses the gate."""
    if cls.internal:
        return True
    tool, dot, action = permission.partition(".")
    return bool(dot) and tool == cls.name and action in cls.internal_actions
