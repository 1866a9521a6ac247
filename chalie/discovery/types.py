"""Values shared by the discovery parts: what is indexed, and the loud index error."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolDoc:
    """One searchable tool (or skill): its name and the prose the vector rung embeds."""

    name: str
    summary: str
    examples: tuple[str, ...] = ()
    tooltip: str = ""
    source: str = ""  # who owns it: "builtin", "mcp:<server>", "skill", a drop-in path ...


class IndexCorruptError(RuntimeError):
    """A persisted index is missing, corrupt or unreadable: surfaced as discovery-index-error."""
