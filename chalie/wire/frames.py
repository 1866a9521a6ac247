"""Safe decoding of frames that arrive on a socket, and rate-limited logging of dropped ones.

Every socket's frames are decoded through :class:`SafeDecoder`: the nesting
depth of the raw msgpack is checked (without building any object) before
msgspec decodes it, so a frame nested 200,000 levels deep is a DecodeError
like any other malformed frame, never a RecursionError in the thread that
reads the socket. :class:`DropLog` keeps a flood of bad frames from turning
into a flood of log lines.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar

import msgspec

from chalie.wire.messages import AnyMessage

# Deepest nesting of arrays and maps accepted in one frame. The envelopes add
# four or five levels around a tool's arguments; JSON-like tool data rarely
# needs more than a dozen. Deep enough for any honest caller, and shallow
# enough that every recursive walk over a decoded value (validation, encoding,
# rendering) stays far below Python's recursion limit.
MAX_DEPTH: Final = 64

T = TypeVar("T")

# Bytes that can open an array or a map: fixmap, fixarray, array16/32, map16/32.
# A frame holding no more of these than the limit cannot nest deeper than it;
# counting them is one pass in C, so most frames skip the exact walk.
_CONTAINER_BYTES: Final = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_OTHER_BYTES: Final = bytes(b for b in range(256) if b not in _CONTAINER_BYTES)

# For each first byte: how many bytes the whole item takes when that is fixed
# (> 0), or 0 when the item's size is read from the bytes after it.
_FIXED_SIZE: Final[tuple[int, ...]] = tuple(
    1
    if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3)
    else 1 + (b - 0xA0)
    if 0xA0 <= b <= 0xBF
    else {
        0xCA: 5,
        0xCB: 9,
        0xCC: 2,
        0xCD: 3,
        0xCE: 5,
        0xCF: 9,
        0xD0: 2,
        0xD1: 3,
        0xD2: 5,
        0xD3: 9,
        0xD4: 3,
        0xD5: 4,
        0xD6: 6,
        0xD7: 10,
        0xD8: 18,
    }.get(b, 0)
    for b in range(256)
)
# Length-prefixed items (bin, str, ext): first byte -> (length bytes, extra bytes).
_PREFIXED: Final[dict[int, tuple[int, int]]] = {
    0xC4: (1, 0),
    0xC5: (2, 0),
    0xC6: (4, 0),
    0xD9: (1, 0),
    0xDA: (2, 0),
    0xDB: (4, 0),
    0xC7: (1, 1),  # ext: a type byte follows the length
    0xC8: (2, 1),
    0xC9: (4, 1),
}


class TooDeep(msgspec.DecodeError):
    """A frame nests arrays or maps deeper than the limit."""


def check_depth(data: bytes, limit: int = MAX_DEPTH) -> None:
    """Raise TooDeep when msgpack ``data`` nests arrays or maps deeper than ``limit``.

    Reads only headers and skips every string and binary payload, so its cost
    is one step per item, bounded by the frame's length. A truncated or
    malformed frame stops the walk; msgspec then reports it precisely.
    """
    if len(data) <= limit or len(data.translate(None, _OTHER_BYTES)) <= limit:
        return
    fixed = _FIXED_SIZE
    end = len(data)
    pos = 0
    remaining = 1  # items still to read at the current level
    stack: list[int] = []
    while True:
        if remaining == 0:
            if not stack:
                return
            remaining = stack.pop()
            continue
        if pos >= end:
            return
        b = data[pos]
        remaining -= 1
        size = fixed[b]
        if size:
            pos += size
            continue
        if 0x80 <= b <= 0x9F:
            count = (b & 0x0F) * 2 if b < 0x90 else b & 0x0F
            pos += 1
        elif 0xDC <= b <= 0xDF:
            width = 2 if b in (0xDC, 0xDE) else 4
            count = int.from_bytes(data[pos + 1 : pos + 1 + width], "big")
            if b >= 0xDE:
                count *= 2
            pos += 1 + width
        else:
            prefix = _PREFIXED.get(b)
            if prefix is None:  # 0xC1, never used in msgpack
                return
            width, extra = prefix
            length = int.from_bytes(data[pos + 1 : pos + 1 + width], "big")
            pos += 1 + width + extra + length
            continue
        if count:
            stack.append(remaining)
            remaining = count
            if len(stack) > limit:
                raise TooDeep(f"frame nests deeper than {limit} levels")


# A JSON string (escapes included); what is left once they are cut out is structure.
_JSON_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKETS: Final = re.compile(rb"[\[\]{}]")


def check_json_depth(data: bytes | str, limit: int = MAX_DEPTH) -> None:
    """Raise TooDeep when JSON ``data`` nests arrays or objects deeper than ``limit``.

    The same rule as :func:`check_depth` for the JSON entry points (the inbound
    MCP body, chat frames on the WebSocket): brackets inside strings do not
    count; a malformed text stops nothing here, the parser reports it.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return
    depth = 0
    for bracket in _JSON_BRACKETS.findall(_JSON_STRING.sub(b"", raw)):
        if bracket in (b"[", b"{"):
            depth += 1
            if depth > limit:
                raise TooDeep(f"the JSON nests deeper than {limit} levels")
        else:
            depth -= 1


class SafeDecoder(Generic[T]):
    """A msgspec msgpack decoder for ``type`` that refuses frames nested past ``max_depth``.

    ``decode`` raises only msgspec.DecodeError (TooDeep and ValidationError
    are subclasses of it), whatever the bytes.
    """

    def __init__(self, type: Any, *, max_depth: int = MAX_DEPTH) -> None:
        self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(type)
        self.max_depth = max_depth

    def decode(self, data: bytes) -> T:
        check_depth(data, self.max_depth)
        try:
            return self._decoder.decode(data)
        except RecursionError as exc:  # the depth check makes this unreachable; a last line
            raise TooDeep(f"frame nests too deep ({exc})") from None


_message_decoder: Final[SafeDecoder[AnyMessage]] = SafeDecoder(AnyMessage)


def decode_message(data: bytes) -> AnyMessage:
    """Decode one runtime message from a socket; raises msgspec.DecodeError for any bad frame."""
    return _message_decoder.decode(data)


def check_sendable(data: bytes, max_depth: int = MAX_DEPTH) -> str | None:
    """Why a frame we are about to send would be refused by its receiver, or None."""
    try:
        check_depth(data, max_depth)
    except TooDeep as exc:
        return str(exc)
    return None


class DropLog:
    """Logs dropped frames without letting a flood of them flood the log.

    The first ``burst`` drops are logged one by one; after that, at most one
    summary line per ``interval`` seconds says how many were dropped since.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        burst: int = 20,
        interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.what = what
        self.burst = burst
        self.interval = interval
        self.clock = clock
        self.total = 0
        self._unlogged = 0
        self._next_summary = 0.0

    def drop(self, peer: bytes | str, why: str) -> None:
        self.total += 1
        if self.total <= self.burst:
            self.logger.warning(
                "%s dropped a frame from %r: %s (%d dropped so far)",
                self.what,
                peer[:40],
                why,
                self.total,
            )
            self._next_summary = self.clock() + self.interval
            return
        self._unlogged += 1
        now = self.clock()
        if now >= self._next_summary:
            self.logger.warning(
                "%s dropped %d more frames (last from %r: %s; %d dropped so far)",
                self.what,
                self._unlogged,
                peer[:40],
                why,
                self.total,
            )
            self._unlogged = 0
            self._next_summary = now + self.interval
