"""The dispatcher's test rig: sample abilities, a turn context, and the Rig that runs a real
dispatcher, gate and worker pool over them."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pykka

from actors.calls.dispatcher import DispatcherActor, submit
from actors.child_ref import ChildRef
from actors.gate.policy import PolicyActor
from chalie.ability import Ability
from chalie.calls.envelope import parse
from chalie.calls.registry import Registry
from chalie.result import ToolResult
from chalie.services import Services
from chalie.wire.bus import EventBus
from chalie.wire.events import PermissionRequest
from chalie.wire.messages import RequestSettled, ToolCall, ToolOutcome, TurnContext
from tools import sample_abilities

EX = ("one", "two", "three", "four", "five", "six")


class _Test(Ability):
    abstract = True
    summary = "A test ability."
    tooltip = "test"
    examples = EX
    discoverable = False


class Fast(_Test):
    name = "fast"

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success("fast")


class SlowParams(msgspec.Struct):
    seconds: float = 2.0


class Slow(_Test):
    """Sleeps, but wakes up when the dispatcher signals a cancel or a timeout."""

    name = "slow"
    Params = SlowParams
    woke_early: ClassVar[list[str]] = []

    def run(self, params: SlowParams) -> ToolResult:
        if self.cancelled.wait(params.seconds):
            assert self.context is not None
            Slow.woke_early.append(self.context.turn_id)
        return ToolResult.success("slept")


class Hang(Slow):
    name = "hang"
    timeout = 0.3


class Boom(_Test):
    name = "boom"

    def run(self, params: Any) -> ToolResult:
        raise RuntimeError("kaboom")


class MailParams(msgspec.Struct, forbid_unknown_fields=True):
    action: str = "read"
    to: str | None = None
    password: str | None = None


class Mail(_Test):
    name = "mail"
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["read", "send"]},
            "to": {"type": "string"},
            "password": {"type": "string"},
        },
        "additionalProperties": False,
    }
    actions = {"read": (), "send": ("to",)}
    sensitive = frozenset({"password"})

    def run(self, params: dict[str, Any]) -> ToolResult:
        return ToolResult.success(f"mail {params.get('action', 'read')}")


class BadInit(_Test):
    name = "bad_init"

    def __init__(self, *args: Any) -> None:
        raise OSError("no config")


class Lookup(_Test):
    name = "lookup"
    internal = True

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success("looked up")


class BadClassify(_Test):
    name = "bad_classify"

    def classify(self, params: Mapping[str, Any]) -> str | None:
        raise ValueError("cannot tell")


class ShortSleep(sample_abilities.Sleep):
    """The worker-process sleeper with a short timeout."""

    name = "sample_short_sleep"
    timeout = 0.5


ARGS: dict[str, Any] = {"act_summary": "a test call"}


def ctx(turn: str = "t1", channel: str = "chat", **over: Any) -> TurnContext:
    over.setdefault("scope", "unrestricted")
    return TurnContext(
        conversation_id=over.pop("conversation", "conv"), turn_id=turn, channel=channel, **over
    )  # type: ignore[arg-type]


class Rig:
    def __init__(
        self, home: Path, *, workers: Any = None, expiry: float = 300.0, **dispatcher_kw: Any
    ) -> None:
        self.db = home / "chalie.db"
        self.registry = Registry()
        for cls in (Fast, Slow, Hang, Boom, Mail, Lookup, BadClassify, BadInit):
            self.registry.add(cls, source="tests")
        for cls in (
            sample_abilities.Echo,
            sample_abilities.KillSelf,
            sample_abilities.Sleep,
            ShortSleep,
        ):
            self.registry.add(cls, source="tests")
        self.bus = EventBus()
        self.events = self.bus.subscribe_queue(None)
        self.policy = PolicyActor.start(self.db, self.bus, approval_expiry=expiry)
        self.policy_ref: pykka.ActorRef[Any] | None = self.policy
        for tool in (
            "fast",
            "slow",
            "hang",
            "boom",
            "mail",
            "sample_echo",
            "sample_kill_self",
            "sample_sleep",
            "sample_short_sleep",
            "bad_classify",
        ):
            self.policy.proxy().set("chat", tool, "allow").get()
        self.services = Services()
        self.handle = ChildRef(lambda: self.policy_ref, "policy", PolicyActor)
        self.ref = DispatcherActor.start(
            self.registry,
            self.services,
            self.db,
            self.handle,
            workers,
            self.bus,
            **dispatcher_kw,
        )

    def call(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        call_id: str = "c1",
        context: TurnContext | None = None,
    ) -> Future[ToolOutcome]:
        arguments = dict(args or {})
        arguments.setdefault("act_summary", "a test call")
        return submit(
            self.ref,
            ToolCall(call_id=call_id, tool=tool, arguments=arguments, context=context or ctx()),
        )

    def run(self, *a: Any, **kw: Any) -> ToolOutcome:
        return self.call(*a, **kw).result(10)

    def rows(self, **filters: Any) -> list[Any]:
        rows: list[Any] = self.ref.proxy().trail(**filters).get(timeout=5)
        return rows

    def request(self) -> PermissionRequest:
        """The next permission request published (settlements of earlier ones skipped)."""
        while True:
            event = self.events.queue.get(timeout=5)
            if not isinstance(event, RequestSettled):
                assert isinstance(event, PermissionRequest), event
                return event


def attrs(outcome: ToolOutcome) -> dict[str, Any]:
    (env,) = parse(outcome.envelope)
    return env.attrs
