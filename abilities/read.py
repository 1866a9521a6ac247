"""read: a document the person gives, as text with its structure (HTML, PDF, text, Markdown, JSON).

The document is a file in a folder the operator allowed (``[web] read_folders``,
and ``<home>/attachments``, where attachments are kept) or a URL (a fetched
file, under the SSRF guard). A path is resolved (symbolic links followed) and
must then lie inside an allowed folder; ``..`` tricks and links pointing out
are refused with ``path-not-allowed``. The file is then opened once, without
following a link at its last step, and the opened descriptor is checked (what it
is, where it really is, its size) before at most the size limit is read from it:
a link swapped in between the check and the read cannot take the read outside
(:func:`open_checked`). Reading is internal to the gate, as the seed says; what
is read is untrusted content all the same.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated, Final

import msgspec

from chalie.ability import Ability
from chalie.result import ToolResult
from chalie.web import results

ATTACHMENTS: Final = "attachments"


class ReadParams(msgspec.Struct, forbid_unknown_fields=True):
    """Read a document: a path in an allowed folder, or a URL."""

    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)] | None = None
    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)] | None = None
    max_chars: Annotated[int, msgspec.Meta(ge=200, le=2_000_000)] | None = None


class Read(Ability):
    name = "read"
    summary = (
        "Read a document the person gave: a file (path in an allowed folder or an attachment) "
        "or a file at a URL. Returns its text with headings kept: HTML, PDF, plain text, "
        "Markdown, JSON."
    )
    examples = (
        "read the attached PDF",
        "what does this document say",
        "open the file I gave you",
        "summarise the report in my documents folder",
        "read the markdown notes",
        "extract the text of this PDF link",
    )
    tooltip = "Read a document"
    Params = ReadParams
    discoverable = False
    internal = True
    timeout = 90.0

    def run(self, params: ReadParams) -> ToolResult:
        from chalie.web.extract import ExtractError, extract
        from chalie.web.http import FetchError

        kit = results.kit_of(self.services)
        if isinstance(kit, ToolResult):
            return kit
        if (params.path is None) == (params.url is None):
            return ToolResult.error(
                "missing-params", "read needs exactly one of path or url", hint="pass path= or url="
            )
        limit = min(params.max_chars or kit.config.max_text_chars, kit.config.max_text_chars)
        if params.url is not None:
            try:
                fetched = kit.fetcher.fetch(params.url, cancelled=self.cancelled)
                doc = extract(
                    fetched.body,
                    fetched.content_type,
                    fetched.charset,
                    url=fetched.url,
                    structured=True,
                )
            except FetchError as exc:
                return results.error(exc.code, exc.message, exc.hint)
            except ExtractError as exc:
                return results.error(exc.code, exc.message)
            return results.document_result(doc, fetched.url, limit, extra_meta={"source": "url"})
        folders = [Path(f) for f in kit.config.read_folders]
        if kit.home is not None:
            folders.append(Path(kit.home) / ATTACHMENTS)
        found = allowed_file(params.path or "", folders)
        if isinstance(found, ToolResult):
            return found
        try:
            body = open_checked(found, folders, kit.config.max_bytes)
            if isinstance(body, ToolResult):
                return body
            doc = extract(body, "", None, name=found.name, structured=True)
        except OSError as exc:
            return ToolResult.error("path-not-allowed", f"cannot read the file: {exc.strerror}")
        except ExtractError as exc:
            return results.error(exc.code, exc.message)
        return results.document_result(doc, found.as_uri(), limit, extra_meta={"source": "file"})


def allowed_file(raw: str, folders: list[Path]) -> Path | ToolResult:
    """The real path of ``raw`` if it is a file inside one of ``folders``."""
    if "\x00" in raw:
        return ToolResult.error("invalid-param", "the path holds a NUL character")
    if not folders:
        return ToolResult.error(
            "path-not-allowed",
            "no folder may be read",
            hint="The operator can list folders in [web] read_folders.",
        )
    try:
        candidate = Path(os.path.expanduser(raw))
        roots = _roots(folders)
        if not candidate.is_absolute():
            candidate = roots[0] / candidate
        real = Path(os.path.realpath(candidate))
    except (OSError, RuntimeError, ValueError) as exc:
        return ToolResult.error("path-not-allowed", f"the path cannot be resolved: {exc}"[:300])
    if not _inside(real, roots):
        return ToolResult.error(
            "path-not-allowed",
            "the file is not in a folder that may be read",
            hint="Ask the person to put it in an allowed folder or attach it.",
        )
    if not real.is_file():
        return ToolResult.error("path-not-allowed", "no such file")
    return real


def _roots(folders: list[Path]) -> list[Path]:
    return [Path(os.path.realpath(f)) for f in folders]


def _inside(real: Path, roots: list[Path]) -> bool:
    return any(real == root or root in real.parents for root in roots)


def open_checked(path: Path, folders: list[Path], max_bytes: int) -> bytes | ToolResult:
    """The file's bytes, read from one descriptor opened without following a link at the
    last step, once that descriptor is seen to be a regular file inside ``folders`` (its
    real path read back from ``/proc/self/fd``) and no larger than ``max_bytes``; at most
    ``max_bytes`` + 1 bytes are read, whatever it grew to."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        return ToolResult.error("path-not-allowed", f"cannot read the file: {exc.strerror}")
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ToolResult.error("path-not-allowed", "no such file")
        try:
            opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            opened = Path(os.path.realpath(path))  # no /proc: the path's own resolution
        if not _inside(opened, _roots(folders)):
            return ToolResult.error(
                "path-not-allowed",
                "the file is not in a folder that may be read",
                hint="Ask the person to put it in an allowed folder or attach it.",
            )
        if st.st_size > max_bytes:
            return ToolResult.error("fetch-too-large", f"the file is larger than {max_bytes} bytes")
        body = f.read(max_bytes + 1)
    if len(body) > max_bytes:
        return ToolResult.error("fetch-too-large", f"the file is larger than {max_bytes} bytes")
    return body
