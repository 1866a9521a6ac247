"""Fixtures of the web tests: the local site, and a WebKit allowed to reach it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chalie.config import Config
from chalie.messages import TurnContext
from chalie.result import ToolResult
from chalie.services import Services
from chalie.web.kit import WebKit
from tests.core.web.site import Site


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    served = Site()
    yield served
    served.stop()


def make_kit(site: Site, tmp: Path, resolver: Any = None, **web: Any) -> WebKit:
    raw = {"allow": [f"127.0.0.1:{site.port}"], **web}
    config = Config.from_mapping({"web": raw}, home=tmp)
    return WebKit(config.web, home=tmp, resolver=resolver)


@pytest.fixture
def kit(site: Site, tmp_path: Path) -> Iterator[WebKit]:
    made = make_kit(site, tmp_path, fetch_timeout=2.0, max_bytes=5 * 1024 * 1024)
    yield made
    made.close()


def call(ability: type, kit: WebKit, turn: str = "t_test", **params: Any) -> ToolResult:
    """Run an ability as the dispatcher does (fresh instance, params validated as its Struct)."""
    import msgspec

    context = TurnContext(conversation_id="c_test", turn_id=turn, channel="subconscious")
    instance = ability(context, Services(web=kit))
    struct = msgspec.convert(params, ability.Params)
    result: ToolResult = instance.run(struct)
    return result
