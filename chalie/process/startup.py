"""What ``chalie run`` tells the person at its terminal once the daemon is up.

The JSON log is for machines; a person who just typed ``chalie run`` needs to
know, in a few plain lines on standard output, where things are and whether
the model answers:

1. the daemon, its data directory and its ``config.toml``;
2. where the Brain dashboard is, and how to sign in (``chalie brain open``);
3. where the inbound MCP server listens;
4. each configured model and the verdict of a quick probe
   (:mod:`chalie.providers.probe`), with the next step when it does not answer;
   no ``[models]`` section at all is said as such, with the built-in default
   it falls back to;
5. how to stop it.

:func:`startup_lines` is pure: the composition root gathers the addresses and
probes and prints what it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from chalie.providers.probe import Probe


@dataclass(frozen=True)
class Where:
    """The addresses the daemon's children answered with (None: not running)."""

    pid: int
    home: Path
    config_file: Path
    brain: str | None  # the dashboard's URL
    brain_off: str  # why there is none (when brain is None)
    mcp: str | None  # the inbound MCP server's URL
    models_configured: bool  # any [models.NAME] section in config.toml


def brain_url(websocket: str | None) -> str | None:
    """The dashboard's URL on the chat web server (``ws://host:port/chat``)."""
    if not websocket:
        return None
    hostport = websocket.split("://", 1)[-1].split("/", 1)[0]
    return f"http://{hostport}/brain"


def startup_lines(where: Where, probes: Sequence[Probe]) -> list[str]:
    lines = [f"chalie: daemon {where.pid} on {where.home} (config: {where.config_file})"]
    if where.brain:
        lines.append(f"  brain: {where.brain}  (sign in: chalie brain open)")
    else:
        lines.append(f"  brain: off ({where.brain_off})")
    lines.append(f"  mcp server: {where.mcp or 'off'}")
    if not where.models_configured:
        lines.append(
            "  no model is configured (no [models.default] in config.toml): turns use the "
            "built-in default below"
        )
    for probe in probes:
        lines.append(f"  {probe.line}")
    if any(p.verdict != "ok" and p.verdict != "answers" for p in probes):
        lines.append(
            f"  until a model answers, turns fail; configuration: docs/configuration.rst, "
            f"edit {where.config_file} then restart chalie"
        )
    lines.append("  stop: Ctrl-C here, or chalie stop")
    return lines
