"""A fixture MCP server (stdio) that asks back: roots, sampling, elicitation, progress, logs.

``python -m tools.fixture_mcp.capable``. Tools: ``where`` (the client's roots),
``think`` (samples the client's model), ``ask_name`` (a form elicitation),
``ask_password`` (a form asking for a secret), ``open_link`` (a URL-mode elicitation),
``count`` (reports progress
``n`` times, ``pause`` seconds apart), ``chatter`` (``n`` log messages).
Every request back goes through the SDK's resolvers, so it works on both protocol
generations.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from mcp.server.elicitation import AcceptedElicitation, ElicitationResult
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, ListRoots, Resolve, Sample
from mcp_types import CreateMessageResult, ListRootsResult, SamplingMessage, TextContent
from pydantic import BaseModel, Field

srv = MCPServer("capable", version="1", log_level="WARNING")


def want_roots() -> ListRoots:
    return ListRoots()


@srv.tool()
def where(roots: Annotated[ListRootsResult, Resolve(want_roots)]) -> str:
    """The client's roots."""
    return ",".join(str(r.uri) for r in roots.roots) or "(no roots)"


def want_sample(question: str) -> Sample:
    text = TextContent(type="text", text=question)
    return Sample(
        [SamplingMessage(role="user", content=text)],
        max_tokens=64,
        system_prompt="Answer in one word.",
    )


@srv.tool()
def think(question: str, answer: Annotated[CreateMessageResult, Resolve(want_sample)]) -> str:
    """Ask the client's model."""
    content = answer.content
    return f"model said: {getattr(content, 'text', content)}"


class Name(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=150)


def want_name() -> Elicit[Name]:
    return Elicit("What is your name and age?", Name)


@srv.tool()
def ask_name(got: Annotated[ElicitationResult[Name], Resolve(want_name)]) -> str:
    """Ask the user their name."""
    if isinstance(got, AcceptedElicitation):
        return f"hello {got.data.name} ({got.data.age})"
    return f"no answer ({got.action})"


class Login(BaseModel):
    user: str
    password: str


def want_login() -> Elicit[Login]:
    return Elicit("Your login, please", Login)


@srv.tool()
def ask_password(got: Annotated[ElicitationResult[Login], Resolve(want_login)]) -> str:
    """Ask the user for a password (a client must never fill it)."""
    if isinstance(got, AcceptedElicitation):
        return f"got a password for {got.data.user}"
    return f"no login ({got.action})"


@srv.tool()
async def open_link(url: str, ctx: Context) -> str:
    """Ask the user to open a link themselves (URL-mode elicitation)."""
    got = await ctx.elicit_url("Please sign in at the provider", url, "consent-1")
    return f"url elicitation: {got.action}"


@srv.tool()
async def count(n: int, ctx: Context, pause: float = 0.0) -> str:
    """Report progress n times."""
    for i in range(n):
        await ctx.report_progress(i + 1, n, f"step {i + 1}")
        if pause:
            await asyncio.sleep(pause)
    return f"counted {n}"


@srv.tool()
async def stamp(n: int, ctx: Context, pause: float = 0.01) -> str:
    """Report progress n times, each message the wall-clock time it was sent."""
    import time

    for i in range(n):
        await ctx.report_progress(i + 1, n, repr(time.time()))
        await asyncio.sleep(pause)
    return f"stamped {n}"


@srv.tool()
async def chatter(n: int, ctx: Context) -> str:
    """Send n log messages."""
    for i in range(n):
        await ctx.info(f"chatter line {i} token=hunter2")
    return f"chattered {n}"


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    srv.run("stdio")
