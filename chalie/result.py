"""ToolResult: the frozen value every ability returns, with exactly two constructors.

``ToolResult.success(...)`` and ``ToolResult.error(...)`` are the only ways to
make one; calling the class directly raises TypeError.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, NoReturn, final

import msgspec

from chalie.errors import is_valid_code
from chalie.wire.messages import Status

Scalar = str | int | float | bool | None
META_KEY: Final = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
# Keys the envelope itself writes into the opening tag.
RESERVED_META: Final = frozenset({"status", "code"})
# A result's rich payload (an image, a file) reaches a client up to this size, packed
# (chalie.calls.dispatch.carried_rich); a larger one makes the call non-canonical-result.
MAX_RICH_BYTES: Final = 4 << 20

_json = msgspec.json.Encoder()
_SEAL = object()


_set = object.__setattr__


def _check_meta(meta: Mapping[str, Any] | None) -> dict[str, Scalar]:
    out: dict[str, Scalar] = {}
    if not meta:
        return out
    for key, value in meta.items():
        if not isinstance(key, str) or not META_KEY.match(key):
            raise ValueError(f"meta key {key!r} must match {META_KEY.pattern}")
        if key in RESERVED_META:
            raise ValueError(f"meta key {key!r} is reserved for the envelope")
        if value is not None and not isinstance(value, str | int | float | bool):
            raise TypeError(f"meta {key!r} must be a flat scalar, got {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"meta {key!r} must be a finite number")
        out[key] = value
    return out


@final
class ToolResult:
    """A frozen outcome of one ability call."""

    __slots__ = ("body", "code", "hint", "meta", "rich", "status", "valid_values")

    status: Status
    body: str
    rich: Any
    meta: Mapping[str, Scalar]
    code: str | None
    hint: str | None
    valid_values: tuple[Scalar, ...] | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not args or args[0] is not _SEAL:
            raise TypeError("use ToolResult.success(...) or ToolResult.error(...)")
        (_, status, body, rich, meta, code, hint, valid_values) = args
        # Unrolled: a result is made on every call's hot path.
        _set(self, "status", status)
        _set(self, "body", body)
        _set(self, "rich", rich)
        _set(self, "meta", meta)
        _set(self, "code", code)
        _set(self, "hint", hint)
        _set(self, "valid_values", valid_values)

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError("ToolResult is frozen")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("ToolResult is frozen")

    @classmethod
    def success(
        cls,
        body: str | Mapping[str, Any] | Sequence[Any] = "",
        *,
        rich: Mapping[str, Any] | None = None,
        meta: Mapping[str, Scalar] | None = None,
    ) -> ToolResult:
        """A success: a string body shown verbatim, or a dict/list rendered as compact JSON."""
        if isinstance(body, str):
            text = body
        elif isinstance(body, Mapping | list | tuple):
            try:
                text = _json.encode(body).decode()
            except (TypeError, msgspec.EncodeError) as exc:
                raise TypeError(f"success body is not JSON-serialisable: {exc}") from None
        else:
            raise TypeError(f"success body must be str, dict or list, got {type(body).__name__}")
        if rich is not None and not isinstance(rich, Mapping):
            raise TypeError("rich payload must be a mapping")
        return cls(_SEAL, "success", text, rich, _check_meta(meta), None, None, None)

    @classmethod
    def error(
        cls,
        code: str,
        message: str,
        *,
        hint: str = "",
        valid_values: Sequence[Scalar] | None = None,
        meta: Mapping[str, Scalar] | None = None,
    ) -> ToolResult:
        """An error: a stable kebab-case code, a message, a one-line recovery hint."""
        if not isinstance(code, str) or not is_valid_code(code):
            raise ValueError(f"error code {code!r} is not kebab-case")
        if not isinstance(message, str) or not message.strip():
            raise ValueError("an error needs a message")
        hint = " ".join(str(hint).split())  # one line, always
        values = None if valid_values is None else tuple(valid_values)
        for v in values or ():
            if v is not None and not isinstance(v, str | int | float | bool):
                raise TypeError("valid values must be scalars")
        return cls(_SEAL, "error", message, None, _check_meta(meta), code, hint or None, values)

    @property
    def ok(self) -> bool:
        return self.status == "success"

    def with_meta(self, **extra: Scalar) -> ToolResult:
        """A copy with more meta (the dispatcher adds ``action``, say)."""
        merged = {**extra, **self.meta}
        return ToolResult(
            _SEAL,
            self.status,
            self.body,
            self.rich,
            _check_meta(merged),
            self.code,
            self.hint,
            self.valid_values,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolResult):
            return NotImplemented
        return all(getattr(self, s) == getattr(other, s) for s in self.__slots__)

    def __hash__(self) -> int:
        return hash((self.status, self.body, self.code))

    def __repr__(self) -> str:
        if self.status == "success":
            return f"ToolResult.success({self.body[:60]!r}, meta={dict(self.meta)!r})"
        return f"ToolResult.error({self.code!r}, {self.body[:60]!r}, hint={self.hint!r})"
