"""A healed call is gated on its healed arguments: no healing makes a denied action allowed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

import msgspec
import pykka
import pytest

from actors.calls.dispatcher import submit
from chalie.ability import Ability
from chalie.result import ToolResult
from chalie.wire.messages import ToolCall
from tests.actors.rig import EX, Rig, ctx


class VaultParams(msgspec.Struct, forbid_unknown_fields=True):
    action: Literal["read", "wipe"]
    count: int = 1
    tags: list[str] = []


class Vault(Ability):
    name = "vault"
    summary = "A vault."
    tooltip = "Vault"
    examples = EX
    Params = VaultParams
    actions = {"read": (), "wipe": ()}
    aliases = {"op": "action", "n": "count"}
    ran: ClassVar[list[dict[str, Any]]] = []

    def run(self, params: VaultParams) -> ToolResult:
        Vault.ran.append(msgspec.to_builtins(params))
        return ToolResult.success("done")


@pytest.fixture(autouse=True)
def _no_leftover_actors() -> Iterator[None]:
    yield
    pykka.ActorRegistry.stop_all()


@pytest.fixture
def rig(tmp_path: Path) -> Any:
    r = Rig(tmp_path)
    r.registry.add(Vault, source="tests")
    r.policy.proxy().set("chat", "vault.read", "allow").get()
    r.policy.proxy().set("chat", "vault.wipe", "deny").get()
    Vault.ran.clear()
    return r


def dispatch(rig: Any, arguments: dict[str, Any] | None = None, bare: Any = None) -> Any:
    call = ToolCall(call_id="c", tool="vault", arguments=arguments or {}, context=ctx(), bare=bare)
    return submit(rig.ref, call).result(5)


WIPES: list[tuple[dict[str, Any] | None, Any]] = [
    ({"op": "wipe"}, None),  # an alias
    ({"action": "wipe", "count": "3"}, None),  # a number as a string
    ({"action": "wipe", "tags": "x"}, None),  # one value for a list
    ({"action": "wipe", "tags": '["x"]'}, None),  # a JSON string for a list
    ({"op": "wipe", "n": "2", "tags": "[]"}, None),  # all at once
    (None, "wipe"),  # a bare value for the one required parameter
]


@pytest.mark.parametrize(("arguments", "bare"), WIPES)
def test_every_healing_of_a_denied_action_is_denied(rig: Any, arguments: Any, bare: Any) -> None:
    outcome = dispatch(rig, arguments, bare)
    assert outcome.code == "permission-denied"
    assert Vault.ran == []
    (row,) = rig.rows()
    assert row.permission == "vault.wipe" and row.healed


@pytest.mark.parametrize(("arguments", "bare"), WIPES)
def test_the_same_healings_of_an_allowed_action_run_exactly_what_the_gate_saw(
    rig: Any, arguments: Any, bare: Any
) -> None:
    swap = {k: "read" if v == "wipe" else v for k, v in (arguments or {}).items()}
    outcome = dispatch(rig, swap or None, "read" if bare else None)
    assert outcome.status == "success"
    (row,) = rig.rows()
    assert row.permission == "vault.read"
    assert Vault.ran == [msgspec.json.decode(row.params)]


@pytest.mark.parametrize(
    "arguments",
    [
        {"op": "read", "action": "wipe"},  # both names: nothing is guessed
        {"action": ["read"]},  # a list is not one action
        {"action": "READ"},
        {"op": "read", "action": "read", "extra": 1},
    ],
)
def test_what_healing_cannot_read_one_way_is_refused_before_the_gate(
    rig: Any, arguments: dict[str, Any]
) -> None:
    outcome = dispatch(rig, arguments)
    assert outcome.code in ("invalid-param", "unknown-action")
    assert Vault.ran == []
    assert '"action": "<action>"' in outcome.envelope  # the hint shows the right shape
    (row,) = rig.rows()
    assert row.permission is None  # never reached the gate


def test_a_bare_array_for_a_tool_with_no_single_array_parameter_is_refused(rig: Any) -> None:
    outcome = dispatch(rig, None, ["wipe"])
    assert outcome.code == "invalid-param" and Vault.ran == []
    assert "call vault as" in outcome.envelope
