"""Chalie runtime: the contracts every other part builds on."""

from chalie.ability import Ability, AbilityDefinitionError
from chalie.result import ToolResult

__all__ = ["Ability", "AbilityDefinitionError", "ToolResult"]
__version__ = "0.1.0"
