"""The web abilities' kit over the test site, and one call of a web ability."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chalie.process.config import Config
from chalie.result import ToolResult
from chalie.services import Services
from chalie.web.kit import WebKit
from chalie.wire.messages import TurnContext
from tests.core.web.site import Site


def make_kit(site: Site, tmp: Path, resolver: Any = None, **web: Any) -> WebKit:
    raw = {"allow": [f"127.0.0.1:{site.port}"], **web}
    config = Config.from_mapping({"web": raw}, home=tmp)
    return WebKit(config.web, home=tmp, resolver=resolver)


def call(ability: type, kit: WebKit, turn: str = "t_test", **params: Any) -> ToolResult:
    """Run an ability as the dispatcher does (fresh instance, params validated as its Struct)."""
    import msgspec

    context = TurnContext(conversation_id="c_test", turn_id=turn, channel="subconscious")
    instance = ability(context, Services(web=kit))
    struct = msgspec.convert(params, ability.Params)
    result: ToolResult = instance.run(struct)
    return result
