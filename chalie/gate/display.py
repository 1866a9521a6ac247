"""How text a model or a tool wrote is shown to a human: one line, escaped, capped.

An ``act_summary`` or a parameter value is written by the model, so a newline
in it could forge a line of the approval prompt, an escape sequence could
rewrite the terminal, and a bidirectional override could reorder what the
human reads. :func:`one_line` is the one rule for every such text.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any, Final

# The descriptor tells the model an act_summary is at most this long.
ACT_SUMMARY_CHARS: Final = 200
PARAMS_CHARS: Final = 400
NAME_CHARS: Final = 128
ELLIPSIS: Final = "…"

# Control (Cc), format (Cf: bidi overrides, zero-width), line and paragraph
# separators, surrogates and unassigned code points are escaped, never shown raw.
_UNSAFE: Final = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def one_line(text: object, limit: int = ACT_SUMMARY_CHARS) -> str:
    """``text`` as one printable line of at most ``limit`` characters (an ellipsis when cut)."""
    raw = text if isinstance(text, str) else str(text)
    # Escaping only lengthens: the first limit + 1 characters decide the line.
    shown = "".join(
        _escape(ch) if unicodedata.category(ch) in _UNSAFE else ch for ch in raw[: limit + 1]
    )
    if len(shown) <= limit:
        return shown
    return shown[: max(0, limit - 1)] + ELLIPSIS


def params_line(params: Any, limit: int = PARAMS_CHARS) -> str:
    """Parameters as compact JSON on one capped line."""
    try:
        text = json.dumps(params, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):
        text = f"<{type(params).__name__} that cannot be shown>"
    return one_line(text, limit)


PARAM_LINES: Final = 12
REACH_CHARS: Final = 500


def reach_line(reach: str) -> str:
    """How every approval prompt (the gate's text, the terminal's, chat's, the Brain's card)
    shows a call's reach beyond Chalie (:meth:`chalie.ability.Ability.reach`): first."""
    return f"This reaches beyond Chalie: {one_line(reach, REACH_CHARS)}"


def param_lines(params: Any, limit: int = PARAM_LINES, width: int = 200) -> list[str]:
    """Each top-level parameter as one escaped ``name = value`` line; at most ``limit`` lines."""
    if not isinstance(params, dict):
        return [one_line(params_line(params), width)]
    names = sorted(params, key=str)
    lines = [
        one_line(f"{one_line(name, NAME_CHARS)} = {params_line(params[name], width)}", width)
        for name in names[:limit]
    ]
    if len(names) > limit:
        lines.append(f"(and {len(names) - limit} more)")
    return lines
