"""The heartbeat re-syncs the tool list each cycle; an _mcp_ name nobody offers is
mcp-unknown-tool (real fixture servers over loopback, the real dispatcher)."""

from __future__ import annotations

import pytest

from chalie.mcp.spec import ServerSpec
from tools.fixture_mcp.rig import FixtureServer, Rig
from tools.waiting import wait_until

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow


@pytest.mark.slow
def test_the_heartbeat_finds_tools_added_without_an_announcement(rig: Rig) -> None:
    srv = FixtureServer()
    try:
        rig.add(ServerSpec(name="fx", transport="http", url=srv.url))
        rig.start()
        rig.wait_tools("fx", 8)
        rig.allow("_mcp_fx_*")
        assert rig.run("_mcp_fx_quietly", {"count": 2}).status == "success"
        # no list_changed was sent: only the heartbeat's re-sync can find them (1 s cycles)
        wait_until(lambda: "_mcp_fx_quiet_2" in rig.registry, 10, "quiet tools registered")
        assert rig.registry.get("_mcp_fx_quiet_1") is not None
        out = rig.run("_mcp_fx_quiet_2", {"x": 3})
        assert out.status == "success" and "quiet 2: 3" in out.envelope
    finally:
        srv.kill()


def test_an_mcp_name_no_server_offers_is_mcp_unknown_tool(rig: Rig) -> None:
    rig.start()
    out = rig.run("_mcp_nosuch_tool", {})
    assert out.status == "error" and out.code == "mcp-unknown-tool"
    assert "nosuch" in out.envelope
    plain = rig.run("no_such_builtin", {})
    assert plain.code == "unknown-tool"
    odd = rig.run("_mcp_", {})
    assert odd.code == "unknown-tool"
