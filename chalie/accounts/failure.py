"""The one failure type of every account protocol client, mapped onto stable error codes.

A protocol client (DAV, IMAP, SMTP, HTTP for ICS and weather) raises
:class:`AccountFailure` with a code from :data:`CODES`; an ability turns it
into ``ToolResult.error`` with :meth:`AccountFailure.result`. The message names
the account and what failed, never a password, and no traceback reaches the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, Literal, get_args

from chalie.result import ToolResult

Code = Literal[
    "account-unreachable",
    "auth-failed",
    "unknown-account",
    "account-bad-response",
    "item-not-found",
    "read-only-account",
    "invalid-param",
    "service-unreachable",
    "unknown-place",
]
CODES: Final[tuple[str, ...]] = get_args(Code)
HINTS: Final[dict[str, str]] = {
    "account-unreachable": "the server did not answer; retry later, or ask the user to check "
    "the account with `chalie accounts test NAME`.",
    "auth-failed": "the server refused the stored credentials; do not retry, ask the user to "
    "update the password with `chalie accounts add ... --replace`.",
    "unknown-account": "call again without account= to use the default, or name one of the "
    "accounts listed in valid values.",
    "account-bad-response": "the server answered something that is not its protocol; retry "
    "once, then tell the user the account misbehaves.",
    "item-not-found": "list or search first and use an id from the result.",
    "read-only-account": "this account is read-only (an ICS subscription); write to a CalDAV "
    "account instead.",
    "invalid-param": "correct the parameter named in the message and call again.",
    "service-unreachable": "the weather service did not answer; retry in a minute, or tell "
    "the user it is unavailable.",
    "unknown-place": "try another spelling or the nearest city, or pass latitude and longitude.",
}
MAX_MESSAGE: Final = 400


class AccountFailure(Exception):
    """A failure talking to an account, with its stable code; safe to show to the model."""

    def __init__(
        self,
        code: Code,
        message: str,
        *,
        account: str = "",
        hint: str = "",
        valid_values: tuple[str, ...] | None = None,
        param: str = "",
    ) -> None:
        super().__init__(message)
        self.code: Code = code
        self.message = message
        self.account = account
        self.hint = hint or HINTS[code]
        self.valid_values = valid_values
        self.param = param

    def result(self) -> ToolResult:
        meta: dict[str, str] = {}
        if self.account:
            meta["account"] = self.account
        if self.param:
            meta["param"] = self.param
        text = " ".join(self.message.split())[:MAX_MESSAGE] or self.code
        return ToolResult.error(
            self.code, text, hint=self.hint, valid_values=self.valid_values, meta=meta
        )

    def __str__(self) -> str:
        who = f"{self.account}: " if self.account else ""
        return f"{self.code}: {who}{self.message}"


class AccountSweep:
    """A read over several accounts: a failing one is noted in ``unavailable`` and the others
    still answer; with one account named (``named``), or when every one fails, it raises."""

    def __init__(self, named: bool) -> None:
        self.named = named
        self.failures: list[AccountFailure] = []
        self.unavailable: list[dict[str, str]] = []

    @contextmanager
    def reading(self, account: str) -> Iterator[None]:
        """Read the account named ``account`` inside; its failure is noted (or raised)."""
        try:
            yield
        except AccountFailure as exc:
            if self.named:
                raise
            self.failures.append(exc)
            self.unavailable.append({"account": account, "code": exc.code, "message": exc.message})

    def check(self, tried: int) -> None:
        """Raise the first failure when all ``tried`` accounts failed."""
        if self.failures and len(self.failures) == tried:
            raise self.failures[0]
