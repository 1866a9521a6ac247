"""What a small model reads before the user's first word: the system prompt and the pinned schemas.

Counted with the runtime's own estimate (chalie.conversation.act) over whatever each
shipped channel pins, so a tool pinned later counts without this test changing.
"""

from __future__ import annotations

import pytest

from chalie.calls.registry import Registry
from chalie.conversation import act
from chalie.conversation.channels import SHIPPED

# tokens: small models have small windows and read ~70 tokens/s on a CPU. The seed pins
# memory beside the two meta-tools on chat, subconscious and external_agent; its schema,
# kept to the fields a turn needs (abilities/memory.py), is ~180 of these (was 400).
BUDGET = 500


def first_request_tokens(channel_name: str) -> int:
    channel = SHIPPED[channel_name]
    registry = Registry.collect(entry_points=False)
    names = [n for n in channel.tools() if n in registry]
    tools = registry.descriptors(allow_async=channel.async_offered, names=names)
    return act.estimate_tokens(channel.system_prompt) + act.tools_tokens(tools)


@pytest.mark.parametrize("name", [n for n, c in SHIPPED.items() if c.find_tools])
def test_the_prompt_and_pinned_schemas_fit_a_small_model(name: str) -> None:
    assert first_request_tokens(name) <= BUDGET


def test_no_prompt_names_a_real_tool_as_an_example() -> None:
    registry = Registry.collect(entry_points=False)
    for channel in SHIPPED.values():
        for name in registry.names():
            if name not in ("find_tools", "find_skills"):
                assert name not in channel.system_prompt, (channel.name, name)


def test_the_prompts_say_to_answer_directly_when_no_tool_is_needed() -> None:
    for name in ("chat", "subconscious"):
        assert "Answer directly when no tool is needed" in SHIPPED[name].system_prompt
