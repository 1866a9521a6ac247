"""How tools and remote servers are used, read from the trail: calls, errors, latency.

One figure a tool (and a remote MCP server: its ``_mcp_<server>_*`` tools together) over
a window (the last hour, the last day): how many calls ended, the share that ended in an
error (denied and cancelled calls count as errors only when the tool failed them, so
``error`` alone), and the median and 95th percentile of their durations, nearest rank.
Calls still running, or interrupted without an end, have no duration and are counted but
not timed. :func:`summarize` is pure; :meth:`chalie.calls.trail.Trail.ended_since` feeds it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from chalie.wire.mcp_names import server_of

# The windows a dashboard offers, in seconds.
WINDOWS: Final = {"hour": 3600.0, "day": 86400.0}


@dataclass(frozen=True)
class Usage:
    name: str  # the tool, or the remote server
    calls: int
    errors: int
    p50_ms: float | None  # None: no call ended in the window
    p95_ms: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.calls if self.calls else 0.0


def percentile(sorted_values: Sequence[float], share: float) -> float | None:
    """The nearest-rank percentile (``share`` from 0 to 1) of sorted values; None if empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(share * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize(
    rows: Iterable[tuple[str, str, float | None]], key: Callable[[str], str | None]
) -> list[Usage]:
    """``(tool, status, seconds or None)`` rows grouped by ``key(tool)`` (None: left out),
    busiest first."""
    groups: dict[str, tuple[list[int], list[float]]] = {}
    for tool, status, seconds in rows:
        name = key(tool)
        if name is None:
            continue
        counts, durations = groups.setdefault(name, ([0, 0], []))
        counts[0] += 1
        counts[1] += status == "error"
        if seconds is not None and seconds >= 0:
            durations.append(seconds * 1000.0)
    out = []
    for name, (counts, durations) in groups.items():
        durations.sort()
        p50, p95 = percentile(durations, 0.5), percentile(durations, 0.95)
        out.append(Usage(name, counts[0], counts[1], p50, p95))
    return sorted(out, key=lambda u: (-u.calls, u.name))


def by_tool(tool: str) -> str:
    return tool


def by_server(tool: str) -> str | None:
    return server_of(tool)
