"""A read over several accounts (chalie.accounts.failure.AccountSweep)."""

from __future__ import annotations

import pytest

from chalie.accounts.failure import AccountFailure, AccountSweep


def _fail(name: str) -> None:
    raise AccountFailure("account-unreachable", "no answer", account=name)


def test_a_failing_account_is_noted_and_the_others_answer() -> None:
    sweep = AccountSweep(named=False)
    read = []
    for name in ("work", "home", "club"):
        with sweep.reading(name):
            if name == "home":
                _fail(name)
            read.append(name)
    sweep.check(3)
    assert read == ["work", "club"]
    assert sweep.unavailable == [
        {"account": "home", "code": "account-unreachable", "message": "no answer"}
    ]


def test_every_account_failing_or_the_named_one_raises() -> None:
    sweep = AccountSweep(named=False)
    for name in ("work", "home"):
        with sweep.reading(name):
            _fail(name)
    with pytest.raises(AccountFailure) as first:
        sweep.check(2)
    assert first.value.account == "work"
    named = AccountSweep(named=True)
    with pytest.raises(AccountFailure), named.reading("work"):
        _fail("work")
    assert named.unavailable == [] and named.failures == []
    with pytest.raises(KeyError), AccountSweep(named=False).reading("work"):
        raise KeyError("not an account failure")
