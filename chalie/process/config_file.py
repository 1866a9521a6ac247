"""Changing keys of one ``[section]`` of ``config.toml`` in place, keeping everything else.

``config.toml`` stays the one place settings live: a change made from the dashboard is a
change of this file (other lines, comments and sections untouched), checked by parsing the
whole result into a :class:`~chalie.process.config.Config` before it is written, and written
atomically (a temporary file renamed over the old one, mode 0600).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from chalie.process.config import Config, ConfigError

_HEADER: Final = re.compile(r"^\s*\[\s*([A-Za-z0-9_.-]+)\s*\]\s*(?:#.*)?$")
_KEY: Final = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")


def toml_value(value: Any) -> str:
    """A scalar as TOML: true/false, an integer, a float, or a basic string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    raise TypeError(f"only scalars are written, not {type(value).__name__}")


def with_keys(text: str, section: str, values: Mapping[str, Any]) -> str:
    """``text`` with ``values`` set in ``[section]`` (the section is added when missing)."""
    lines = text.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if (m := _HEADER.match(line)) and m.group(1) == section),
        None,
    )
    if start is None:
        if lines and lines[-1].strip():
            lines.append("")
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
        return "\n".join(lines) + "\n"
    end = next((i for i in range(start + 1, len(lines)) if _HEADER.match(lines[i])), len(lines))
    left = dict(values)
    for i in range(start + 1, end):
        m = _KEY.match(lines[i])
        if m and m.group(1) in left:
            lines[i] = f"{m.group(1)} = {toml_value(left.pop(m.group(1)))}"
    insert = end
    while insert > start + 1 and not lines[insert - 1].strip():
        insert -= 1
    lines[insert:insert] = [f"{k} = {toml_value(v)}" for k, v in left.items()]
    return "\n".join(lines) + "\n"


def change(
    home: Path,
    section: str,
    values: Mapping[str, Any],
    check: Callable[[Config], None] = lambda _config: None,
) -> Config:
    """Set keys in ``<home>/config.toml`` and return the configuration it now describes.

    ConfigError (and nothing written) when the result is not a valid configuration or
    ``check`` (the caller's own rules for it) raises ConfigError.
    """
    path = home / "config.toml"
    try:
        old = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        old = ""
    new = with_keys(old, section, values)
    try:
        raw = tomllib.loads(new)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the change would not be valid TOML: {exc}") from None
    config = Config.from_mapping(raw, home=home, source=str(path))
    check(config)
    fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".toml", dir=home)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return config
