"""The error-code table is one table: the code's and the README's agree."""

from __future__ import annotations

from pathlib import Path

from chalie.errors import ERROR_CODES, is_valid_code

README = Path(__file__).resolve().parents[2] / "README.rst"


def test_every_code_is_kebab_case_and_unique() -> None:
    codes = [e.code for e in ERROR_CODES]
    assert len(codes) == len(set(codes))
    assert all(is_valid_code(c) for c in codes)


def test_the_seed_codes_are_published() -> None:
    codes = {e.code for e in ERROR_CODES}
    assert {
        "non-canonical-result",
        "unhandled-exception",
        "unknown-tool",
        "unknown-action",
        "missing-params",
        "invalid-param",
        "permission-denied",
    } <= codes


def test_readme_documents_every_code_with_its_meaning() -> None:
    text = README.read_text()
    for e in ERROR_CODES:
        assert f"``{e.code}``\n     - {e.meaning}\n     - {e.when}" in text, e.code
