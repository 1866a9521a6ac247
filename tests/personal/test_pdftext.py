"""The bounds of PDF text extraction: size, text length, broken and hostile files."""

from __future__ import annotations

from chalie.personal.pdftext import MAX_PDF_BYTES, pdf_text
from tests.personal.pdfs import minimal_pdf


def test_text_of_a_real_pdf() -> None:
    got = pdf_text(minimal_pdf(["Hello (world)", "second line"]), 1000)
    assert "Hello (world)" in got.text and "second line" in got.text and got.note == ""


def test_text_is_cut_at_max_chars_with_a_note() -> None:
    got = pdf_text(minimal_pdf(["x" * 300]), 100)
    assert len(got.text) == 100 and "cut at 100" in got.note


def test_an_oversized_pdf_is_not_parsed() -> None:
    got = pdf_text(b"%PDF-1.4\n" + b"0" * MAX_PDF_BYTES, 1000)
    assert got.text == "" and "larger than" in got.note


def test_broken_and_hostile_files_are_notes() -> None:
    for data in (
        b"",
        b"%PDF-1.4",
        b"%PDF-1.4\n1 0 obj << /Length 999999 >>\nstream\n",
        b"\x00" * 64,
    ):
        got = pdf_text(data, 1000)
        assert got.text == "" and got.note, data


def test_the_time_limit_stops_between_pages() -> None:
    got = pdf_text(minimal_pdf(["a page"]), 1000, seconds=-1.0)
    assert got.text == "" and "time limit" in got.note
