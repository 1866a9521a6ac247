"""Chalie runtime: the contracts every other part builds on.

``from chalie import Ability, ToolResult`` works as always; the two are imported on
first use, so a module that needs neither (every ``chalie`` CLI command starts by
importing ``chalie.process.config``) does not pay for the ability contract's JSON Schema
validator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chalie.ability import Ability, AbilityDefinitionError
    from chalie.result import ToolResult

__all__ = ["Ability", "AbilityDefinitionError", "ToolResult"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in ("Ability", "AbilityDefinitionError"):
        from chalie import ability

        return getattr(ability, name)
    if name == "ToolResult":
        from chalie.result import ToolResult

        return ToolResult
    raise AttributeError(f"module 'chalie' has no attribute {name!r}")
