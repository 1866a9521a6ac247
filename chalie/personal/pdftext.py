"""Text out of a PDF attachment, bounded: the file's size, its pages, the time and the text.

A PDF in an email is untrusted content from a stranger: it is parsed in memory with
pypdf (no external tools, nothing written to disk), never more than ``MAX_PDF_BYTES``
of it, never more than ``MAX_PDF_PAGES`` pages, and extraction stops at the page where
``PDF_SECONDS`` have passed or ``max_chars`` of text were gathered. Whatever goes wrong
inside pypdf (a broken, encrypted or hostile file) is a note, never an exception.
"""

from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass
from typing import Final

MAX_PDF_BYTES: Final = 10 * 2**20
MAX_PDF_PAGES: Final = 50
PDF_SECONDS: Final = 3.0

# pypdf logs every oddity of a malformed file as a warning: the file is the sender's, not ours
logging.getLogger("pypdf").setLevel(logging.ERROR)


@dataclass(frozen=True, slots=True)
class PdfText:
    text: str
    note: str = ""  # why the text is partial or missing ("" when it is the whole text)


def pdf_text(data: bytes, max_chars: int, *, seconds: float = PDF_SECONDS) -> PdfText:
    """The text of the PDF ``data``, at most ``max_chars``, with a note when it is cut short."""
    if len(data) > MAX_PDF_BYTES:
        return PdfText("", f"the PDF is larger than {MAX_PDF_BYTES // 2**20} MB: no text extracted")
    from pypdf import PdfReader  # imported on first use: a read without PDFs never pays for it

    deadline = time.monotonic() + seconds
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            return PdfText("", "the PDF is encrypted: no text extracted")
        total = len(reader.pages)
        parts: list[str] = []
        size = 0
        note = ""
        for number, page in enumerate(reader.pages):
            if number >= MAX_PDF_PAGES:
                note = f"only the first {MAX_PDF_PAGES} of {total} pages were read"
                break
            if time.monotonic() > deadline:
                note = f"extraction stopped after {number} of {total} pages (time limit)"
                break
            piece = (page.extract_text() or "").strip()
            if piece:
                parts.append(piece)
                size += len(piece) + 2
            if size >= max_chars:
                if number + 1 < total:
                    note = f"text cut at {max_chars} characters (page {number + 1} of {total})"
                break
    except Exception as exc:
        return PdfText("", f"the PDF could not be read ({type(exc).__name__})")
    text = "\n\n".join(parts).replace("\r\n", "\n").replace("\r", "\n")
    if len(text) > max_chars:
        text = text[:max_chars]
        note = note or f"text cut at {max_chars} characters"
    if not text and not note:
        note = "the PDF holds no extractable text (a scan?)"
    return PdfText(text, note)
