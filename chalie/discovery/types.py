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


class IndexBuilding(RuntimeError):
    """The index is being built or loaded: a find is answered at once with when to retry
    (discovery-index-building), instead of waiting behind the build."""

    def __init__(self, done: int, total: int, retry_after: float) -> None:
        super().__init__(f"the tool index is being built ({done} of {total})")
        self.done, self.total, self.retry_after = done, total, retry_after


class IndexCorruptError(RuntimeError):
    """A persisted index is missing, corrupt or unreadable: surfaced as discovery-index-error."""
