from tests.mcp.rig import FixtureServer, Rig, stdio_spec
from chalie.mcp.spec import ServerSpec
from chalie.envelope import parse


def test_smoke(rig: Rig) -> None:
    srv = FixtureServer()
    try:
        rig.add(ServerSpec(name="fx", transport="http", url=srv.url))
        rig.start()
        rig.wait_online("fx")
        rig.wait_tools("fx", 8)
        print(rig.registry.names())
        rig.allow("_mcp_fx_echo")
        out = rig.run("_mcp_fx_echo", {"text": "hello"})
        print(out)
        assert out.status == "success"
    finally:
        srv.kill()
