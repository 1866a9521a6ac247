"""Remote tools in the real discovery index: added on sync and list_changed, dropped on
quarantine, found by meaning and by name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.discovery import DiscoveryActor, DiscoveryHandle
from chalie.mcp.spec import ServerSpec
from chalie.process.config import McpConfig
from tools.fixture_mcp.rig import FixtureServer, Rig
from tools.waiting import wait_until

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow


@pytest.fixture
def found(tmp_path: Path) -> Iterator[tuple[Rig, DiscoveryHandle, FixtureServer]]:
    rig = Rig(tmp_path, config=McpConfig(heartbeat_interval=3600, start_delay=0))
    actor = DiscoveryActor.start(registry=rig.registry, home=None)
    handle = DiscoveryHandle(actor, timeout=60)
    rig.deps.discovery = handle
    srv = FixtureServer()
    try:
        yield rig, handle, srv
    finally:
        srv.kill()
        actor.stop()
        rig.close()


def test_remote_tools_are_found_and_quarantine_hides_them(
    found: tuple[Rig, DiscoveryHandle, FixtureServer],
) -> None:
    rig, handle, srv = found
    rig.add(ServerSpec(name="fx", transport="http", url=srv.url))
    rig.start()
    rig.wait_tools("fx", 8)
    wait_until(lambda: "_mcp_fx_add" in handle.find(["add two integers"]).names, 60, "by meaning")
    assert handle.find(["_mcp_fx_echo"]).names[:1] == ["_mcp_fx_echo"]
    rig.allow("_mcp_fx_*")
    assert rig.run("_mcp_fx_grow", {"count": 3}).status == "success"
    wait_until(lambda: "_mcp_fx_grown_3" in handle.find(["_mcp_fx_grown_3"]).names, 20, "grown")
    assert rig.run("_mcp_fx_mutate").status == "success"
    wait_until(lambda: "_mcp_fx_echo" not in handle.find(["_mcp_fx_echo"]).names, 20, "hidden")


def test_a_bare_name_two_servers_offer_is_refused_as_ambiguous(
    found: tuple[Rig, DiscoveryHandle, FixtureServer],
) -> None:
    rig, handle, srv = found
    rig.add(ServerSpec(name="one", transport="http", url=srv.url))
    rig.add(ServerSpec(name="two", transport="http", url=srv.url))
    rig.start()
    rig.wait_tools("one", 8)
    rig.wait_tools("two", 8)

    def refused() -> list[str]:
        for entry in handle.find(["structured"]).not_found:
            if entry.get("reason") == "ambiguous":
                return sorted(entry["candidates"])
        return []

    assert wait_until(refused, 30, "ambiguity") == ["_mcp_one_structured", "_mcp_two_structured"]
    assert handle.find(["_mcp_two_structured"]).names[:1] == ["_mcp_two_structured"]
