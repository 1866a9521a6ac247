"""The operator's memory commands (``chalie memory ...``): one routing-table row each.

The same handlers serve the daemon's control socket and the CLI when no
daemon runs (the CLI then opens the book itself, under the instance lock).
The operator is the owner: these see every principal's memories.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from chalie.memory.book import MemoryBook, MemoryRequestError
from chalie.memory.whose import OWNER
from chalie.process import control
from chalie.process.control import Args
from chalie.process.routing import Route
from chalie.wire.messages import ControlReply

Scope = Literal["owner", "agents", "all"]
MAX_IMPORT_ROWS = 100_000


class MemoryListArgs(Args):
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 20
    scope: Scope = "all"


class MemorySearchArgs(Args):
    query: Annotated[str, msgspec.Meta(max_length=2000)] | None = None
    location: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=50)] = 10
    principal: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] = OWNER


class MemoryIdArgs(Args):
    id: Annotated[int, msgspec.Meta(ge=1)]


class MemoryExportArgs(Args):
    scope: Scope = "all"


class MemoryImportArgs(Args):
    rows: Annotated[list[Any], msgspec.Meta(max_length=MAX_IMPORT_ROWS)]


class SkillRulesArgs(Args):
    skill: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None


def _principals(book: MemoryBook, scope: Scope) -> list[str] | None:
    if scope == "owner":
        return [OWNER]
    if scope == "agents":
        return [p for p in book.store.principals() if p != OWNER]
    return None


def _row(memory: Any) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(memory)
    return out


class MemoryCommands:
    """The routes over one book."""

    def __init__(self, book: MemoryBook) -> None:
        self.book = book

    def routes(self) -> list[Route[Any]]:
        rows: list[Route[Any]] = [
            Route("memory.list", MemoryListArgs, self.list),
            Route("memory.search", MemorySearchArgs, self.search),
            Route("memory.show", MemoryIdArgs, self.show),
            Route("memory.forget", MemoryIdArgs, self.forget),
            Route("memory.promote", MemoryIdArgs, self.promote),
            Route("memory.forgotten", MemoryListArgs, self.forgotten),
            Route("memory.restore", MemoryIdArgs, self.restore),
            Route("memory.export", MemoryExportArgs, self.export),
            Route("memory.import", MemoryImportArgs, self.import_rows),
            Route("skills.rules", SkillRulesArgs, self.rules),
        ]
        return [_answer_errors(r) for r in rows]

    def list(self, args: MemoryListArgs) -> ControlReply:
        rows = self.book.recent(_principals(self.book, args.scope), args.limit)
        return control.success([_row(m) for m in rows])

    def search(self, args: MemorySearchArgs) -> ControlReply:
        hits = self.book.recall(
            [args.principal], query=args.query, location=args.location, k=args.limit
        )
        return control.success([{**_row(h.memory), "score": h.score} for h in hits])

    def show(self, args: MemoryIdArgs) -> ControlReply:
        memory = self.book.get(args.id)
        if memory is None:
            return control.failure("memory-not-found", f"no memory {args.id}")
        return control.success(_row(memory))

    def forget(self, args: MemoryIdArgs) -> ControlReply:
        memory = self.book.get(args.id)
        if memory is None:
            return control.failure("memory-not-found", f"no memory {args.id}")
        self.book.forget([memory.principal], args.id)
        return control.success({"id": args.id, "forgotten": True})

    def forgotten(self, args: MemoryListArgs) -> ControlReply:
        rows = self.book.forgotten(_principals(self.book, args.scope), args.limit)
        return control.success([_row(m) for m in rows])

    def restore(self, args: MemoryIdArgs) -> ControlReply:
        return control.success(_row(self.book.restore(None, args.id)))

    def promote(self, args: MemoryIdArgs) -> ControlReply:
        return control.success(_row(self.book.promote(args.id)))

    def export(self, args: MemoryExportArgs) -> ControlReply:
        return control.success(list(self.book.export(_principals(self.book, args.scope))))

    def import_rows(self, args: MemoryImportArgs) -> ControlReply:
        return control.success(self.book.import_rows(args.rows))

    def rules(self, args: SkillRulesArgs) -> ControlReply:
        rows = [m for m in self.book.all_rules([OWNER]) if args.skill in (None, m.skill)]
        return control.success([{"skill": m.skill, "rule": m.text, "id": m.id} for m in rows])


def _answer_errors(route: Route[Any]) -> Route[Any]:
    def run(args: Any) -> ControlReply:
        try:
            return route.handler(args)
        except MemoryRequestError as exc:
            return control.failure(exc.code, str(exc))

    return Route(route.name, route.args, run)
