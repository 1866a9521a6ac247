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

from chalie.messages import Channel


class ConfigError(ValueError):
    pass


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    raw = explicit or os.environ.get("CHALIE_HOME") or platformdirs.user_data_dir("chalie")
    path = Path(raw).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


class DiscoveryConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[discovery]``: learning from use (chalie/discovery/learning.py)."""

    # record the find_tools entries that led to a successful call as examples
    learn: bool = True
    # only where a human is present by default: an external agent must not teach
    # discovery to route other people's requests
    learn_channels: tuple[Channel, ...] = ("chat",)
    examples_per_tool: Annotated[int, msgspec.Meta(ge=1, le=200)] = 20


@dataclass(frozen=True)
class Config:
    home: Path
    abilities_dir: Path | None = None
    workers: int = 2
    approval_expiry: float = 300.0
    inline_threads: int = 16
    embedder: dict[str, Any] = field(default_factory=dict)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
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
                discovery=msgspec.convert(raw.get("discovery", {}), DiscoveryConfig),
                raw=raw,
            )
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{path}: [discovery] {exc}") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
