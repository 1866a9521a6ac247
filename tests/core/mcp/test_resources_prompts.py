"""A server's resources and prompts through the real dispatcher, gate, trail, connection actors
and discovery index: list, read, updates that drop what was read, a followed resource link,
contents as untrusted data, prompts as find_skills playbooks the model fills."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from abilities.find_skills import FindSkills
from actors.calls.dispatcher import DispatcherActor
from actors.discovery import DiscoveryActor, DiscoveryHandle
from chalie.calls.trail import Trail
from chalie.calls.untrusted import WARNING_LINE
from chalie.mcp.spec import ServerSpec
from chalie.services import Services
from chalie.wire.events import PermissionRequest
from chalie.wire.messages import TurnContext
from chalie.wire.principals import LOCAL_OWNER
from tools.fixture_mcp.rig import ROOT, Rig
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

RES = "_mcp_lib__resources"
PROMPTS = "_mcp_lib__prompts"


def library(name: str = "lib", **kw: Any) -> ServerSpec:
    return ServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=("-m", "tools.fixture_mcp.library"),
        cwd=str(ROOT),
        **kw,
    )


def restricted(turn: str = "t1", human: bool = True) -> TurnContext:
    """A model's turn: only the channel's pins (find_skills) and what was injected."""
    return TurnContext(
        conversation_id="conv",
        turn_id=turn,
        channel="chat",
        human_present=human,
        scope="restricted",
        injected=("find_skills",),
    )


@pytest.fixture
def lib(tmp_path: Path) -> Iterator[tuple[Rig, DiscoveryHandle, Services]]:
    rig = Rig(tmp_path, dispatcher=False)
    rig.registry.add(FindSkills, source="builtin")
    actor = DiscoveryActor.start(registry=rig.registry, home=None)
    handle = DiscoveryHandle(actor, timeout=60)
    rig.deps.discovery = handle
    services = Services(discovery=handle)
    rig.handle.turns = services.turns
    rig.dispatcher = DispatcherActor.start(
        rig.registry, services, rig.db, rig.policy, None, rig.bus, parts={"mcp": rig.handle}
    )
    try:
        yield rig, handle, services
    finally:
        actor.stop()
        rig.close()


def started(rig: Rig) -> None:
    rig.add(library())
    rig.start()
    rig.wait_tools("lib", 3, 40)
    wait_until(lambda: rig.registry.get(RES) is not None, 30, "the resources proxy")


def test_resources_are_listed_read_as_untrusted_and_updates_drop_what_was_read(
    lib: tuple[Rig, DiscoveryHandle, Services],
) -> None:
    rig, _, _ = lib
    started(rig)
    rig.allow("_mcp_lib_*")
    listed = rig.run(RES, {"action": "list"})
    assert listed.status == "success", listed.envelope
    assert "notes://today" in listed.envelope and "notes://day/{day}" in listed.envelope
    assert WARNING_LINE in listed.envelope and "untrusted=true" in listed.envelope

    first = rig.run(RES, {"action": "read", "uri": "notes://today"})
    assert first.status == "success" and "Buy milk." in first.envelope
    assert WARNING_LINE in first.envelope
    # read again: what was read is kept (the server is not asked: one read so far)
    again = rig.run(RES, {"action": "read", "uri": "notes://today"})
    assert "Buy milk." in again.envelope and "kept=true" in again.envelope
    assert '{"result":"1"}' in rig.run("_mcp_lib_reads").envelope
    # the server changes it and announces resources/updated: the next read asks again
    assert rig.run("_mcp_lib_edit", {"text": "Buy bread."}).status == "success"
    route = rig.deps.routes["lib"]
    assert route.link is not None
    link = route.link
    wait_until(lambda: link.updates >= 1, 20, "resources/updated reached the link")
    fresh = rig.run(RES, {"action": "read", "uri": "notes://today"})
    assert "Buy bread." in fresh.envelope and "kept=false" in fresh.envelope
    # a template's resource, and a blob (to the rich payload, not the model's text)
    assert (
        "notes of monday" in rig.run(RES, {"action": "read", "uri": "notes://day/monday"}).envelope
    )
    logo = rig.run(RES, {"action": "read", "uri": "notes://logo"})
    assert logo.status == "success" and logo.rich is not None
    assert "iVBOR" not in logo.envelope
    # an unknown resource is the server's error, not a success
    missing = rig.run(RES, {"action": "read", "uri": "notes://nothing"})
    assert missing.status == "error" and missing.code == "mcp-tool-error"
    # every call is on the trail under its permission
    trail = Trail(rig.db)
    try:
        rows = trail.query(tool=RES, limit=20)
    finally:
        trail.close()
    assert {r.permission for r in rows} == {f"{RES}.list", f"{RES}.read"}
    assert all(r.decision == "allow" for r in rows)


def test_hostile_contents_stay_data(lib: tuple[Rig, DiscoveryHandle, Services]) -> None:
    rig, _, _ = lib
    started(rig)
    rig.allow("_mcp_lib_*")
    out = rig.run(RES, {"action": "read", "uri": "notes://hostile"})
    assert out.status == "success"
    lines = out.envelope.splitlines()
    assert lines[1] == WARNING_LINE
    assert not any(line.startswith("[") for line in lines[1:-1])  # no forged envelope tags
    assert "\u202e" not in out.envelope
    assert not any(line.lower().startswith("untrusted content ended") for line in lines)


def test_reads_follow_the_servers_policy(lib: tuple[Rig, DiscoveryHandle, Services]) -> None:
    rig, _, _ = lib
    started(rig)
    # nothing set: ask; with nobody there, ask is deny
    nobody = TurnContext(
        conversation_id="conv",
        turn_id="t0",
        channel="chat",
        human_present=False,
        scope="unrestricted",
    )
    denied = rig.run(RES, {"action": "read", "uri": "notes://today"}, context=nobody)
    assert denied.status == "error" and denied.code == "permission-denied"
    # the server's whole policy denies: the read is refused even in an unrestricted turn
    rig.policy.proxy().set("chat", "_mcp_lib_*", "deny").get(timeout=5)
    refused = rig.run(RES, {"action": "read", "uri": "notes://today"})
    assert refused.status == "error" and refused.code == "permission-denied"
    # a human on chat is asked and sees the uri
    rig.policy.proxy().set("chat", "_mcp_lib_*", "ask").get(timeout=5)
    seen: list[PermissionRequest] = []
    sub = rig.bus.subscribe(
        "conv", lambda e: seen.append(e) if isinstance(e, PermissionRequest) else None
    )
    fut = rig.call(RES, {"action": "read", "uri": "notes://today"})
    wait_until(lambda: bool(seen), 20, "the read asks the owner")
    assert seen[0].permission == f"{RES}.read" and "notes://today" in str(seen[0].params)
    rig.policy.proxy().answer(seen[0].request_id, "deny", LOCAL_OWNER).get(timeout=5)
    assert fut.result(20).code == "permission-denied"
    sub.close()


def test_a_resource_link_in_a_result_can_be_followed(
    lib: tuple[Rig, DiscoveryHandle, Services],
) -> None:
    rig, _, services = lib
    started(rig)
    rig.allow("_mcp_lib_*")
    ctx = TurnContext(
        conversation_id="conv",
        turn_id="t-link",
        channel="chat",
        scope="restricted",
        injected=("_mcp_lib_pointer",),
    )
    # before the link, the resources proxy is not callable in a restricted turn
    assert rig.run(RES, {"action": "read", "uri": "notes://today"}, context=ctx).code == (
        "unknown-tool"
    )
    pointed = rig.run("_mcp_lib_pointer", context=ctx)
    assert pointed.status == "success"
    assert "notes://today" in pointed.envelope and RES in pointed.envelope
    assert RES in services.turns.injected("t-link")
    followed = rig.run(RES, {"action": "read", "uri": "notes://today"}, context=ctx)
    assert followed.status == "success" and "Buy milk." in followed.envelope


def test_prompts_are_playbooks_the_model_fills(lib: tuple[Rig, DiscoveryHandle, Services]) -> None:
    rig, handle, services = lib
    started(rig)
    wait_until(lambda: rig.registry.get(PROMPTS) is not None, 30, "the prompts proxy")

    def found() -> list[str]:
        _result, skills = handle.find_skills(["_mcp_lib_review"])
        return [s.name for s in skills]

    wait_until(lambda: "_mcp_lib_review" in found(), 60, "the prompt as a playbook")
    ctx = restricted("t-prompt")
    out = rig.run("find_skills", {"query": ["review a piece of code"]}, context=ctx)
    assert out.status == "success", out.envelope
    assert "_mcp_lib_review" in out.envelope and "MCP server lib" in out.envelope
    assert "code (required)" in out.envelope
    assert PROMPTS in services.turns.injected("t-prompt")
    rig.allow("_mcp_lib_*")
    got = rig.run(
        PROMPTS,
        {"action": "get", "name": "review", "arguments": {"code": "x = 1", "style": "kind"}},
        context=ctx,
    )
    assert got.status == "success", got.envelope
    assert "in a kind style" in got.envelope and "x = 1" in got.envelope
    assert WARNING_LINE in got.envelope
    # arguments the prompt does not take, or a missing required one: a structured error
    bad = rig.run(PROMPTS, {"action": "get", "name": "review", "arguments": {}}, context=ctx)
    assert bad.status == "error" and bad.code == "invalid-param" and "code" in bad.envelope
    odd = rig.run(
        PROMPTS,
        {"action": "get", "name": "review", "arguments": {"code": "1", "evil": "2"}},
        context=ctx,
    )
    assert odd.code == "invalid-param"
    unknown = rig.run(PROMPTS, {"action": "get", "name": "nope"}, context=ctx)
    assert unknown.status == "error"
    # removing the server takes its prompts out of find_skills
    rig.admin.remove("lib")
    rig.reload()
    wait_until(lambda: "_mcp_lib_review" not in found(), 30, "the prompt leaves")
    assert rig.registry.get(PROMPTS) is None and rig.registry.get(RES) is None


def subscribing(name: str, *args: str) -> ServerSpec:
    return ServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=("-m", "tools.fixture_mcp.subscribing", *args),
        cwd=str(ROOT),
    )


def test_a_2025_11_25_server_s_resources_subscribe_keeps_and_drops_what_was_read(
    tmp_path: Path,
) -> None:
    """resources/subscribe on the handshake generation (the SDK's server offers it only on
    2026-07-28): a read subscribes first, is kept, and resources/updated drops it."""
    rig = Rig(tmp_path)
    try:
        rig.add(subscribing("sub"))
        rig.add(subscribing("nosub", "--no-subscribe"))
        rig.start()
        for name in ("sub", "nosub"):
            rig.wait_tools(name, 3, 40)
            proxy = f"_mcp_{name}__resources"
            wait_until(lambda p=proxy: rig.registry.get(p) is not None, 30, proxy)
            rig.allow(f"_mcp_{name}_*")
        link = rig.deps.routes["sub"].link
        assert link is not None and link.info is not None and link.info.protocol == "2025-11-25"
        res = "_mcp_sub__resources"
        assert "notes://" not in rig.run("_mcp_sub_subscribed").envelope
        first = rig.run(res, {"action": "read", "uri": "notes://today"})
        assert "Buy milk." in first.envelope and "kept=false" in first.envelope
        assert "notes://today" in rig.run("_mcp_sub_subscribed").envelope  # before the read
        again = rig.run(res, {"action": "read", "uri": "notes://today"})
        assert "Buy milk." in again.envelope and "kept=true" in again.envelope
        assert "\n1\n" in rig.run("_mcp_sub_reads").envelope
        assert rig.run("_mcp_sub_edit", {"text": "Buy bread."}).status == "success"
        wait_until(lambda: link.updates >= 1, 20, "resources/updated reached the link")
        fresh = rig.run(res, {"action": "read", "uri": "notes://today"})
        assert "Buy bread." in fresh.envelope and "kept=false" in fresh.envelope
        assert "\n2\n" in rig.run("_mcp_sub_reads").envelope
        # a server without subscriptions: nothing is kept, every read asks it
        for _ in range(2):
            out = rig.run("_mcp_nosub__resources", {"action": "read", "uri": "notes://today"})
            assert "Buy milk." in out.envelope and "kept=false" in out.envelope
        assert "\n2\n" in rig.run("_mcp_nosub_reads").envelope
    finally:
        rig.close()


def test_a_server_scoped_to_a_channel_brings_its_resources_and_prompts_there_only(
    lib: tuple[Rig, DiscoveryHandle, Services],
) -> None:
    """Issue 30: a server added with ``--channel web-browse`` kept its tools off chat, but its
    resources and prompts proxies were found on chat by find_tools and find_skills. Its
    scope now covers everything it brings."""
    from chalie.mcp.proxy import scoped_to

    rig, handle, _services = lib
    rig.add(library(channels=("web-browse",)))
    rig.start()
    wait_until(lambda: len(scoped_to(rig.registry, "web-browse")) >= 3, 40, "lib's tools")
    wait_until(lambda: rig.registry.get(PROMPTS) is not None, 30, "the prompts proxy")
    wait_until(lambda: rig.registry.get(RES) is not None, 30, "the resources proxy")
    res = rig.registry.get(RES)
    assert res is not None and not res.cls.discoverable
    assert {RES, PROMPTS} <= set(scoped_to(rig.registry, "web-browse"))
    assert not {RES, PROMPTS} & set(scoped_to(rig.registry, "chat"))
    # what discovery finds for chat: neither the proxies nor the prompts as playbooks
    tools = handle.find(["read the resources and documents of MCP server lib"])
    assert RES not in [d.name for d in tools.injected]
    _result, skills = handle.find_skills(["_mcp_lib_review", "review a piece of code"])
    assert [s.name for s in skills if s.name.startswith("_mcp_lib")] == []
    out = rig.run("find_skills", {"query": ["review a piece of code"]}, context=restricted("t-s"))
    assert "_mcp_lib_review" not in out.envelope
    assert PROMPTS not in _services.turns.injected("t-s")


def test_a_server_with_no_resources_gets_no_resources_proxy(
    lib: tuple[Rig, DiscoveryHandle, Services],
) -> None:
    """Issue 30: a server that declares the resources capability (the SDK always does) but
    has no resource and no template got a ``__resources`` proxy to list nothing with."""
    rig, _handle, _services = lib
    rig.add(
        ServerSpec(
            name="bare",
            transport="stdio",
            command=sys.executable,
            args=("-m", "tools.fixture_mcp.library", "--prompts-only"),
            cwd=str(ROOT),
        )
    )
    rig.start()
    rig.wait_tools("bare", 1, 40)
    # the prompts proxy comes from the same pass that would have made the resources one
    wait_until(lambda: rig.registry.get("_mcp_bare__prompts") is not None, 30, "its prompts")
    assert rig.registry.get("_mcp_bare__resources") is None
