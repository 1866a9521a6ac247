"""Configuration: the data directory and ``config.toml`` inside it.

``CHALIE_HOME`` names the data directory (default: the platform's user data
dir). The directory is created 0700: it holds sockets and the database.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

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


# -- [models.NAME], [channels.NAME], [conversations] (the conversation runtime) -----------

EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
HttpUrl = Annotated[str, msgspec.Meta(pattern=r"^https?://\S+$", max_length=2048)]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
Seconds = Annotated[float, msgspec.Meta(gt=0.0, le=86400.0)]


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class ModelConfig(_Section):
    """One language model: ``[models.NAME]``; ``[models.default]`` serves unnamed channels."""

    provider: Literal["openai", "ollama", "anthropic"] = "openai"
    base_url: HttpUrl = "http://127.0.0.1:11434/v1"
    model: ModelName = "llama3.1"
    # The NAME of the environment variable holding the key; the key itself is never stored.
    api_key_env: EnvName | None = None
    context_window: Annotated[int, msgspec.Meta(ge=256, le=100_000_000)] = 32768
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 4096
    stream: bool = True
    connect_timeout: Seconds = 10.0
    # Seconds without a byte from the model before the request counts as hung.
    read_timeout: Seconds = 120.0
    # Retries of a 429, 5xx, refused or dropped request, with exponential backoff.
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3
    backoff: Annotated[float, msgspec.Meta(ge=0.0, le=60.0)] = 0.5


class ChannelConfig(_Section):
    """Overrides of one channel: ``[channels.NAME]``; an unset key keeps the shipped value."""

    human_present: bool | None = None
    policy_channel: Literal["chat", "subconscious", "external_agent"] | None = None
    pinned: tuple[Annotated[str, msgspec.Meta(min_length=1, max_length=128)], ...] | None = None
    find_tools: bool | None = None
    async_offered: bool | None = None
    max_steps: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    max_repeat: Annotated[int, msgspec.Meta(ge=2, le=100)] | None = None
    wall_clock: Seconds | None = None
    token_budget: Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)] | None = None
    system_prompt: Annotated[str, msgspec.Meta(max_length=100_000)] | None = None
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] | None = None


class ConversationsConfig(_Section):
    # Seconds a conversation's actor stays after its last activity.
    idle_stop: Seconds = 600.0
    max_message_chars: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 100_000
    # User messages waiting behind a running turn, per conversation.
    max_queued: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 16


@dataclass(frozen=True)
class Config:
    home: Path
    abilities_dir: Path | None = None
    workers: int = 2
    approval_expiry: float = 300.0
    inline_threads: int = 16
    embedder: dict[str, Any] = field(default_factory=dict)
    models: dict[str, ModelConfig] = field(default_factory=dict)
    channels: dict[str, ChannelConfig] = field(default_factory=dict)
    conversations: ConversationsConfig = ConversationsConfig()
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
                models=msgspec.convert(raw.get("models", {}), dict[str, ModelConfig]),
                channels=msgspec.convert(raw.get("channels", {}), dict[str, ChannelConfig]),
                conversations=msgspec.convert(
                    raw.get("conversations", {}), ConversationsConfig
                ),
                raw=raw,
            )
        except (TypeError, ValueError, msgspec.ValidationError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
