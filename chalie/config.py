"""Configuration: the data directory and ``config.toml`` inside it.

``CHALIE_HOME`` names the data directory (default: the platform's user data
dir). The directory is created 0700: it holds sockets and the database.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

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


class McpConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[mcp]``: outbound MCP connections (per-server values in a connection override these)."""

    heartbeat_interval: Annotated[float, msgspec.Meta(ge=1, le=86400)] = 30.0
    probe_timeout: Annotated[float, msgspec.Meta(gt=0, le=600)] = 10.0
    connect_timeout: Annotated[float, msgspec.Meta(gt=0, le=600)] = 30.0
    list_timeout: Annotated[float, msgspec.Meta(gt=0, le=600)] = 30.0
    call_timeout: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 60.0
    backoff_base: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 1.0
    backoff_cap: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 300.0
    # At daemon start, servers connect after start_delay..2*start_delay seconds (each its own),
    # so spawning stdio servers never competes with the daemon's own start.
    start_delay: Annotated[float, msgspec.Meta(ge=0, le=600)] = 1.0


@dataclass(frozen=True)
class Config:
    home: Path
    abilities_dir: Path | None = None
    workers: int = 2
    approval_expiry: float = 300.0
    inline_threads: int = 16
    embedder: dict[str, Any] = field(default_factory=dict)
    mcp: McpConfig = field(default_factory=McpConfig)
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
                mcp=msgspec.convert(raw.get("mcp", {}), McpConfig),
                raw=raw,
            )
        except (TypeError, ValueError, msgspec.ValidationError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
