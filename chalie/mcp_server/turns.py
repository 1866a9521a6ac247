"""The channel an inbound agent's turns run on, and how a turn's origin names its token."""

from __future__ import annotations

from typing import Final

CHANNEL: Final = "external_agent"
ORIGIN_PREFIX: Final = "mcp:"


def origin(token_name: str) -> str:
    """How a turn's origin names the token that asked for it."""
    return f"{ORIGIN_PREFIX}{token_name}"
