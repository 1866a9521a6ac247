"""A sloppy small model: each of its habits followed through the real daemon to the outcome."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from actors.policy import PolicyActor
from tests.conversation.harness import Harness
from tools.fake_llm.sloppy import Sloppy, library

pytestmark = pytest.mark.slow

LIBRARY = library()


def channels_toml() -> str:
    lines = []
    for wire in ("openai", "ollama"):
        lines += [f"[channels.sloppy-finding-{wire}]", f'model = "{wire}"']
        lines += [
            f"[channels.sloppy-direct-{wire}]",
            f'model = "{wire}"',
            'pinned = ["clock", "calculator"]',
            "find_tools = false",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def h() -> Iterator[Harness]:
    harness = Harness(channels_toml())
    policy = harness.rt.child("policy", PolicyActor)
    for tool in ("clock", "calculator"):
        policy.call(PolicyActor.set, "subconscious", tool, "allow")
    try:
        yield harness
    finally:
        harness.close()


def run(h: Harness, case: Sloppy) -> Any:
    h.script(case.script)
    accepted = h.send(case.prompt, f"sloppy-{case.kind}-{case.wire}")
    return accepted, h.finished(accepted)


@pytest.mark.parametrize("case", LIBRARY, ids=[c.name for c in LIBRARY])
def test_each_sloppy_habit_ends_with_the_right_answer(h: Harness, case: Sloppy) -> None:
    _, end = run(h, case)
    assert end.reason == "final", (end.reason, end.text)
    assert case.expect in end.text, end.text
