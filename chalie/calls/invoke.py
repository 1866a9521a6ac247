"""Running one ability instance and turning every outcome into a ToolResult.

A return value that is not a ToolResult becomes ``non-canonical-result``; a
raised exception becomes ``unhandled-exception`` with the traceback in the log
only. Nothing propagates. Used inline by the dispatcher and inside workers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import msgspec

from chalie.ability import Ability
from chalie.result import ToolResult

log = logging.getLogger("chalie.calls.invoke")


def coerce_params(ability: type[Ability], params: Mapping[str, Any]) -> Any:
    """The value handed to ``run``: the Params Struct when declared, else a dict.

    Raises msgspec.ValidationError when the Struct rejects the input.
    """
    if ability.Params is not None:
        return msgspec.convert(dict(params), ability.Params, strict=True)
    return dict(params)


def invoke(instance: Ability, params: Any) -> ToolResult:
    """Call ``run`` and convert anything but a ToolResult into an error result."""
    name = type(instance).name
    try:
        result = instance.run(params)
    except Exception as exc:
        log.exception("ability %s raised", name)
        return ToolResult.error(
            "unhandled-exception",
            f"{name} failed with {type(exc).__name__}.",
            hint="This is a fault in the tool, not in your call; try another way or report it.",
        )
    if not isinstance(result, ToolResult):
        log.error("ability %s returned %s, not a ToolResult", name, type(result).__name__)
        return ToolResult.error(
            "non-canonical-result",
            f"{name} returned {type(result).__name__} instead of a tool result.",
            hint="This is a fault in the tool; do not retry the same call.",
        )
    return result
