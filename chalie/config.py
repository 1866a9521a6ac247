"""Configuration: the data directory and ``config.toml`` inside it.

``CHALIE_HOME`` names the data directory (default: the platform's user data
dir). The directory is created 0700: it holds sockets and the database.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import platformdirs


class ConfigError(ValueError):
    pass


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    raw = explicit or os.environ.get("CHALIE_HOME") or platformdirs.user_data_dir("chalie")
    path = Path(raw).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


class McpServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``[mcp_server]``: the inbound MCP server (talk_to_chalie) and its per-token limits."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8462  # 0 picks a free port (tests)
    # Binding beyond loopback needs this too, and is logged as a warning.
    allow_remote: bool = False
    # Extra Host / Origin values the DNS-rebinding guard accepts (for a remote bind).
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_concurrent_turns: int = 4  # per token
    requests_per_minute: int = 600  # per token, every HTTP request counts
    max_body_bytes: int = 262_144  # per request
    max_sessions: int = 1_000  # stateful (2025-11-25) sessions, all tokens
    session_idle_timeout: float = 600.0
    # A turn that never reports its end is given up after this long.
    turn_wait: float = 900.0
    # loop_in_human: with a human connected, an ask becomes their permission request.
    loop_in_human_asks: bool = False

    def __post_init__(self) -> None:
        checks = (
            (0 <= self.port <= 65535, "port must be 0..65535"),
            (1 <= self.max_concurrent_turns <= 10_000, "max_concurrent_turns must be 1..10000"),
            (1 <= self.requests_per_minute <= 1_000_000, "requests_per_minute must be 1..1000000"),
            (1_024 <= self.max_body_bytes <= 16_777_216, "max_body_bytes must be 1024..16777216"),
            (1 <= self.max_sessions <= 100_000, "max_sessions must be 1..100000"),
            (1.0 <= self.session_idle_timeout <= 86_400.0, "session_idle_timeout must be 1..86400"),
            (1.0 <= self.turn_wait <= 86_400.0, "turn_wait must be 1..86400"),
            (bool(self.host.strip()), "host must not be empty"),
        )
        for ok, why in checks:
            if not ok:
                raise ValueError(f"[mcp_server] {why}")


@dataclass(frozen=True)
class Config:
    home: Path
    abilities_dir: Path | None = None
    workers: int = 2
    approval_expiry: float = 300.0
    inline_threads: int = 16
    embedder: dict[str, Any] = field(default_factory=dict)
    mcp_server: McpServerConfig = field(default_factory=McpServerConfig)
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, home: str | os.PathLike[str] | None = None) -> Config:
        root = data_dir(home)
        path = root / "config.toml"
        raw: dict[str, Any] = {}
        if path.exists():
            try:
                raw = tomllib.loads(path.read_text())
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{path}: {exc}") from None
        drop = raw.get("abilities_dir") or os.environ.get("CHALIE_ABILITIES_DIR")
        try:
            return cls(
                home=root,
                abilities_dir=Path(drop).expanduser() if drop else root / "abilities",
                workers=int(raw.get("workers", 2)),
                approval_expiry=float(raw.get("approval_expiry", 300.0)),
                inline_threads=int(raw.get("inline_threads", 16)),
                embedder=dict(raw.get("embedder", {})),
                mcp_server=msgspec.convert(raw.get("mcp_server", {}), McpServerConfig),
                raw=raw,
            )
        except (TypeError, ValueError, msgspec.ValidationError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
