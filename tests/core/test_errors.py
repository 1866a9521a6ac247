"""The error-code table is one table (docs/errors.rst is generated from it: tests/test_docs.py)."""

from __future__ import annotations

from chalie.errors import ERROR_CODES, is_valid_code


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
