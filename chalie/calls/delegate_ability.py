"""The base class of the delegate abilities (web_search, web_browse): one sub-turn a call.

The contract and the answer's shape are :mod:`chalie.calls.delegate`'s; this module only
binds them to the ability contract.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from chalie.ability import Ability
from chalie.calls.delegate import DelegateError, answer_with_sources
from chalie.result import ToolResult


class DelegateParams(msgspec.Struct, forbid_unknown_fields=True):
    """The task for the delegate, in plain words."""

    task: Annotated[
        str,
        msgspec.Meta(
            min_length=1, max_length=4000, description="what to find out or do, in plain words"
        ),
    ]


class DelegateAbility(Ability):
    """A tool whose run is one sub-turn on :attr:`channel` (see the module)."""

    abstract = True
    channel: ClassVar[str]
    Params = DelegateParams
    timeout = 600.0

    def run(self, params: DelegateParams) -> ToolResult:
        port = self.services.delegates if self.services is not None else None
        if port is None:
            return ToolResult.error(
                "delegate-failed",
                "delegates run inside the daemon only",
                hint="Ask the daemon (chalie chat or chalie ask), not a bare tool call.",
            )
        try:
            run = port.run(
                self.channel,
                params.task,
                parent=self.context,
                parent_call=self.call_id,
                cancelled=self.cancelled,
                timeout=self.timeout - 5,
            )
        except DelegateError as exc:
            return ToolResult.error(exc.code, exc.message, meta={"delegate": self.channel})
        return answer_with_sources(run, self.channel)
