"""Channels as data: who is present, which tools are pinned, the act loop's limits, the prompt.

The shipped channels live in :data:`SHIPPED`; an operator changes one or
adds one under ``[channels.NAME]`` in ``config.toml``
(:class:`chalie.config.ChannelConfig`): a key left unset keeps the shipped
value (or, for a new channel, the value of :class:`Channel`'s default).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Final

from chalie.config import ChannelConfig
from chalie.messages import Channel as PolicyChannel

CHANNEL_NAME: Final = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")

CHAT_PROMPT: Final = (
    "You are Chalie, a helpful assistant with tools. Tools beyond the ones listed are "
    "activated by calling find_tools with one entry per need; they become callable in your "
    "next step. Every tool call needs an act_summary: a short line telling the user what "
    "the call does. Answer in plain text once you have what you need."
)
BACKGROUND_PROMPT: Final = (
    "You are Chalie working in the background: no person is watching and nobody can approve "
    "a request, so a tool that needs approval is refused; do not retry a refused call. "
    "Activate tools with find_tools. Finish with a short plain-text answer."
)
DELEGATE_PROMPT: Final = (
    "You are a delegate of Chalie with a fixed set of tools. Use them to do the task you are "
    "given and answer with what you found, briefly."
)


@dataclass(frozen=True)
class Channel:
    """One channel's settings; the defaults are those of a channel an operator adds."""

    name: str
    human_present: bool = False
    policy_channel: PolicyChannel = "subconscious"
    pinned: tuple[str, ...] = ()
    find_tools: bool = True
    async_offered: bool = False
    max_steps: int = 12
    max_repeat: int = 3
    wall_clock: float = 300.0
    token_budget: int = 200_000
    system_prompt: str = BACKGROUND_PROMPT
    model: str = "default"

    def tools(self) -> tuple[str, ...]:
        """The tools every turn of this channel may call before find_tools injects any."""
        meta = ("find_tools", "find_skills") if self.find_tools else ()
        return tuple(dict.fromkeys((*meta, *self.pinned)))


SHIPPED: Final[Mapping[str, Channel]] = {
    "chat": Channel(
        "chat",
        human_present=True,
        policy_channel="chat",
        system_prompt=CHAT_PROMPT,
        async_offered=True,
    ),
    "subconscious": Channel("subconscious"),
    "external_agent": Channel("external_agent", policy_channel="external_agent"),
    "web-search": Channel(
        "web-search",
        find_tools=False,
        max_steps=8,
        system_prompt=DELEGATE_PROMPT,
        pinned=("web_search",),
    ),
    "web-browse": Channel(
        "web-browse",
        find_tools=False,
        max_steps=8,
        system_prompt=DELEGATE_PROMPT,
        pinned=("web_fetch",),
    ),
}


def resolve_channels(overrides: Mapping[str, ChannelConfig]) -> dict[str, Channel]:
    """The shipped channels with the operator's overrides applied, plus the ones they add."""
    out = dict(SHIPPED)
    for name, override in overrides.items():
        if not CHANNEL_NAME.match(name):
            raise ValueError(
                f"channels.{name}: a channel name is lowercase letters, digits, - or _"
            )
        base = out.get(name, Channel(name))
        changes = {
            f.name: getattr(override, f.name)
            for f in fields(Channel)
            if f.name != "name" and getattr(override, f.name, None) is not None
        }
        out[name] = replace(base, **changes)
    return out
