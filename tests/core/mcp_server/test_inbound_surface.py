"""What the inbound server says about itself: version, capabilities, resource metadata, the
bearer scheme, and the rich content of a turn (the SDK client over loopback, both modes)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import AudioContent, EmbeddedResource, ImageContent, ResourceLink, TextContent

import chalie
from chalie.gate.tokens import bearer as bearer_secret
from tests.conversations_double import PNG
from tests.core.mcp_server.harness import MODES, connect, running

# Starts an MCP HTTP server with the SDK client: deselect with -m "not slow".
pytestmark = pytest.mark.slow

ARGS: dict[str, Any] = {
    "message": "draw a picture",
    "agent_name": "claude-code",
    "project_or_task_name": "chalie",
}


def test_both_generations_say_the_same_version_and_capabilities() -> None:
    with running() as r:
        secret = r.tokens.create("coder")
        seen: dict[str, Any] = {}

        async def go(mode: str) -> None:
            async with connect(r.url, secret, mode) as client:
                seen[mode] = (client.server_info.version, client.server_capabilities)
                with pytest.raises(MCPError) as err:
                    await client.list_resources()
                assert err.value.error.code == -32601
                with pytest.raises(MCPError):
                    await client.list_prompts()

        for mode in MODES:
            asyncio.run(go(mode))
        versions = {v for v, _ in seen.values()}
        assert versions == {chalie.__version__}
        caps = [c.model_dump(exclude_none=True) for _, c in seen.values()]
        assert caps[0] == caps[1] == {"tools": {"list_changed": False}}


def test_protected_resource_metadata_is_served_without_a_token() -> None:
    with running() as r:
        origin = r.url.rsplit("/", 1)[0]
        with httpx2.Client(timeout=10) as http:
            for path in (
                "/.well-known/oauth-protected-resource",
                "/.well-known/oauth-protected-resource/mcp",
            ):
                resp = http.get(origin + path)
                assert resp.status_code == 200, path
                meta = resp.json()
                assert meta["resource"] == r.url
                assert meta["bearer_methods_supported"] == ["header"]
                assert "authorization_servers" not in meta
            for path in (
                "/.well-known/oauth-authorization-server",
                "/.well-known/openid-configuration",
                "/.well-known/oauth-protected-resource/elsewhere",
            ):
                assert http.get(origin + path).status_code == 404, path
            refused = http.post(r.url, json={})
            assert refused.status_code == 401
            assert (
                f'resource_metadata="{origin}/.well-known/oauth-protected-resource"'
                in refused.headers["www-authenticate"]
            )
        assert r.talk.stats.calls == 0


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
def test_the_bearer_scheme_is_case_insensitive(scheme: str) -> None:
    with running() as r:
        secret = r.tokens.create("coder")

        async def go() -> list[str]:
            async with httpx2.AsyncClient(headers={"Authorization": f"{scheme} {secret}"}) as h:
                from mcp.client import Client
                from mcp.client.streamable_http import streamable_http_client

                async with Client(streamable_http_client(r.url, http_client=h)) as client:  # type: ignore[arg-type]
                    return [t.name for t in (await client.list_tools()).tools]

        assert asyncio.run(go()) == ["talk_to_chalie"]


def test_bearer_secret_is_one_rule() -> None:
    assert bearer_secret("Bearer abcdefgh1234") == "abcdefgh1234"
    assert bearer_secret("bearer abcdefgh1234") == "abcdefgh1234"
    for bad in (
        "Basic abcdefgh1234",
        "Bearer",
        "Bearer short",
        "Bearerabcdefgh1234",
        "Bearer a b c d e f",
    ):
        assert bearer_secret(bad) is None, bad


@pytest.mark.parametrize("mode", MODES)
def test_a_turns_rich_results_reach_the_agent_as_mcp_content(mode: str) -> None:
    with running() as r:
        secret = r.tokens.create("coder")

        async def go() -> Any:
            async with connect(r.url, secret, mode) as client:
                return await client.call_tool("talk_to_chalie", ARGS)

        result = asyncio.run(go())
        assert not result.is_error
        first, *rest = result.content
        assert isinstance(first, TextContent) and "2+2 is 4." in first.text
        kinds = [type(b) for b in rest]
        assert kinds == [ImageContent, AudioContent, EmbeddedResource, ResourceLink]
        image = rest[0]
        assert isinstance(image, ImageContent) and image.data == PNG
        link = rest[3]
        assert isinstance(link, ResourceLink) and str(link.uri) == "demo://doc/2"
