"""The operation table and the backend's typed methods are one list (no daemon)."""

from __future__ import annotations

import inspect

from chalie.brain.operations import BY_NAME, OPERATIONS, Backend


def _methods() -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(Backend).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }


def test_every_row_is_one_backend_method_and_every_method_a_row() -> None:
    assert len(BY_NAME) == len(OPERATIONS)
    assert set(BY_NAME) == set(_methods())


def test_a_caller_rows_method_takes_the_caller_and_no_other_does() -> None:
    for name, signature in _methods().items():
        assert len(signature.parameters) == (4 if BY_NAME[name].caller else 3), name
